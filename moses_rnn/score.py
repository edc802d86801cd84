"""Scoring phrase pairs with a trained model, and rewriting whole phrase tables.

`PhraseScorer.score` turns any list of (source, target) pairs into
log p(target | source) (natural log; target words plus the end-of-phrase
symbol). It is fast by construction:

- each distinct source phrase in the list is encoded once, and the
  decoder's per-phrase terms (h'_0, C c, O_c c) are computed once from it;
- pairs are bucketed by exact length, so no batch carries padding, and each
  bucket is cut into batches under a token budget;
- the softmax over the shortlist runs in large chunks of flattened tokens.

No computation mixes rows, so a pair's score does not depend on what else is
in its batch (up to float rounding, far below 1e-4).

`score_table` streams a table through the scorer: a reader thread parses
windows of lines, the main thread scores them, a writer thread formats and
compresses them, in input order, into a temporary file renamed at the end.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import torch
from tqdm import tqdm

from .modelio import LoadedModel, load_model
from .phrasetable import LOG_FLOOR, PhrasePair, read_chunks
from .textio import atomic_output
from .train import resolve_device
from .vocab import EOS


class PhraseScorer:
    def __init__(self, loaded: LoadedModel, token_budget: int = 16384):
        self.model = loaded.model.eval()
        self.src_vocab, self.tgt_vocab = loaded.src_vocab, loaded.tgt_vocab
        self.device = next(self.model.parameters()).device
        self.token_budget = token_budget
        self.eos = self.tgt_vocab.index[EOS]

    @classmethod
    def from_dir(cls, model_dir: str, device: str = "auto", **kw) -> "PhraseScorer":
        return cls(load_model(model_dir, resolve_device(device)), **kw)

    def _batches(self, lengths: dict[int, list[int]]):
        """(length, member indices) batches: one exact length each, under the token budget."""
        for length in sorted(lengths):
            members = lengths[length]
            per_batch = max(1, self.token_budget // length)
            for i in range(0, len(members), per_batch):
                yield length, members[i : i + per_batch]

    @torch.inference_mode()
    def score(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """log p(target | source) of each (source, target) pair, float64 [len(pairs)]."""
        if not pairs:
            return np.zeros(0)
        dev, model = self.device, self.model
        # distinct sources, in first-seen order
        src_index: dict[str, int] = {}
        pair_src = np.fromiter((src_index.setdefault(s, len(src_index)) for s, _ in pairs), np.int64, len(pairs))
        src_ids = [self.src_vocab.encode(s.split()) for s in src_index]

        by_len: dict[int, list[int]] = defaultdict(list)
        for i, ids in enumerate(src_ids):
            by_len[len(ids)].append(i)
        contexts, order = [], []
        for length, members in self._batches(by_len):
            src = torch.tensor([src_ids[i] for i in members], dtype=torch.long, device=dev)
            mask = torch.ones_like(src, dtype=torch.bool)
            contexts.append(model.context(src, mask))
            order.extend(members)
        # rows of the stacked contexts are in `order`; map source index -> row
        row_of = np.empty(len(src_ids), dtype=np.int64)
        row_of[np.asarray(order)] = np.arange(len(order))
        ctx = type(contexts[0]).cat(contexts)

        eos = self.eos
        tgt_ids = [self.tgt_vocab.encode(t.split()) + [eos] for _, t in pairs]
        by_len = defaultdict(list)
        for i, ids in enumerate(tgt_ids):
            by_len[len(ids)].append(i)
        out = np.empty(len(pairs), dtype=np.float64)
        for length, members in self._batches(by_len):
            tgt = torch.tensor([tgt_ids[i] for i in members], dtype=torch.long, device=dev)
            rows = torch.from_numpy(row_of[pair_src[members]]).to(dev)
            mask = torch.ones_like(tgt, dtype=torch.bool)
            out[members] = model.log_prob(ctx.select(rows), tgt, mask).double().cpu().numpy()
        return out

    def unknown_counts(self, pairs: Iterable[tuple[str, str]]) -> np.ndarray:
        """Words outside the shortlists, source and target together (the paper's word penalty)."""
        cs, ct = self.src_vocab.count_unknown, self.tgt_vocab.count_unknown
        return np.array([cs(s.split()) + ct(t.split()) for s, t in pairs], dtype=np.float64)

    def features(self, pairs: Sequence[tuple[str, str]], normalize: bool = False, unknown: bool = False) -> np.ndarray:
        """Log-domain feature columns [len(pairs), 1 or 2]: log p (optionally per symbol), unknown count."""
        lp = self.score(pairs)
        if normalize:
            lp = lp / np.array([len(t.split()) + 1 for _, t in pairs], dtype=np.float64)
        cols = [lp]
        if unknown:
            cols.append(self.unknown_counts(pairs))
        return np.stack(cols, axis=1)


def format_rows(values: np.ndarray) -> list[str]:
    """Log-domain values -> Moses columns e^value (floored at e^-100), one string per row."""
    vals = np.exp(np.maximum(values, LOG_FLOOR))
    if vals.shape[1] == 1:
        return [f"{v:.7g}" for v in vals[:, 0].tolist()]
    return [" ".join(f"{v:.7g}" for v in row) for row in vals.tolist()]


@dataclass
class ScoreStats:
    lines: int
    seconds: float
    distinct_sources: int

    @property
    def pairs_per_second(self) -> float:
        return self.lines / max(self.seconds, 1e-9)


_DONE = object()


class _Pipeline:
    """Bounded queues between threads; any thread's failure stops them all."""

    def __init__(self):
        self.stop = threading.Event()
        self.errors: list[BaseException] = []

    def spawn(self, target, *args) -> threading.Thread:
        def run():
            try:
                target(*args)
            except BaseException as e:  # re-raised by the main thread
                self.errors.append(e)
                self.stop.set()

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t

    def put(self, q: queue.Queue, item) -> bool:
        while not self.stop.is_set():
            try:
                q.put(item, timeout=0.05)
                return True
            except queue.Full:
                pass
        return False

    def get(self, q: queue.Queue):
        while not self.stop.is_set():
            try:
                return q.get(timeout=0.05)
            except queue.Empty:
                pass
        return _DONE


def score_table(
    scorer: PhraseScorer,
    table: str,
    output: str,
    normalize: bool = False,
    unknown: bool = False,
    window: int = 8192,
    progress: bool = True,
) -> ScoreStats:
    """Append the model's columns to every line of `table`, writing `output` atomically.

    Memory is bounded by a few windows of `window` lines, whatever the table's size.
    """
    start = time.perf_counter()
    pipe = _Pipeline()
    parsed: queue.Queue = queue.Queue(maxsize=2)
    scored: queue.Queue = queue.Queue(maxsize=2)
    written = [0]

    def read():
        for chunk in read_chunks(table, window):
            if not pipe.put(parsed, chunk):
                return
        pipe.put(parsed, _DONE)

    def write(stream):
        while (item := pipe.get(scored)) is not _DONE:
            chunk, cols = item
            stream.write("".join(p.with_scores(c) for p, c in zip(chunk, cols)).encode("utf-8"))
            written[0] += len(chunk)

    lines, sources = 0, 0
    bar = tqdm(unit=" pairs", unit_scale=True, disable=not progress, dynamic_ncols=True, desc="scoring")
    with atomic_output(output) as stream:
        reader = pipe.spawn(read)
        writer = pipe.spawn(write, stream)
        try:
            while (chunk := pipe.get(parsed)) is not _DONE:
                pairs = [(p.source, p.target) for p in chunk]
                rows = format_rows(scorer.features(pairs, normalize=normalize, unknown=unknown))
                sources += len({s for s, _ in pairs})
                if not pipe.put(scored, (chunk, rows)):
                    break
                lines += len(chunk)
                bar.update(len(chunk))
            pipe.put(scored, _DONE)
            writer.join()
        finally:
            pipe.stop.set()
            writer.join()
            reader.join()
            bar.close()
        if pipe.errors:
            raise pipe.errors[0]
        if written[0] != lines:
            raise RuntimeError(f"{output}: wrote {written[0]} lines for {lines} input lines")
    return ScoreStats(lines, time.perf_counter() - start, sources)


def configure_threads(device: torch.device, threads: int | None) -> None:
    if device.type == "cpu":
        torch.set_num_threads(threads or os.cpu_count() or 1)


__all__ = ["PhraseScorer", "ScoreStats", "score_table", "format_rows", "PhrasePair"]
