"""Training the CSLM on a tokenized monolingual corpus.

Cho et al. (2014), Sec. 4.1.2: 7-grams of the target corpus, weights uniform in
[-0.01, 0.01], a random 0.1% held out, training stopped once held-out
perplexity has not improved for 10 epochs; the best weights are kept.

Deviations: the paper does not name its optimiser; we use Adam (lr 1e-3),
which reaches a given perplexity in far fewer updates than the plain SGD of
the CSLM toolkit (`--optimizer sgd` is available). The held-out set is 0.1% of
the *sentences* (at least one), so no held-out n-gram shares a sentence with a
training n-gram. An "epoch" is one pass over the training n-grams unless
`epoch_ngrams` makes it shorter (useful on large corpora: evaluation,
checkpointing and early stopping then happen every `epoch_ngrams` n-grams).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
from tqdm import tqdm

from moses_rnn.train import resolve_device

from . import modeldir
from .data import build_vocab, heldout_ngrams, scan_corpus, stream_batches
from .model import CSLM, parameter_count, preset_config


@dataclass
class TrainConfig:
    preset: str = "small"
    vocab_size: int | None = None  # shortlist size; default: the preset's
    batch_size: int = 256
    optimizer: str = "adam"
    lr: float | None = None  # default: 1e-3 (adam), 0.05 (sgd)
    valid_fraction: float = 0.001
    patience: int = 10  # epochs without held-out improvement before stopping
    max_epochs: int = 100
    max_minutes: float | None = None
    epoch_ngrams: int | None = None  # n-grams per epoch; default: one pass over the corpus
    seed: int = 1
    device: str = "auto"


@torch.no_grad()
def perplexity(model: CSLM, ngrams: np.ndarray, device, batch_size: int = 4096) -> float:
    """exp of the mean negative ln P over the n-grams (each word and </s>)."""
    model.eval()
    total = 0.0
    for i in range(0, len(ngrams), batch_size):
        b = torch.from_numpy(ngrams[i : i + batch_size].astype(np.int64)).to(device)
        total += float(torch.nn.functional.cross_entropy(model(b[:, :-1]), b[:, -1], reduction="sum"))
    model.train()
    return math.exp(total / max(len(ngrams), 1))


def _optimizer(cfg: TrainConfig, model: CSLM) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=cfg.lr or 1e-3)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=cfg.lr or 0.05)
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}; choose adam or sgd")


def train(corpus: str, model_dir: str, cfg: TrainConfig, resume: bool = False, progress: bool = True) -> dict:
    """Train (or resume) a CSLM on `corpus` into `model_dir`; returns a summary."""
    device = resolve_device(cfg.device)
    os.makedirs(model_dir, exist_ok=True)
    state = None
    if resume:
        state = modeldir.load_checkpoint(model_dir)
        saved = TrainConfig(**state["train_config"])
        saved.max_epochs, saved.max_minutes, saved.device = cfg.max_epochs, cfg.max_minutes, cfg.device
        cfg = saved
    info = scan_corpus(corpus, cfg.valid_fraction, cfg.seed)
    if resume:
        model_cfg, _ = modeldir.read_config(model_dir)
        vocab = modeldir.load_vocab(model_dir)
    else:
        model_cfg = preset_config(cfg.preset, cfg.vocab_size)
        vocab = build_vocab(info.counts, model_cfg.vocab_size)
        model_cfg.vocab_size = len(vocab)  # a small corpus may have fewer distinct words
        modeldir.save_vocab(model_dir, vocab)
    valid = heldout_ngrams(corpus, vocab, info.heldout_lines, model_cfg.order)
    per_pass = info.train_ngrams // cfg.batch_size
    if per_pass == 0:
        raise ValueError(f"{corpus}: {info.train_ngrams} training n-grams, fewer than one batch of {cfg.batch_size}")
    steps_per_epoch = max(1, min(per_pass, (cfg.epoch_ngrams or info.train_ngrams) // cfg.batch_size))

    torch.manual_seed(cfg.seed)
    model = CSLM(model_cfg)
    model.init_weights()
    model.to(device).train()
    opt = _optimizer(cfg, model)
    step, epoch, best, since_best = 0, 0, math.inf, 0
    history: list[float] = []
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step, epoch = int(state["step"]), int(state["epoch"])
        best, since_best = float(state["best_valid_ppl"]), int(state["since_best"])
        history = [float(x) for x in state["history"]]

    meta = {
        "corpus": os.path.abspath(corpus),
        "sentences": info.lines,
        "train_ngrams": info.train_ngrams,
        "valid_ngrams": int(len(valid)),
        "train_config": asdict(cfg),
    }

    def end_of_epoch(ppl: float) -> None:
        nonlocal best, since_best
        history.append(ppl)
        if ppl < best or not os.path.exists(os.path.join(model_dir, modeldir.WEIGHTS)):
            best, since_best = min(best, ppl), 0
            modeldir.save_weights(model_dir, model, {**meta, "epoch": epoch, "step": step, "valid_ppl": ppl})
        else:
            since_best += 1
        modeldir.save_checkpoint(model_dir, {
            "model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, "epoch": epoch,
            "best_valid_ppl": best, "since_best": since_best, "history": history, "train_config": asdict(cfg),
        })

    start, start_step = time.perf_counter(), step
    stopped = "max_epochs"
    batches = stream_batches(corpus, vocab, info.heldout_lines, model_cfg.order, cfg.batch_size, cfg.seed, step)
    bar = tqdm(total=steps_per_epoch, unit="batch", disable=not progress, dynamic_ncols=True)
    loss_ema = None
    while epoch < cfg.max_epochs and since_best < cfg.patience:
        bar.reset(total=steps_per_epoch)
        bar.update(step - epoch * steps_per_epoch)
        bar.set_description(f"epoch {epoch + 1}")
        timed_out = False
        while step < (epoch + 1) * steps_per_epoch:
            if cfg.max_minutes is not None and time.perf_counter() - start > 60 * cfg.max_minutes:
                timed_out = True
                break
            b = torch.from_numpy(next(batches).astype(np.int64)).to(device)
            loss = model.loss(b[:, :-1], b[:, -1])  # mean -ln P(w_n | w_1..w_{n-1})
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            v = loss.item()
            loss_ema = v if loss_ema is None else 0.98 * loss_ema + 0.02 * v
            rate = (step - start_step) * cfg.batch_size / max(time.perf_counter() - start, 1e-9)
            bar.set_postfix(ppl=f"{math.exp(loss_ema):.1f}", best_valid=f"{best:.2f}", ngrams_s=f"{rate:.0f}",
                            refresh=False)
            bar.update(1)
        if timed_out:
            stopped = "max_minutes"
            break
        epoch += 1
        end_of_epoch(perplexity(model, valid, device))
    else:
        stopped = "patience" if since_best >= cfg.patience else "max_epochs"
    bar.close()
    if stopped == "max_minutes":  # keep the partial epoch's progress resumable
        modeldir.save_checkpoint(model_dir, {
            "model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, "epoch": epoch,
            "best_valid_ppl": best, "since_best": since_best, "history": history, "train_config": asdict(cfg),
        })
        if not os.path.exists(os.path.join(model_dir, modeldir.WEIGHTS)):
            end_of_epoch(perplexity(model, valid, device))
    return {
        "stopped": stopped,
        "epochs": epoch,
        "steps": step,
        "train_ngrams": info.train_ngrams,
        "valid_ngrams": int(len(valid)),
        "valid_ppl_history": history,
        "best_valid_ppl": best,
        "parameters": parameter_count(model),
        "seconds": time.perf_counter() - start,
    }
