"""Training the RNN Encoder-Decoder on the unique phrase pairs of a Moses table.

Follows Section 4.1 / Appendix A.2 of Cho et al. (2014): the training set is
the *set* of phrase pairs (corpus frequencies ignored), minibatches of 64
pairs drawn at random, Adadelta with eps = 1e-6 and rho = 0.95, weights from
N(0, 0.01) with orthogonal recurrent matrices. We add gradient-norm clipping
(the paper does not mention it; it keeps early Adadelta steps stable).

Data position is a pure function of (seed, step): epoch e visits the training
pairs in the order of a permutation drawn from seed and e, so a resumed run
sees exactly the batches the killed run would have seen.
"""

from __future__ import annotations

import math
import os
import time
from array import array
from collections import Counter
from dataclasses import asdict, dataclass

import numpy as np
import torch
from tqdm import tqdm

from . import modelio
from .model import build_model, parameter_count, preset_config, PRESETS
from .phrasetable import read_phrase_table
from .vocab import EOS, Vocabulary


@dataclass
class TrainConfig:
    preset: str = "small"
    src_vocab: int | None = None  # shortlist sizes; default: the preset's
    tgt_vocab: int | None = None
    batch_size: int = 64
    max_steps: int = 20000
    max_minutes: float | None = None
    rho: float = 0.95
    eps: float = 1e-6
    clip: float = 1.0
    seed: int = 1
    valid_pairs: int = 1000
    eval_every: int = 500
    device: str = "auto"
    threads: int | None = None  # CPU threads; default by model size (configure_threads)
    arch: str = "encdec"  # "encdec" (Cho et al., 2014) or "rnnsearch" (Bahdanau et al., 2015)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda asked for, but torch sees no CUDA device")
    return dev


def configure_threads(device: torch.device, threads: int | None = None, config=None) -> int:
    """Set torch's intra-op threads for CPU work and return the number used.

    Default: every core for models of the `small` preset's size and up. For
    smaller models one op is too short to split, and idle intra-op threads
    spin against the gzip threads and other processes: one thread is faster.
    """
    if device.type != "cpu":
        return torch.get_num_threads()
    if threads is None:
        big = config is None or config.hidden >= 256
        threads = (os.cpu_count() or 1) if big else 1
    torch.set_num_threads(threads)
    return threads


class PairCorpus:
    """Unique phrase pairs as flat int32 id arrays (target rows end with </s>)."""

    def __init__(self, src: np.ndarray, src_off: np.ndarray, tgt: np.ndarray, tgt_off: np.ndarray):
        self.src, self.src_off, self.tgt, self.tgt_off = src, src_off, tgt, tgt_off

    def __len__(self) -> int:
        return len(self.src_off) - 1

    def target_tokens(self, index: np.ndarray) -> int:
        return int((self.tgt_off[index + 1] - self.tgt_off[index]).sum())

    def batch(self, index: np.ndarray, device: torch.device):
        """Right-padded (src, src_mask, tgt, tgt_mask) tensors for the given pairs."""

        def pad(flat, off):
            lens = off[index + 1] - off[index]
            out = np.zeros((len(index), int(lens.max())), dtype=np.int64)
            mask = np.arange(out.shape[1])[None, :] < lens[:, None]
            out[mask] = np.concatenate([flat[off[i] : off[i + 1]] for i in index])
            return torch.from_numpy(out).to(device), torch.from_numpy(mask).to(device)

        return (*pad(self.src, self.src_off), *pad(self.tgt, self.tgt_off))


def unique_pairs(path: str):
    """Yield (source words, target words) of each distinct pair of the table once."""
    seen: set[int] = set()
    for pair in read_phrase_table(path):
        key = hash((pair.source, pair.target))
        if key in seen:
            continue
        seen.add(key)
        yield pair.source.split(), pair.target.split()


def build_vocabularies(path: str, src_size: int, tgt_size: int) -> tuple[Vocabulary, Vocabulary]:
    """Shortlists of the most frequent words of each side, counted over unique pairs."""
    src_counts, tgt_counts = Counter(), Counter()
    for s, t in unique_pairs(path):
        src_counts.update(s)
        tgt_counts.update(t)
    return Vocabulary.build(src_counts, src_size), Vocabulary.build(tgt_counts, tgt_size)


def load_corpus(path: str, src_vocab: Vocabulary, tgt_vocab: Vocabulary) -> PairCorpus:
    src, tgt = array("i"), array("i")
    src_off, tgt_off = array("q", [0]), array("q", [0])
    eos = tgt_vocab.index[EOS]
    for s, t in unique_pairs(path):
        src.extend(src_vocab.encode(s))
        tgt.extend(tgt_vocab.encode(t))
        tgt.append(eos)
        src_off.append(len(src))
        tgt_off.append(len(tgt))
    as_np = lambda a, dt: np.frombuffer(a, dtype=dt).copy()  # noqa: E731
    return PairCorpus(as_np(src, np.int32), as_np(src_off, np.int64), as_np(tgt, np.int32), as_np(tgt_off, np.int64))


