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


def _as_tensor(rows: list[list[int]], device: torch.device) -> torch.Tensor:
    """Equal-length id lists -> int64 tensor (numpy's list conversion is the fast one)."""
    return torch.from_numpy(np.array(rows, dtype=np.int64)).to(device)


class PhraseScorer:
    def __init__(self, loaded: LoadedModel, token_budget: int = 16384):
        self.model = loaded.model.eval()
        self.src_vocab, self.tgt_vocab = loaded.src_vocab, loaded.tgt_vocab
        self.device = next(self.model.parameters()).device
        self.token_budget = token_budget
        self.eos = self.tgt_vocab.index[EOS]
        self.distinct_sources = 0  # running count over all calls, for reports

    @classmethod
    def from_dir(cls, model_dir: str, device: str = "auto", **kw) -> "PhraseScorer":
        return cls(load_model(model_dir, resolve_device(device)), **kw)

    def _batches(self, lengths: np.ndarray):
        """(length, member indices) batches: one exact length each, under the token budget."""
        for length in np.unique(lengths).tolist():
            members = np.flatnonzero(lengths == length)
            per_batch = max(1, self.token_budget // max(length, 1))
            for i in range(0, len(members), per_batch):
                yield length, members[i : i + per_batch]

    @torch.inference_mode()
    def score(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """log p(target | source) of each (source, target) pair, float64 [len(pairs)]."""
        if not pairs:
            return np.zeros(0)
        dev, model = self.device, self.model
        # distinct phrases of each side, in first-seen order; pairs point at them
        src_index: dict[str, int] = {}
        tgt_index: dict[str, int] = {}
        pair_src = np.fromiter((src_index.setdefault(s, len(src_index)) for s, _ in pairs), np.int64, len(pairs))
        pair_tgt = np.fromiter((tgt_index.setdefault(t, len(tgt_index)) for _, t in pairs), np.int64, len(pairs))
        self.distinct_sources += len(src_index)
        src_ids = [self.src_vocab.encode(s.split()) for s in src_index]
        eos = [self.eos]
        tgt_ids = [self.tgt_vocab.encode(t.split()) + eos for t in tgt_index]

        # encode each distinct source once; `ctx` rows follow `order`
        src_len = np.fromiter(map(len, src_ids), np.int64, len(src_ids))
        contexts, order = [], []
        for length, members in self._batches(src_len):
            src = _as_tensor([src_ids[i] for i in members.tolist()], dev)
            contexts.append(model.context(src, torch.ones_like(src, dtype=torch.bool)))
            order.append(members)
        row_of = np.empty(len(src_ids), dtype=np.int64)
        row_of[np.concatenate(order)] = np.arange(len(src_ids))
        ctx = type(contexts[0]).cat(contexts)

        tgt_len = np.fromiter(map(len, tgt_ids), np.int64, len(tgt_ids))[pair_tgt]
        out = np.empty(len(pairs), dtype=np.float64)
        for length, members in self._batches(tgt_len):
            tgt = _as_tensor([tgt_ids[i] for i in pair_tgt[members].tolist()], dev)
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

    lines, sources_before = 0, scorer.distinct_sources
    bar = tqdm(unit=" pairs", unit_scale=True, disable=not progress, dynamic_ncols=True, desc="scoring")
    with atomic_output(output) as stream:
        reader = pipe.spawn(read)
        writer = pipe.spawn(write, stream)
        try:
            while (chunk := pipe.get(parsed)) is not _DONE:
                pairs = [(p.source, p.target) for p in chunk]
                rows = format_rows(scorer.features(pairs, normalize=normalize, unknown=unknown))
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
    return ScoreStats(lines, time.perf_counter() - start, scorer.distinct_sources - sources_before)


def configure_threads(device: torch.device, threads: int | None = None, config=None) -> int:
    """Set torch's intra-op threads for CPU scoring and return the number used.

    Default: every core for models of the `small` preset's size and up. For
    smaller models one op is too short to split, and idle intra-op threads
    spin against the reader and writer threads, so one thread is faster.
    """
    if device.type != "cpu":
        return torch.get_num_threads()
    if threads is None:
        big = config is None or config.hidden >= 256
        threads = (os.cpu_count() or 1) if big else 1
    torch.set_num_threads(threads)
    return threads


__all__ = ["PhraseScorer", "ScoreStats", "score_table", "format_rows", "PhrasePair"]
