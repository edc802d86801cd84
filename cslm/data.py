"""Streaming n-grams from a tokenized corpus (one sentence per line, plain or gzip).

A sentence w_1 .. w_m becomes the m+1 n-grams of `<s>`^(n-1) w_1 .. w_m `</s>`:
every word and the closing `</s>` is predicted from its n-1 predecessors, the
history padded with `<s>` at the sentence start. Blank lines are skipped.

The corpus is read twice up front (shortlist counts, then held-out n-grams) and
once per training pass; n-grams go through a bounded shuffle buffer (default
2M rows of n int32 ids, 56 MB at n = 7; a joint model's rows hold n + m ids, 120 MB at 4 + 11),
so memory does not grow with the corpus. A corpus made of
domain blocks larger than the buffer is seen block by block within a pass:
shuffle such a corpus's lines once beforehand (`shuf`). The stream is a pure function of (seed, step):
pass p shuffles each buffer-full with a generator seeded by (seed, p, buffer#),
so a resumed run replays exactly the batches the interrupted run would have seen.

A joint model (NNJM, `cslm.model`) reads the target text with its source text and their word
alignment, line by line in step (`SourceSide`): each target n-gram's row then carries the
source window of its predicted word, [target history (n-1), source window (m), target word].
Which source word a target word's window is centred on, its affiliation, follows Devlin et al.
(2014), Sec. 2 (`affiliations`).
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from mtcommon.errors import UserError
from mtcommon.textio import InputError, iter_lines
from mtcommon.vocab import BOS, EOS, UNK, Vocabulary

from .ngrams import sentence_ngrams

RESERVED = (EOS, BOS, UNK)  # ids 0, 1, 2 in every CSLM vocabulary


@dataclass
class SourceSide:
    """A joint model's source side: the source text and the word alignment, one line per target line.

    `alignment` is Moses's format (`aligned.grow-diag-final-and`): per line, space-separated `i-j` pairs,
    i a source and j a target word index, both from 0. `vocab` is the source shortlist (once built)."""

    source: str
    alignment: str
    window: int = 0  # m, odd (0: the files are only read, not made into rows)
    vocab: Vocabulary | None = None


def parse_alignment(line: str, side: SourceSide, lineno: int, src_len: int, tgt_len: int) -> list[tuple[int, int]]:
    """The (source, target) index pairs of one alignment line, each checked against the sentences' lengths."""
    links = []
    for pair in line.split():
        i, dash, j = pair.partition("-")
        if not dash or not i.isdigit() or not j.isdigit() or not i.isascii() or not j.isascii():
            raise InputError(side.alignment, lineno, f"malformed alignment pair {pair!r}: expected SOURCE-TARGET "
                                                     f"word indices from 0, such as 3-4")
        i, j = int(i), int(j)
        if i >= src_len:
            raise InputError(side.alignment, lineno, f"alignment pair {pair!r}: source index {i} out of range "
                                                     f"(line {lineno} of {side.source} has {src_len} words)")
        if j >= tgt_len:
            raise InputError(side.alignment, lineno, f"alignment pair {pair!r}: target index {j} out of range "
                                                     f"(the target sentence of line {lineno} has {tgt_len} words)")
        links.append((i, j))
    return links