def split_indices(n: int, valid: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    valid = min(valid, n // 10)
    perm = np.random.default_rng([seed, 0xDA7A]).permutation(n)
    return np.sort(perm[valid:]), np.sort(perm[:valid])


def batch_indices(train_idx: np.ndarray, batch_size: int, seed: int, step: int) -> np.ndarray:
    """Pairs of 0-based step `step`: a pure function of the seed and the step."""
    per_epoch = max(1, len(train_idx) // batch_size)
    epoch, b = divmod(step, per_epoch)
    perm = np.random.default_rng([seed, epoch]).permutation(len(train_idx))
    return train_idx[perm[b * batch_size : (b + 1) * batch_size]]


@torch.no_grad()
def evaluate(model, corpus: PairCorpus, index: np.ndarray, device, batch_size: int = 256) -> float:
    """Per-word perplexity (target words and </s>) of the held-out pairs."""
    model.eval()
    total, words = 0.0, 0
    for i in range(0, len(index), batch_size):
        idx = index[i : i + batch_size]
        total += float(model(*corpus.batch(idx, device)).sum())
        words += corpus.target_tokens(idx)
    model.train()
    return math.exp(-total / max(words, 1))


def train(table: str, model_dir: str, cfg: TrainConfig, resume: bool = False, progress: bool = True) -> dict:
    """Train (or resume) a model on `table` into `model_dir`; returns a summary."""
    device = resolve_device(cfg.device)
    os.makedirs(model_dir, exist_ok=True)
    if resume:
        state = modelio.load_checkpoint(model_dir)
        saved = TrainConfig(**state["train_config"])
        saved.max_steps, saved.max_minutes = cfg.max_steps, cfg.max_minutes
        saved.device, saved.threads = cfg.device, cfg.threads
        cfg = saved
        model_cfg, _ = modelio.read_config(model_dir)
        src_vocab = Vocabulary.load(os.path.join(model_dir, modelio.SRC_VOCAB))
        tgt_vocab = Vocabulary.load(os.path.join(model_dir, modelio.TGT_VOCAB))
    else:
        if cfg.preset not in PRESETS:
            raise ValueError(f"unknown preset {cfg.preset!r}; choose from {', '.join(PRESETS)}")
        preset = PRESETS[cfg.preset]
        src_vocab, tgt_vocab = build_vocabularies(
            table, cfg.src_vocab or preset["vocab"], cfg.tgt_vocab or preset["vocab"]
        )
        modelio.save_vocabularies(model_dir, src_vocab, tgt_vocab)
        model_cfg = preset_config(cfg.preset, len(src_vocab), len(tgt_vocab), cfg.arch)
        state = None

    corpus = load_corpus(table, src_vocab, tgt_vocab)
    if len(corpus) < 2:
        raise ValueError(f"{table}: needs at least 2 distinct phrase pairs to train, has {len(corpus)}")
    train_idx, valid_idx = split_indices(len(corpus), cfg.valid_pairs, cfg.seed)

    configure_threads(device, cfg.threads, model_cfg)
    torch.manual_seed(cfg.seed)
    model = build_model(model_cfg)
    model.init_weights()
    model.to(device).train()
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0, rho=cfg.rho, eps=cfg.eps)
    step, best = 0, math.inf
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step, best = int(state["step"]), float(state["best_valid_ppl"])

    meta = {"table": os.path.abspath(table), "pairs": len(corpus), "train_config": asdict(cfg)}

    def checkpoint(valid_ppl: float) -> None:
        nonlocal best
        if valid_ppl < best or not os.path.exists(os.path.join(model_dir, modelio.WEIGHTS)):
            best = min(best, valid_ppl)
            modelio.save_model(model_dir, model, {**meta, "step": step, "valid_ppl": valid_ppl})
        modelio.save_checkpoint(
            model_dir,
            {
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "step": step,
                "best_valid_ppl": best,
                "train_config": asdict(cfg),
            },
        )

    start, start_step = time.perf_counter(), step
    bar = tqdm(total=cfg.max_steps, initial=step, unit="step", disable=not progress, dynamic_ncols=True)
    ppl, loss_ema, evaluated_at = math.nan, None, None
    while step < cfg.max_steps:
        if cfg.max_minutes is not None and time.perf_counter() - start > 60 * cfg.max_minutes:
            break
        idx = batch_indices(train_idx, cfg.batch_size, cfg.seed, step)
        logp = model(*corpus.batch(idx, device))
        loss = -logp.mean()  # negative mean log-likelihood of the pairs, Eq. 4
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        opt.step()
        step += 1
        loss_value = loss.item()
        loss_ema = loss_value if loss_ema is None else 0.98 * loss_ema + 0.02 * loss_value
        if step % cfg.eval_every == 0 or step == cfg.max_steps:
            ppl, evaluated_at = evaluate(model, corpus, valid_idx, device), step
            checkpoint(ppl)
        rate = (step - start_step) * cfg.batch_size / max(time.perf_counter() - start, 1e-9)
        bar.set_postfix(loss=f"{loss_ema:.3f}", valid_ppl=f"{ppl:.2f}", pairs_s=f"{rate:.0f}", refresh=False)
        bar.update(1)
    bar.close()
    if evaluated_at != step:  # stopped by --max-minutes, or nothing left to do
        ppl = evaluate(model, corpus, valid_idx, device)
        checkpoint(ppl)
    return {
        "steps": step,
        "pairs": len(corpus),
        "train_pairs": len(train_idx),
        "valid_pairs": len(valid_idx),
        "valid_ppl": ppl,
        "best_valid_ppl": best,
        "parameters": parameter_count(model),
        "seconds": time.perf_counter() - start,
    }
