"""Scoring phrase pairs with a trained model, and rewriting whole phrase tables.

`PhraseScorer.score` turns any list of (source, target) pairs into
log p(target | source) (natural log; target words plus the end-of-phrase
symbol). It is fast by construction:

- each distinct source phrase in the list is encoded once (sources bucketed
  by exact length, so no batch carries padding, under a token budget), and
  the decoder's per-phrase terms (h'_0, C c, O_c c) are computed once from it;
- the decoder runs once per distinct (source, target prefix): the targets of
  a source group form a prefix tree, decoded level by level with every node
  of a level in a few large batches;
- the softmax normaliser over the shortlist is computed in place on large
  blocks of rows.

No computation mixes rows, so a pair's score does not depend on what else is
in its batch (up to float rounding, far below 1e-4).

`score_table` streams a table through the scorer in windows of lines,
scored in this process or by a pool of worker processes, and writes them in
input order into a temporary file renamed at the end.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import torch
from tqdm import tqdm

from .modelio import LoadedModel, load_model
from .phrasetable import format_rows, parse_line
from .textio import InputError, atomic_output, decode_line, iter_raw_windows
from .runtime import configure_threads, resolve_device
from .vocab import EOS


def _as_tensor(rows: list[list[int]], device: torch.device) -> torch.Tensor:
    """Equal-length id lists -> int64 tensor (numpy's list conversion is the fast one)."""
    return torch.from_numpy(np.array(rows, dtype=np.int64)).to(device)


class PhraseScorer:
    def __init__(self, loaded: LoadedModel, token_budget: int = 16384, model_dir: str | None = None,
                 node_chunk: int = 512):
        self.model_dir = model_dir  # lets worker processes load the same model
        self.node_chunk = node_chunk  # decoder nodes (rows of the softmax) computed together
        self.model = loaded.model.eval()
        self.src_vocab, self.tgt_vocab = loaded.src_vocab, loaded.tgt_vocab
        self.device = next(self.model.parameters()).device
        self.token_budget = token_budget
        self.eos = self.tgt_vocab.index[EOS]
        self.distinct_sources = 0  # running counts over all calls, for reports and benchmarks
        self.encoder_tokens = 0
        self.decoder_nodes = 0
        self._tgt_cache: dict[str, list[int]] = {}  # frequent targets recur across windows

    def _target_ids(self, target: str) -> list[int]:
        """Target word ids followed by </s>, through a bounded cache."""
        ids = self._tgt_cache.get(target)
        if ids is None:
            if len(self._tgt_cache) >= 100_000:
                self._tgt_cache.clear()
            ids = self._tgt_cache[target] = self.tgt_vocab.encode(target.split()) + [self.eos]
        return ids

    @classmethod
    def from_dir(cls, model_dir: str, device: str = "auto", **kw) -> "PhraseScorer":
        return cls(load_model(model_dir, resolve_device(device)), model_dir=model_dir, **kw)

    def _batches(self, lengths: np.ndarray):
        """(length, member indices) batches of sources: one exact length each, under the token budget."""
        for length in np.unique(lengths).tolist():
            members = np.flatnonzero(lengths == length)
            per_batch = max(1, self.token_budget // max(length, 1))
            for i in range(0, len(members), per_batch):
                yield length, members[i : i + per_batch]

    def score(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """log p(target | source) of each (source, target) pair, float64 [len(pairs)]."""
        return self._score(pairs)[0]

    @torch.inference_mode()
    def _score(self, pairs: Sequence[tuple[str, str]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(log p, target symbols incl. </s>, words outside the shortlists) of each pair."""
        if not pairs:
            return np.zeros(0), np.zeros(0), np.zeros(0)
        dev, model = self.device, self.model
        # distinct phrases of each side, in first-seen order; pairs point at them
        src_index: dict[str, int] = {}
        tgt_index: dict[str, int] = {}
        pair_src = np.fromiter((src_index.setdefault(s, len(src_index)) for s, _ in pairs), np.int64, len(pairs))
        pair_tgt = np.fromiter((tgt_index.setdefault(t, len(tgt_index)) for _, t in pairs), np.int64, len(pairs))
        self.distinct_sources += len(src_index)
        src_ids = [self.src_vocab.encode(s.split()) for s in src_index]
        tgt_ids = [self._target_ids(t) for t in tgt_index]

        # encode each distinct source once; `ctx` rows follow `order`
        src_len = np.fromiter(map(len, src_ids), np.int64, len(src_ids))
        self.encoder_tokens += int(src_len.sum())
        contexts, order = [], []
        for length, members in self._batches(src_len):
            src = _as_tensor([src_ids[i] for i in members.tolist()], dev)
            contexts.append(model.context(src, torch.ones_like(src, dtype=torch.bool)))
            order.append(members)
        row_of = np.empty(len(src_ids), dtype=np.int64)
        row_of[np.concatenate(order)] = np.arange(len(src_ids))
        ctx = type(contexts[0]).cat(contexts)

        # decode every pair's target through the prefix tree of its source group
        lens = np.fromiter(map(len, tgt_ids), np.int64, len(tgt_ids))[pair_tgt]
        Y = np.full((len(pairs), int(lens.max())), -1, dtype=np.int64)
        Y[np.arange(Y.shape[1])[None, :] < lens[:, None]] = np.concatenate([tgt_ids[i] for i in pair_tgt.tolist()])
        unk_s, unk_t = self.src_vocab.unk_id, self.tgt_vocab.unk_id
        unknown = (np.fromiter((ids.count(unk_s) for ids in src_ids), np.int64, len(src_ids))[pair_src]
                   + np.fromiter((ids.count(unk_t) for ids in tgt_ids), np.int64, len(tgt_ids))[pair_tgt])
        return self._decode_prefix_tree(ctx, row_of[pair_src], Y), lens.astype(np.float64), unknown.astype(np.float64)

    def _decode_prefix_tree(self, ctx, pair_row: np.ndarray, Y: np.ndarray) -> np.ndarray:
        """Sum of log p(y_t | y_<t, source) for each pair (row of Y, -1 padded, ending in </s>).

        The decoder state and the output distribution at step t depend only on
        the source and y_<t, so they are computed once per distinct
        (source, prefix): the nodes of a prefix tree, visited level by level.
        Targets of one source often share their first words ("de la ...",
        "le ..."); on the shared en-fr table this removes about a quarter of
        the decoder's work. Nodes never mix: a pair's score is the same
        whichever pairs share the call.
        """
        model, dev, V = self.model, self.device, len(self.tgt_vocab)
        embed = model.target_embeddings()
        out = np.zeros(len(Y), dtype=np.float64)
        # level 0: one node per distinct source; pairs point at their node
        node_row, node_of_pair = np.unique(pair_row, return_inverse=True)
        node_tok = np.full(len(node_row), -1, dtype=np.int64)  # e(y_0) = 0
        prev_state = model.start_state(ctx.select(torch.from_numpy(node_row).to(dev)))
        active = np.arange(len(Y))
        for t in range(Y.shape[1]):
            self.decoder_nodes += len(node_row)
            y = Y[active, t]
            by_node = np.argsort(node_of_pair[active], kind="stable")
            starts = list(range(0, len(node_row), self.node_chunk))
            bounds = np.searchsorted(node_of_pair[active][by_node], starts + [len(node_row)])
            states = []
            for k, a in enumerate(starts):
                b = min(a + self.node_chunk, len(node_row))
                rows = torch.from_numpy(node_row[a:b]).to(dev)
                tok = torch.from_numpy(node_tok[a:b]).to(dev)
                e_prev = embed(tok.clamp(min=0)) * (tok >= 0)[:, None]
                logits, state = model.step(ctx.select(rows), prev_state[a:b], e_prev)
                states.append(state)
                members = active[by_node[bounds[k] : bounds[k + 1]]]
                local = torch.from_numpy(node_of_pair[members] - a).to(dev)
                picked = logits[local, torch.from_numpy(Y[members, t]).to(dev)]
                m = logits.amax(dim=1, keepdim=True)  # log Z in place: max, exp, sum on the logits buffer
                log_z = logits.sub_(m).exp_().sum(dim=1).log_().add_(m.squeeze(1))
                out[members] += (picked - log_z[local]).double().cpu().numpy()
            # children: (node, y_t) for the pairs that go on after y_t
            going_on = y != self.eos
            active = active[going_on]
            if len(active) == 0:
                break
            key = node_of_pair[active] * V + Y[active, t]
            uniq, node_of_child = np.unique(key, return_inverse=True)
            parent = uniq // V
            node_of_pair[active] = node_of_child
            node_row, node_tok = node_row[parent], uniq % V
            prev_state = torch.cat(states)[torch.from_numpy(parent).to(dev)]
        return out

    def unknown_counts(self, pairs: Iterable[tuple[str, str]]) -> np.ndarray:
        """Words outside the shortlists, source and target together (the paper's word penalty)."""
        cs, ct = self.src_vocab.count_unknown, self.tgt_vocab.count_unknown
        return np.array([cs(s.split()) + ct(t.split()) for s, t in pairs], dtype=np.float64)

    def features(self, pairs: Sequence[tuple[str, str]], normalize: bool = False, unknown: bool = False) -> np.ndarray:
        """Log-domain feature columns [len(pairs), 1 or 2]: log p (optionally per symbol), unknown count."""
        lp, symbols, unk = self._score(pairs)
        cols = [lp / symbols if normalize else lp]
        if unknown:
            cols.append(unk)
        return np.stack(cols, axis=1)


@dataclass
class ScoreStats:
    lines: int
    seconds: float
    distinct_sources: int
    workers: int = 1

    @property
    def pairs_per_second(self) -> float:
        return self.lines / max(self.seconds, 1e-9)


@dataclass(frozen=True)
class TableJob:
    """What scoring one window of a table needs besides its lines."""

    path: str  # for error messages
    nscores: int  # every line must have the first line's number of scores
    normalize: bool = False
    unknown: bool = False


def rescore_lines(scorer: PhraseScorer, job: TableJob, first_lineno: int, raw: list[bytes]) -> tuple[bytes, int, int]:
    """Parse, validate and score a window of raw table lines.

    Returns the rewritten lines (columns appended to field 3, all else kept),
    the number of lines and the number of distinct source phrases.
    """
    pairs = [
        parse_line(decode_line(r, job.path, first_lineno + i), job.path, first_lineno + i, job.nscores)
        for i, r in enumerate(raw)
    ]
    before = scorer.distinct_sources
    rows = format_rows(scorer.features([(p.source, p.target) for p in pairs], job.normalize, job.unknown))
    text = "".join(p.with_scores(r) for p, r in zip(pairs, rows))
    return text.encode("utf-8"), len(pairs), scorer.distinct_sources - before


# -- worker processes ---------------------------------------------------------
_WORKER: tuple[PhraseScorer, TableJob] | None = None


def _init_worker(model_dir: str, token_budget: int, node_chunk: int, job: TableJob) -> None:
    global _WORKER
    torch.set_num_threads(1)
    _WORKER = (PhraseScorer.from_dir(model_dir, device="cpu", token_budget=token_budget, node_chunk=node_chunk), job)


def _run_worker(first_lineno: int, raw: list[bytes]) -> tuple[bytes, int, int]:
    scorer, job = _WORKER
    return rescore_lines(scorer, job, first_lineno, raw)


def _in_order(pool: ProcessPoolExecutor, windows, depth: int):
    """Submit windows to the pool, at most `depth` in flight; yield results in input order."""
    pending: deque = deque()
    for first, raw in windows:
        pending.append(pool.submit(_run_worker, first, raw))
        if len(pending) >= depth:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


@dataclass
class ScoringSetup:
    """A scorer with the device, torch threads and worker processes `score_table` should use."""

    scorer: PhraseScorer
    device: torch.device
    threads: int
    workers: int


def setup_scoring(model_dir: str, table: str, device: str = "auto", threads: int | None = None,
                  workers: int | None = None, token_budget: int = 16384) -> ScoringSetup:
    """Load the model of `model_dir` for scoring `table`, choosing what is not given.

    The device ('auto': CUDA when available), torch's CPU threads
    (`configure_threads`: by model size) and the worker processes
    (`default_workers`: by model size, device and table size). `moses-rnn score`
    and the benchmarks call this, so they measure what the command runs.
    """
    dev = resolve_device(device)
    scorer = PhraseScorer.from_dir(model_dir, device=str(dev), token_budget=token_budget)
    used = configure_threads(dev, threads, scorer.model.config)
    if workers is None:
        workers = default_workers(dev, scorer.model.config, table)
    if workers < 1:
        raise ValueError(f"the number of worker processes must be at least 1, got {workers}")
    return ScoringSetup(scorer, dev, used, workers)


def default_workers(device: torch.device, config, table: str) -> int:
    """Worker processes for `score_table`.

    On CPU, models smaller than the `small` preset spend most of their time
    in Python (parsing, formatting), which one process cannot spread over
    cores; there each core gets a process with one torch thread, once the
    table is large enough (> 8 MB on disk) to repay their start-up (~2 s).
    Larger models and GPUs use one process (torch's own threads or the GPU).
    """
    if device.type != "cpu" or config.hidden >= 256 or (os.cpu_count() or 1) < 2:
        return 1
    if table != "-" and os.path.getsize(table) < 8 << 20:
        return 1
    return os.cpu_count() or 1


def score_table(
    scorer: PhraseScorer,
    table: str,
    output: str,
    normalize: bool = False,
    unknown: bool = False,
    window: int = 8192,
    workers: int = 1,
    progress: bool = True,
) -> ScoreStats:
    """Append the model's columns to every line of `table`, writing `output` atomically.

    The table is read in windows of `window` lines; each window is parsed,
    scored and formatted either in this process (`workers` = 1; torch uses
    its own threads or the GPU) or by a pool of `workers` processes, each
    loading the model from `scorer.model_dir`. Results are written in input
    order; memory is bounded by a few windows per worker, whatever the size
    of the table. Gzip decompression and compression run in their own threads.
    """
    start = time.perf_counter()
    windows = iter_raw_windows(table, window)
    head = next(windows, None)
    if head is None:  # an empty table is an upstream failure, not a table to rewrite
        raise InputError(table, None, "the phrase table is empty (no lines)")
    nscores = len(parse_line(decode_line(head[1][0], table, 1), table, 1).scores)
    windows = itertools.chain([head], windows)
    job = TableJob(table, nscores, normalize, unknown)
    if workers > 1 and scorer.model_dir is None:
        raise ValueError("worker processes need a scorer loaded with PhraseScorer.from_dir")

    read = written = sources = 0

    def counted(it):
        nonlocal read
        for first, raw in it:
            read += len(raw)
            yield first, raw

    bar = tqdm(unit=" pairs", unit_scale=True, disable=not progress, dynamic_ncols=True, desc="scoring")
    pool = None
    try:
        with atomic_output(output) as stream:
            if workers > 1:
                pool = ProcessPoolExecutor(
                    workers,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_init_worker,
                    initargs=(scorer.model_dir, scorer.token_budget, scorer.node_chunk, job),
                )
                results = _in_order(pool, counted(windows), depth=2 * workers)
            else:
                results = (rescore_lines(scorer, job, f, raw) for f, raw in counted(windows))
            for text, n, distinct in results:
                stream.write(text)
                written += n
                sources += distinct
                bar.update(n)
            if written != read:
                raise RuntimeError(f"{output}: wrote {written} lines for {read} input lines")
    except BrokenProcessPool:  # an OSError, so the command line reports it in one line
        raise ChildProcessError(f"{table}: a scoring worker process died (killed, or out of memory?); "
                                f"try fewer --workers") from None
    finally:
        bar.close()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    return ScoreStats(written, time.perf_counter() - start, sources, workers)


__all__ = ["PhraseScorer", "ScoreStats", "ScoringSetup", "TableJob", "score_table", "rescore_lines", "default_workers",
           "setup_scoring"]
