"""Streaming n-grams from a tokenized corpus (one sentence per line, plain or gzip).

A sentence w_1 .. w_m becomes the m+1 n-grams of `<s>`^(n-1) w_1 .. w_m `</s>`:
every word and the closing `</s>` is predicted from its n-1 predecessors, the
history padded with `<s>` at the sentence start. Blank lines are skipped.

The corpus is read twice up front (shortlist counts, then held-out n-grams) and
once per training pass; n-grams go through a bounded shuffle buffer (default
2M n-grams, 56 MB), so memory does not grow with the corpus. A corpus made of
domain blocks larger than the buffer is seen block by block within a pass:
shuffle such a corpus's lines once beforehand (`shuf`). The stream is a pure function of (seed, step):
pass p shuffles each buffer-full with a generator seeded by (seed, p, buffer#),
so a resumed run replays exactly the batches the interrupted run would have seen.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from mtcommon.errors import UserError
from mtcommon.textio import iter_lines
from mtcommon.vocab import BOS, EOS, UNK, Vocabulary

from .ngrams import sentence_ngrams

RESERVED = (EOS, BOS, UNK)  # ids 0, 1, 2 in every CSLM vocabulary


@dataclass
class CorpusInfo:
    lines: int  # non-blank sentences
    heldout_lines: np.ndarray  # sorted line numbers (1-based) of the held-out sentences
    train_ngrams: int
    counts: Counter


def scan_corpus(path: str, valid_fraction: float, seed: int) -> CorpusInfo:
    """First pass: count sentences, choose the held-out ones, count training words."""
    linenos = [ln for ln, line in iter_lines(path) if line.strip()]
    if len(linenos) < 2:
        raise UserError(f"{path}: needs at least 2 non-blank sentences to train, has {len(linenos)}")
    k = min(len(linenos) - 1, max(1, round(len(linenos) * valid_fraction)))
    rng = np.random.default_rng([seed, 0xDA7A])
    held = np.sort(np.asarray(linenos, np.int64)[rng.choice(len(linenos), size=k, replace=False)])
    held_set = set(held.tolist())
    counts: Counter = Counter()
    ngrams = 0
    for ln, line in iter_lines(path):
        if ln in held_set:
            continue
        words = line.split()
        if words:
            counts.update(words)
            ngrams += len(words) + 1
    return CorpusInfo(len(linenos), held, ngrams, counts)


def build_vocab(counts: Counter, size: int) -> Vocabulary:
    return Vocabulary.build(counts, size, reserved=RESERVED)


def heldout_ngrams(path: str, vocab: Vocabulary, heldout_lines: np.ndarray | None, order: int) -> np.ndarray:
    """The n-grams of the sentences of `path` on `heldout_lines` (line numbers; None: every line)."""
    held = None if heldout_lines is None else set(heldout_lines.tolist())
    bos, eos = vocab.index[BOS], vocab.index[EOS]
    rows = [
        sentence_ngrams(vocab.encode(line.split()), order, bos, eos)
        for ln, line in iter_lines(path)
        if (held is None or ln in held) and line.strip()
    ]
    return np.concatenate(rows) if rows else np.zeros((0, order), np.int32)


def _pass_ngrams(path: str, vocab: Vocabulary, heldout: set, order: int, chunk: int) -> Iterator[np.ndarray]:
    """One pass over the training sentences, in corpus order, `chunk` n-grams at a time."""
    bos, eos = vocab.index[BOS], vocab.index[EOS]
    rows, size = [], 0
    for ln, line in iter_lines(path):
        words = line.split()
        if not words or ln in heldout:
            continue
        g = sentence_ngrams(vocab.encode(words), order, bos, eos)
        rows.append(g)
        size += len(g)
        if size >= chunk:
            yield np.concatenate(rows)
            rows, size = [], 0
    if rows:
        yield np.concatenate(rows)


def stream_batches(path: str, vocab: Vocabulary, heldout_lines: np.ndarray, order: int, batch_size: int, seed: int,
                   start_step: int = 0, buffer: int = 1 << 21) -> Iterator[np.ndarray]:
    """Endless (batch_size, order) int32 training batches, passes one after another.

    Each pass yields floor(train n-grams / batch_size) batches (the remainder is
    dropped), so step s is batch s % per_pass of pass s // per_pass.
    """
    heldout = set(heldout_lines.tolist())
    per_pass = None
    step = 0
    p = 0
    while True:
        if per_pass is not None and start_step >= step + per_pass:  # skip whole passes when resuming
            skip = (start_step - step) // per_pass
            p, step = p + skip, step + skip * per_pass
        pending = np.zeros((0, order), np.int32)
        in_pass = 0
        for b, chunk in enumerate(_pass_ngrams(path, vocab, heldout, order, buffer)):
            chunk = chunk[np.random.default_rng([seed, p, b]).permutation(len(chunk))]
            pending = np.concatenate([pending, chunk]) if len(pending) else chunk
            while len(pending) >= batch_size:
                batch, pending = pending[:batch_size], pending[batch_size:]
                if step >= start_step:
                    yield batch
                step += 1
                in_pass += 1
        if in_pass == 0:
            raise UserError(f"{path}: fewer training n-grams than one batch of {batch_size}")
        per_pass = in_pass
        p += 1