def affiliations(links: Sequence[tuple[int, int]], src_len: int, tgt_len: int) -> np.ndarray:
    """(tgt_len + 1,) int64: the source index each target word, then the closing `</s>`, is affiliated with.

    Devlin et al. (2014), Sec. 2:
    - a target word aligned to one source word takes it;
    - aligned to several, the middle one of them in source order; of an even count, the left one of the
      two middles, as Moses's BilingualLM (`selectMiddleAlignment`) chooses, so that the decoder's feature,
      which follows it, sees the windows training saw;
    - unaligned, the affiliation of the nearest aligned target word, the right one where two are as near.
    Not in the paper:
    - a sentence with no alignment at all: the source word at the proportional position, under the
      target word's centre: floor((2j + 1) src_len / (2 tgt_len));
    - the closing `</s>` takes the source `</s>` (index src_len): the target ends where the source does, and
      the window then holds the source sentence's last words. An empty source sentence gives every
      target word that position too.
    """
    out = np.empty(tgt_len + 1, np.int64)
    out[tgt_len] = src_len
    aligned: list[list[int]] = [[] for _ in range(tgt_len)]
    for i, j in links:
        aligned[j].append(i)
    own = [None if not a else sorted(set(a))[(len(set(a)) - 1) // 2] for a in aligned]
    if all(a is None for a in own):
        for j in range(tgt_len):
            out[j] = (2 * j + 1) * src_len // (2 * tgt_len)
        return out
    # the nearest aligned target word on each side, then the nearer of the two (the right one on a tie)
    right: list[int | None] = [None] * tgt_len
    nxt = None
    for j in range(tgt_len - 1, -1, -1):
        if own[j] is not None:
            nxt = j
        right[j] = nxt
    prev = None
    for j in range(tgt_len):
        if own[j] is not None:
            prev = j
        r = right[j]
        out[j] = own[r] if prev is None or (r is not None and r - j <= j - prev) else own[prev]
    return out


def decoder_affiliations(segments: Sequence[tuple[int, int, int, int]], links: Sequence[tuple[int, int]],
                         src_len: int, tgt_len: int) -> np.ndarray:
    """(tgt_len + 1,) int64: the affiliations the decoder's joint-model feature gives a hypothesis.

    In the decoder only each phrase pair's own alignment is known, so `affiliations` is applied inside each
    phrase pair, as Moses's BilingualLM does (cslm/moses/cslm_affiliation.h, the feature's): `segments` are
    the hypothesis' phrase pairs as (source start, source end, target start, target end), ends excluded
    (an n-best list's `-include-segmentation-in-n-best`), `links` its (source, target) word alignment
    (`-print-alignment-info-in-n-best`). The closing `</s>` takes the source `</s>` (src_len)."""
    out = np.empty(tgt_len + 1, np.int64)
    out[tgt_len] = src_len
    for s0, s1, t0, t1 in segments:
        if t1 > t0:
            local = [(i - s0, j - t0) for i, j in links if s0 <= i < s1 and t0 <= j < t1]
            out[t0:t1] = s0 + affiliations(local, s1 - s0, t1 - t0)[:-1]
    return out


def source_windows(src_ids: Sequence[int], affil: np.ndarray, window: int, bos: int, eos: int) -> np.ndarray:
    """(len(affil), window) int32: the `window` source ids centred on each affiliated index, the positions
    before the sentence `<s>`, those after it `</s>` (the affiliation src_len itself is the source `</s>`)."""
    h = window // 2
    padded = np.asarray([bos] * h + list(src_ids) + [eos] * (h + 1), np.int32)
    return np.lib.stride_tricks.sliding_window_view(padded, window)[affil]


def sentence_rows(words: Sequence[str], vocab: Vocabulary, order: int, src_words: Sequence[str] | None = None,
                  links: Sequence[tuple[int, int]] | None = None, src_vocab: Vocabulary | None = None,
                  window: int = 0) -> np.ndarray:
    """The model's input rows of one sentence, the predicted id last: its n-grams (`cslm.ngrams`), and for a
    joint model (`window` > 0) each with its source window before the predicted word: (len+1, order + m) int32."""
    grams = sentence_ngrams(vocab.encode(words), order, vocab.index[BOS], vocab.index[EOS])
    if not window:
        return grams
    win = source_windows(src_vocab.encode(src_words), affiliations(links, len(src_words), len(words)), window,
                         src_vocab.index[BOS], src_vocab.index[EOS])
    return np.concatenate([grams[:, :-1], win, grams[:, -1:]], axis=1)


def _rows(words, vocab, order, side: SourceSide | None, src_words, links) -> np.ndarray:
    if side is None:
        return sentence_rows(words, vocab, order)
    return sentence_rows(words, vocab, order, src_words, links, side.vocab, side.window)


_MISSING = object()


def iter_sentences(path: str, side: SourceSide | None = None
                   ) -> Iterator[tuple[int, list[str], list[str] | None, list[tuple[int, int]] | None]]:
    """(line number, target words, source words, alignment links) of each line; without `side`, the source
    and the links are None. The three files must have as many lines: else an InputError naming the file
    that goes on past the end of another."""
    if side is None:
        for ln, line in iter_lines(path):
            yield ln, line.split(), None, None
        return
    files = (path, side.source, side.alignment)
    for ln, (tgt, src, ali) in enumerate(itertools.zip_longest(
            *(map(lambda x: x[1], iter_lines(f)) for f in files), fillvalue=_MISSING), 1):
        if _MISSING in (tgt, src, ali):
            longer = next(f for f, x in zip(files, (tgt, src, ali)) if x is not _MISSING)
            shorter = next(f for f, x in zip(files, (tgt, src, ali)) if x is _MISSING)
            raise InputError(longer, ln, f"{shorter} ends at line {ln - 1}: the target text, the source text and "
                                         f"the alignment must have one line per sentence each")
        words, src_words = tgt.split(), src.split()
        yield ln, words, src_words, parse_alignment(ali, side, ln, len(src_words), len(words))


@dataclass
class CorpusInfo:
    lines: int  # non-blank sentences
    heldout_lines: np.ndarray  # sorted line numbers (1-based) of the held-out sentences
    train_ngrams: int
    counts: Counter
    source_counts: Counter  # a joint model's training source words (empty without a source)


def scan_corpus(path: str, valid_fraction: float, seed: int, side: SourceSide | None = None) -> CorpusInfo:
    """First pass: count sentences, choose the held-out ones, count training words (and check the source
    and the alignment of every line, so that a bad one stops the run before it trains)."""
    linenos = [ln for ln, line in iter_lines(path) if line.strip()]
    if len(linenos) < 2:
        raise UserError(f"{path}: needs at least 2 non-blank sentences to train, has {len(linenos)}")
    k = min(len(linenos) - 1, max(1, round(len(linenos) * valid_fraction)))
    rng = np.random.default_rng([seed, 0xDA7A])
    held = np.sort(np.asarray(linenos, np.int64)[rng.choice(len(linenos), size=k, replace=False)])
    held_set = set(held.tolist())
    counts: Counter = Counter()
    source_counts: Counter = Counter()
    ngrams = 0
    for ln, words, src_words, _ in iter_sentences(path, side):
        if ln in held_set:
            continue
        if words:
            counts.update(words)
            ngrams += len(words) + 1
            if src_words:
                source_counts.update(src_words)
    return CorpusInfo(len(linenos), held, ngrams, counts, source_counts)


def build_vocab(counts: Counter, size: int) -> Vocabulary:
    return Vocabulary.build(counts, size, reserved=RESERVED)


def heldout_ngrams(path: str, vocab: Vocabulary, heldout_lines: np.ndarray | None, order: int,
                   side: SourceSide | None = None) -> np.ndarray:
    """The rows (`sentence_rows`) of the sentences of `path` on `heldout_lines` (line numbers; None: every line)."""
    held = None if heldout_lines is None else set(heldout_lines.tolist())
    rows = [_rows(words, vocab, order, side, src, links)
            for ln, words, src, links in iter_sentences(path, side) if (held is None or ln in held) and words]
    return np.concatenate(rows) if rows else np.zeros((0, order + (side.window if side else 0)), np.int32)


def _pass_ngrams(path: str, vocab: Vocabulary, heldout: set, order: int, chunk: int,
                 side: SourceSide | None = None) -> Iterator[np.ndarray]:
    """One pass over the training sentences, in corpus order, `chunk` rows at a time."""
    rows, size = [], 0
    for ln, words, src, links in iter_sentences(path, side):
        if not words or ln in heldout:
            continue
        g = _rows(words, vocab, order, side, src, links)
        rows.append(g)
        size += len(g)
        if size >= chunk:
            yield np.concatenate(rows)
            rows, size = [], 0
    if rows:
        yield np.concatenate(rows)


def stream_batches(path: str, vocab: Vocabulary, heldout_lines: np.ndarray, order: int, batch_size: int, seed: int,
                   start_step: int = 0, buffer: int = 1 << 21, side: SourceSide | None = None) -> Iterator[np.ndarray]:
    """Endless (batch_size, order + m) int32 training batches, passes one after another.

    Each pass yields floor(train n-grams / batch_size) batches (the remainder is
    dropped), so step s is batch s % per_pass of pass s // per_pass.
    """
    heldout = set(heldout_lines.tolist())
    width = order + (side.window if side else 0)
    per_pass = None
    step = 0
    p = 0
    while True:
        if per_pass is not None and start_step >= step + per_pass:  # skip whole passes when resuming
            skip = (start_step - step) // per_pass
            p, step = p + skip, step + skip * per_pass
        pending = np.zeros((0, width), np.int32)
        in_pass = 0
        for b, chunk in enumerate(_pass_ngrams(path, vocab, heldout, order, buffer, side)):
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
