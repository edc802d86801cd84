"""Training the RNN Encoder-Decoder on the unique phrase pairs of a Moses table.

`PairTrainer` fills the hooks of `mtcommon.trainer.Trainer` for phrase pairs;
`RECIPES` holds the two recipes, `paper` (Cho et al. 2014, Sec. 4.1 and
Appendix A.2, exactly) and `fast` (the default). What each recipe does and
why, and how the batch of a step follows from (seed, step): docs/training.md,
"Two recipes".
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F

from mtcommon.errors import UserError
from mtcommon.runtime import is_big, upload
from mtcommon.trainer import Schedule, Trainer, adam, apply_recipe, lr_factor
from mtcommon.subword import SubwordVocabulary
from mtcommon.textio import iter_lines
from mtcommon.vocab import EOS, RESERVED, Vocabulary

from ..formats.phrasetable import read_phrase_table
from ..networks import modelio
from ..networks.modelbase import preset_config, preset_vocab
from ..networks.modelio import build_model

RECIPES: dict[str, dict] = {
    "paper": dict(batch_size=64, optimizer="adadelta", lr=1.0, clip=0.0, sampled_softmax=0, bucket=False,
                  dtype="fp32"),
    "fast": dict(batch_size=128, optimizer="adam", lr=2e-3, clip=1.0, sampled_softmax=2048, bucket=True,
                 dtype="auto"),
}


@dataclass
class TrainConfig:
    preset: str = "small"
    recipe: str = "fast"  # "paper" (Cho et al. 2014, exactly) or "fast"; fields left None take the recipe's value
    src_vocab: int | None = None  # shortlist sizes; default: the preset's
    tgt_vocab: int | None = None
    batch_size: int | None = None
    optimizer: str | None = None  # "adadelta" or "adam"
    lr: float | None = None
    lr_schedule: str = "constant"  # "constant" (the paper), "linear" or "cosine" to 0 over the budget (mtcommon.trainer)
    clip: float | None = None  # gradient-norm clipping threshold; 0: none
    sampled_softmax: int | None = None  # candidates per batch (Jean et al. 2015); 0: full softmax
    bucket: bool | None = None  # batches of equal-length pairs
    dtype: str | None = None  # "auto" (the faster where both run, runtime.probe_dtype), "bf16" or "fp32"
    rho: float = 0.95  # Adadelta (Appendix A.2)
    eps: float = 1e-6
    max_steps: int | None = None  # the budget: max_steps, max_minutes or both, no default (`PairTrainer.check_config`)
    max_minutes: float | None = None
    seed: int = 1
    valid_pairs: int = 1000
    eval_every: int = 500
    device: str = "auto"
    threads: int | None = None  # CPU threads; default: tuned while training (runtime.ThreadTuner)
    arch: str = "encdec"  # "encdec" (Cho et al., 2014) or "rnnsearch" (Bahdanau et al., 2015)
    # Subword units per side (sentencepiece BPE, mtcommon.subword) instead of word shortlists; 0: words.
    subwords: int = 0
    # (source text, target text) the units are learned on; None: the training pairs' text
    subword_corpus: tuple[str, str] | None = None
    # Sentence pairs instead of a phrase table: (source text, target text), tokenized, one sentence a line
    corpus: tuple[str, str] | None = None
    max_len: int = 0  # with `corpus`: pairs with a side of more words left out; 0: no limit

    def __post_init__(self):
        apply_recipe(self, RECIPES)
        lr_factor(self.lr_schedule, 0.0)  # an unknown schedule is a UserError here
        if self.subwords and (self.src_vocab or self.tgt_vocab):
            raise UserError("--subwords sets both sides' unit counts: leave out --src-vocab and --tgt-vocab")
        if self.subword_corpus and not self.subwords:
            raise UserError("--subword-corpus needs --subwords")
        if self.max_len and not self.corpus:
            raise UserError("--max-len is for sentence pairs (--corpus)")
        if not isinstance(self.max_len, int) or self.max_len < 0:
            raise UserError(f"--max-len must be a whole number of words, not {self.max_len!r}")
        for side in ("src_vocab", "tgt_vocab"):
            check_vocab_size(f"--{side.replace('_', '-')}", getattr(self, side), RESERVED)


def check_vocab_size(option: str, size: int | None, reserved) -> None:
    """A shortlist size given (None: the preset's) must leave room for a word beside the reserved symbols."""
    if size is not None and (not isinstance(size, int) or size <= len(reserved)):
        raise UserError(f"{option} must be more than the {len(reserved)} reserved symbols, not {size!r}")


class PairCorpus:
    """Unique phrase pairs as flat int32 id arrays (target rows end with </s>).

    `tgt_words`: each target's words + 1 (its </s>), what held-out perplexity is per, so that word and
    subword models' perplexities compare; None: the units are words (the same as the rows' lengths)."""

    def __init__(self, src: np.ndarray, src_off: np.ndarray, tgt: np.ndarray, tgt_off: np.ndarray,
                 tgt_words: np.ndarray | None = None):
        self.src, self.src_off, self.tgt, self.tgt_off = src, src_off, tgt, tgt_off
        self.src_len, self.tgt_len = np.diff(src_off), np.diff(tgt_off)
        self.tgt_words = self.tgt_len if tgt_words is None else tgt_words

    def __len__(self) -> int:
        return len(self.src_off) - 1

    def target_tokens(self, index: np.ndarray) -> int:
        """The target words (+ one </s> each) of pairs `index`: held-out perplexity's denominator."""
        return int(self.tgt_words[index].sum())

    def padded(self, index: np.ndarray, side: str) -> tuple[np.ndarray, np.ndarray]:
        """Right-padded ids [len(index), longest] and the mask of real positions for one side."""
        flat, off, lens = (self.src, self.src_off, self.src_len) if side == "src" else (self.tgt, self.tgt_off,
                                                                                         self.tgt_len)
        lens = lens[index]
        width = int(lens.max())
        mask = np.arange(width)[None, :] < lens[:, None]
        # positions of every real token in the flat array, row by row
        gather = (off[index][:, None] + np.arange(width)[None, :])[mask]
        out = np.zeros((len(index), width), dtype=np.int64)
        out[mask] = flat[gather]
        return out, mask

    def host_batch(self, index: np.ndarray) -> list[np.ndarray]:
        """Right-padded [src, src_mask, tgt, tgt_mask] arrays for the given pairs."""
        return [*self.padded(index, "src"), *self.padded(index, "tgt")]

    @staticmethod
    def on_device(host: list[np.ndarray], device: torch.device, *more: np.ndarray) -> tuple[torch.Tensor, ...]:
        """A `host_batch` as tensors on `device`, and `more` integer arrays after them, in one transfer
        (`runtime.upload`: on a GPU without waiting for the step before)."""
        src, src_mask, tgt, tgt_mask, *rest = upload([*host, *more], device)
        return (src, src_mask.bool(), tgt, tgt_mask.bool(), *rest)

    def batch(self, index: np.ndarray, device: torch.device) -> tuple[torch.Tensor, ...]:
        """Right-padded (src, src_mask, tgt, tgt_mask) tensors for the given pairs."""
        return self.on_device(self.host_batch(index), device)


def read_unique_pairs(path: str) -> tuple[list[str], list[str]]:
    """The distinct (source, target) phrase pairs of a table, in first-seen order, in one pass."""
    seen: set[tuple[str, str]] = set()
    sources, targets = [], []
    for pair in read_phrase_table(path):
        key = (pair.source, pair.target)
        if key in seen:
            continue
        seen.add(key)
        sources.append(pair.source)
        targets.append(pair.target)
    return sources, targets


def read_corpus_pairs(src: str, tgt: str, max_len: int = 0) -> tuple[list[str], list[str]]:
    """The sentence pairs of a parallel corpus (tokenized, one sentence a line, the two files line by
    line parallel), in order, duplicates kept (a sentence's frequency is data, unlike a phrase table's
    unique pairs): a pair with an empty side, or with more than `max_len` words on a side (0: no
    limit), is left out. Files of different lengths are a UserError naming both."""
    sources, targets = [], []
    lines = itertools.zip_longest(iter_lines(src), iter_lines(tgt))
    for count, (a, b) in enumerate(lines):
        if a is None or b is None:
            rest = 1 + sum(1 for _ in lines)
            longer, shorter = (src, tgt) if b is None else (tgt, src)
            raise UserError(f"{longer} has {count + rest} lines but {shorter} only {count}: not a parallel corpus")
        s, t = a[1].split(), b[1].split()
        if s and t and (not max_len or (len(s) <= max_len and len(t) <= max_len)):
            sources.append(" ".join(s))
            targets.append(" ".join(t))
    return sources, targets


def build_vocabularies(path: str, src_size: int, tgt_size: int, pairs=None) -> tuple[Vocabulary, Vocabulary]:
    """Shortlists of the most frequent words of each side, counted over unique pairs."""
    sources, targets = pairs or read_unique_pairs(path)
    src_counts, tgt_counts = Counter(), Counter()
    for phrases, counts in ((sources, src_counts), (targets, tgt_counts)):
        for phrase in phrases:
            counts.update(phrase.split())
    return Vocabulary.build(src_counts, src_size), Vocabulary.build(tgt_counts, tgt_size)


def build_subword_vocabularies(path: str, size: int, corpus: tuple[str, str] | None = None, pairs=None,
                               threads: int = 1) -> tuple[SubwordVocabulary, SubwordVocabulary]:
    """`size` subword units per side, learned on `corpus` (source and target text, one sentence a
    line), else on the table's distinct source and target phrases."""
    if corpus:
        sides = [[line for _, line in iter_lines(side)] for side in corpus]
    else:
        sources, targets = pairs or read_unique_pairs(path)
        sides = [list(dict.fromkeys(sources)), list(dict.fromkeys(targets))]
    vocabs = []
    for lines, name in zip(sides, corpus or (f"{path} (sources)", f"{path} (targets)")):
        try:
            vocabs.append(SubwordVocabulary.train(lines, size, threads))
        except UserError as e:
            raise UserError(f"{name}: {e}") from None
    return vocabs[0], vocabs[1]


def encode_side(phrases: list[str], vocab: Vocabulary, eos: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Flat int32 ids of all phrases' units (each phrase followed by `eos` if given) and int64 row offsets."""
    ids, lens = vocab.encode_phrases(phrases)
    ids = ids.astype(np.int32)
    if eos is not None:  # insert </s> after each phrase's last unit
        ends = np.cumsum(lens)
        ids = np.insert(ids, ends, eos)
        lens = lens + 1
    off = np.zeros(len(phrases) + 1, dtype=np.int64)
    np.cumsum(lens, out=off[1:])
    return ids, off


def load_corpus(path: str, src_vocab: Vocabulary, tgt_vocab: Vocabulary, pairs=None) -> PairCorpus:
    sources, targets = pairs or read_unique_pairs(path)
    src, src_off = encode_side(sources, src_vocab)
    tgt, tgt_off = encode_side(targets, tgt_vocab, eos=tgt_vocab.index[EOS])
    words = None
    if tgt_vocab.kind != "words":
        words = np.fromiter((len(t.split()) + 1 for t in targets), dtype=np.int64, count=len(targets))
    return PairCorpus(src, src_off, tgt, tgt_off, words)


def split_indices(n: int, valid: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    valid = min(valid, n // 10)
    perm = np.random.default_rng([seed, 0xDA7A]).permutation(n)
    return np.sort(perm[valid:]), np.sort(perm[:valid])


def batch_indices(train_idx: np.ndarray, batch_size: int, seed: int, step: int) -> np.ndarray:
    """Pairs of 0-based step `step` in random order (the paper's): a pure function of the seed and the step."""
    per_epoch = max(1, len(train_idx) // batch_size)
    epoch, b = divmod(step, per_epoch)
    perm = np.random.default_rng([seed, epoch]).permutation(len(train_idx))
    return train_idx[perm[b * batch_size : (b + 1) * batch_size]]


class BucketedBatches:
    """Batches of equal-length pairs: a pure function of (seed, step), cached one epoch at a time.

    Epoch e: the training pairs in a random order drawn from (seed, e), cut
    into chunks of `chunk` batches; each chunk is sorted by (source length,
    target length) and cut into batches; the batches are then shuffled. A
    batch spans two lengths only where a length group ends inside it.
    """

    def __init__(self, corpus: PairCorpus, train_idx: np.ndarray, batch_size: int, seed: int, chunk: int = 64):
        self.corpus, self.train_idx, self.batch_size, self.seed, self.chunk = corpus, train_idx, batch_size, seed, chunk
        self.per_epoch = max(1, len(train_idx) // batch_size)
        self._epoch, self._batches = None, None

    def __call__(self, step: int) -> np.ndarray:
        epoch, b = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            B = self.batch_size
            order = self.train_idx[np.random.default_rng([self.seed, epoch]).permutation(len(self.train_idx))]
            order = order[: self.per_epoch * B] if len(order) >= B else order
            batches = []
            for i in range(0, len(order), self.chunk * B):
                part = order[i : i + self.chunk * B]
                part = part[np.lexsort((self.corpus.tgt_len[part], self.corpus.src_len[part]))]
                batches += [part[j : j + B] for j in range(0, len(part), B)]
            np.random.default_rng([self.seed, epoch, 1]).shuffle(batches)
            self._epoch, self._batches = epoch, batches
        return self._batches[b]


def sampled_candidates(targets: np.ndarray, vocab_size: int, size: int, seed: int,
                       step: int) -> tuple[np.ndarray, np.ndarray]:
    """The subset V' of the shortlist a batch's softmax runs over, and each member's log inclusion probability.

    Importance sampling after Jean et al. (2015, Sec. 3.1): V' holds every
    target word of the (global) batch (inclusion probability 1) and is filled
    up to `size` with words drawn uniformly, without replacement, from the
    rest of the shortlist (probability q = fill / rest each). Subtracting
    log q from a sampled word's score makes sum over V' of exp(score - log q)
    an unbiased estimate of the normaliser Z over the whole shortlist, so the
    scores of rarely seen words are still pushed down. The draw is seeded by
    (seed, step): every rank and a resumed run draw the same subset.
    Returns (sorted word ids [K], log inclusion probabilities [K]).
    """
    present = np.unique(targets)
    if size >= vocab_size:
        return np.arange(vocab_size), np.zeros(vocab_size, np.float32)
    if len(present) >= size:
        return present, np.zeros(len(present), np.float32)
    rng = np.random.default_rng([seed, step, 0x5A])
    rest = np.setdiff1d(np.arange(vocab_size), present, assume_unique=True)
    fill = size - len(present)
    drawn = rng.choice(rest, fill, replace=False)
    cand = np.concatenate([present, drawn])
    log_q = np.concatenate([np.zeros(len(present)), np.full(fill, np.log(fill / len(rest)))]).astype(np.float32)
    order = np.argsort(cand)
    return cand[order], log_q[order]


class PairObjective(torch.nn.Module):
    """The training loss: -sum over the batch's pairs of log p(y | x) (Eq. 4), full or sampled softmax."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, src, src_mask, tgt, tgt_mask, candidates=None, log_q=None, tgt_in_candidates=None):
        m = self.model
        ctx = m.context(src, src_mask)
        s = m.readout_states(ctx, tgt)[tgt_mask]  # maxout outputs s_t of every real target position
        if candidates is None:
            logits = m.output.logits(s)  # g_j^T s_t over the whole shortlist
            y = tgt[tgt_mask]
        else:
            logits = m.output.logits(s, rows=candidates) - log_q  # ... over the sampled subset V' only
            y = tgt_in_candidates[tgt_mask]
        return F.cross_entropy(logits.float(), y, reduction="sum")


class PairTrainer(Trainer):
    unit = "pairs"
    data_fields = ("corpus",)
    path_fields = ("subword_corpus",)

    def data_paths(self, cfg) -> list[str]:
        return list(cfg.corpus) if cfg.corpus else [self.data]

    def check_config(self, cfg) -> None:
        if cfg.max_steps is None and cfg.max_minutes is None:
            raise UserError("no training budget: give --max-steps, --max-minutes or both (there is no default)")

    def prepare(self) -> Schedule:
        cfg = self.cfg
        vocab = preset_vocab(cfg.preset, cfg.arch)  # checks the preset's name first
        if cfg.corpus:
            cfg.corpus = tuple(cfg.corpus)  # a list once read back from a checkpoint
            pairs = read_corpus_pairs(*cfg.corpus, cfg.max_len)
        else:
            pairs = read_unique_pairs(self.data)
        if self.resumed:
            self.model_cfg, _ = modelio.read_config(self.model_dir)
            self.src_vocab, self.tgt_vocab = modelio.load_vocabularies(self.model_dir, self.model_cfg)
        else:
            if cfg.subwords:
                self.src_vocab, self.tgt_vocab = build_subword_vocabularies(
                    self.data, cfg.subwords, cfg.subword_corpus or cfg.corpus, pairs)
            else:
                self.src_vocab, self.tgt_vocab = build_vocabularies(
                    self.data, vocab if cfg.src_vocab is None else cfg.src_vocab,
                    vocab if cfg.tgt_vocab is None else cfg.tgt_vocab, pairs)
            if self.dist.is_main:
                modelio.save_vocabularies(self.model_dir, self.src_vocab, self.tgt_vocab)
            self.model_cfg = replace(preset_config(cfg.preset, len(self.src_vocab), len(self.tgt_vocab), cfg.arch),
                                     **modelio.segmentation_fields(self.src_vocab, self.tgt_vocab))
        self.corpus = load_corpus(self.data, self.src_vocab, self.tgt_vocab, pairs)
        if len(self.corpus) < 2:
            what = "sentence pairs (within --max-len)" if cfg.corpus else "distinct phrase pairs"
            raise UserError(f"{self.data}: needs at least 2 {what} to train, has {len(self.corpus)}")
        self.train_idx, self.valid_idx = split_indices(len(self.corpus), cfg.valid_pairs, cfg.seed)
        if cfg.bucket:
            self.order = BucketedBatches(self.corpus, self.train_idx, cfg.batch_size, cfg.seed)
        else:
            self.order = lambda step: batch_indices(self.train_idx, cfg.batch_size, cfg.seed, step)
        return Schedule(cfg.max_steps, cfg.eval_every)

    def big_model(self) -> bool:
        return is_big(self.model_cfg)

    def build_model(self) -> torch.nn.Module:
        model = build_model(self.model_cfg)
        model.init_weights()  # N(0, 0.01), orthogonal recurrent blocks (Appendix A.2)
        return model

    def build_optimizer(self, model):
        cfg = self.cfg
        if cfg.optimizer == "adadelta":  # Appendix A.2: eps 1e-6, rho 0.95
            return torch.optim.Adadelta(model.parameters(), lr=cfg.lr, rho=cfg.rho, eps=cfg.eps)
        if cfg.optimizer == "adam":
            return adam(model.parameters(), cfg.lr)
        raise ValueError(f"unknown optimizer {cfg.optimizer!r}; choose adadelta or adam")

    def build_objective(self, model):
        return PairObjective(model)

    def batch(self, step: int):
        cfg, corpus = self.cfg, self.corpus
        index = self.order(step)
        host = corpus.host_batch(index[self.dist.rank :: self.dist.world])
        if not cfg.sampled_softmax:
            return corpus.on_device(host, self.device), len(index)
        ids, mask = corpus.padded(index, "tgt")  # the global batch's target words, without a per-pair loop
        cand, log_q = sampled_candidates(ids[mask], self.model_cfg.tgt_vocab, cfg.sampled_softmax, cfg.seed, step)
        position = np.minimum(np.searchsorted(cand, host[2]), len(cand) - 1)  # pads (id 0) map anywhere: masked out
        src, src_mask, tgt, tgt_mask, cand, position = corpus.on_device(host, self.device, cand, position)
        (log_q,) = upload([log_q], self.device, np.float32)
        return (src, src_mask, tgt, tgt_mask, cand, log_q, position), len(index)

    def heldout(self, model) -> tuple[float, int]:
        index = self.valid_idx[self.dist.rank :: self.dist.world]
        total, words = 0.0, 0
        for i in range(0, len(index), 256):
            idx = index[i : i + 256]
            total -= float(model(*self.corpus.batch(idx, self.device)).sum())
            words += self.corpus.target_tokens(idx)
        return total, words

    def save_best(self, model, meta: dict) -> None:
        modelio.save_model(self.model_dir, model, meta)

    def describe(self) -> dict:
        """The data; `valid_target_words` (words + </s> of the held-out targets) turns held-out perplexity
        into held-out NLL per pair: ln(ppl) * valid_target_words / valid_pairs."""
        data = {"corpus": list(self.cfg.corpus), "max_len": self.cfg.max_len} if self.cfg.corpus else {"table": self.data}
        return {**data, "pairs": len(self.corpus), "train_pairs": len(self.train_idx),
                "valid_pairs": len(self.valid_idx), "valid_target_words": self.corpus.target_tokens(self.valid_idx)}


def train(table: str | None, model_dir: str, cfg: TrainConfig, resume: bool = False, progress: bool = True,
          trace: bool = False, given: frozenset[str] | None = None, overwrite: bool = False) -> dict:
    """Train (or resume) a model on the unique phrase pairs of `table`, or on the sentence pairs of
    `cfg.corpus` (then `table` is None), into `model_dir`; returns a summary. `given`, `overwrite`:
    what a resumed run may change and whether a model already in `model_dir` is replaced (`Trainer`).

    The summary has `pairs_seen` and `train_seconds` (time spent in training
    steps), held-out perplexities with their step and training time
    (`valid_ppl_history`) and, with `trace`, the loss of every step.
    """
    if (table is None) == (cfg.corpus is None):
        raise UserError("train on a phrase table or on a corpus (--corpus SRC TGT), not both or neither")
    return PairTrainer(table or cfg.corpus[0], model_dir, cfg, resume, progress, trace, given, overwrite).run()
