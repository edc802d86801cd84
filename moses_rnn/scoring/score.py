"""Scoring phrase pairs with a trained model, and rewriting whole phrase tables.

`PhraseScorer.score` turns any list of (source, target) pairs into
log p(target | source) (natural log; target words plus the end-of-phrase
symbol); `score_table` streams a table through it in windows of lines, in
this process and worker processes, into an atomic output. One process:
`moses_rnn.scoring.shard.score_table` spreads the same work over a torchrun
job. How the scorer is fast, why a pair's score does not depend on its batch,
and the bfloat16 path: docs/scoring.md, "How the scorer works".
"""

from __future__ import annotations

import copy
import itertools
import multiprocessing
import os
import signal
import time
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm

from mtcommon.errors import UserError
from mtcommon.finite import check_finite
from mtcommon.runtime import (Distributed, amp_dtype, autocast, configure_threads, cpu_count, dtype_name,
                              exit_with_parent, is_big, probe_dtype, resolve_device)
from mtcommon.textio import InputError, atomic_output, count_lines, decode_line, iter_line_blocks
from mtcommon.vocab import EOS, Vocabulary

from ..formats.phrasetable import format_columns, parse_line, parse_window, phrase_key
from ..networks.modelbase import log_normalizer_
from ..networks.modelio import LoadedModel, load_model

# Logits computed at once (rows x shortlist) by the prefix-tree decoder: on a CPU a block that stays
# in a core's L2 cache (1 MB) for the max / exp / sum passes of the in-place normaliser (the tiny
# preset: 1,024 rows, 40% faster per node than 16,384); on a GPU one large enough to fill it. Never
# fewer than 512 rows, so that large shortlists still get matrix products of useful size.
LOGIT_BLOCK = {"cpu": 1 << 18, "cuda": 1 << 26}


def default_node_chunk(device: torch.device, vocab_size: int) -> int:
    """Decoder nodes (rows of the softmax) computed together on `device` for this shortlist size."""
    return max(512, LOGIT_BLOCK.get(device.type, LOGIT_BLOCK["cpu"]) // max(vocab_size, 1))


# -- bfloat16 ---------------------------------------------------------------------------------------------------
class Bf16Linear(nn.Module):
    """x W^T + b with W cast to bfloat16 once: bfloat16 inputs, float32 accumulation (oneDNN on CPU,
    cuBLAS on GPU), result returned as float32 and the bias added in float32. `weight` stays readable
    (RNNsearch slices it), in bfloat16."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = nn.Parameter(linear.weight.detach().to(torch.bfloat16), requires_grad=False)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x.to(torch.bfloat16), self.weight).float()
        return y if self.bias is None else y.add_(self.bias)


class Float32Output(nn.Module):
    """The output layer of a bfloat16 copy, kept in float32 (autocast off): the logits feed the
    softmax normaliser, where bfloat16's 8-bit mantissa would move log p by several hundredths."""

    def __init__(self, output: nn.Module):
        super().__init__()
        self.inner = output

    def logits(self, s: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        with torch.autocast(s.device.type, enabled=False):
            return self.inner.logits(s.float(), rows)

    def log_probs(self, s: torch.Tensor, y: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
        with torch.autocast(s.device.type, enabled=False):
            return self.inner.log_probs(s.float(), y, chunk)


def bfloat16_copy(model: nn.Module) -> nn.Module:
    """A copy of `model` for bfloat16 scoring: every nn.Linear outside the output layer becomes a
    `Bf16Linear` (weights cast once, not on every call as autocast would), the output layer a
    `Float32Output`. Run it under `runtime.autocast(device, torch.bfloat16)`, which covers the products
    that architectures compute from raw weights (RNNsearch's F.linear on slices of U)."""
    dup = copy.deepcopy(model)
    for name, module in list(dup.named_modules()):
        if name == "output" or name.startswith("output."):
            continue  # the output layer stays float32
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, child_name, Bf16Linear(child))
    dup.output = Float32Output(dup.output)
    return dup.eval()


# -- the scorer -------------------------------------------------------------------------------------------------
def _unit_ids(phrases: list[bytes], vocab: Vocabulary,
              end: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Id matrix [phrases, longest (+1 with `end`)] right-padded with -1 (`end` appended to every row),
    the number of units of each phrase, and how many of them map to `[UNK]`.

    `phrases` are keys as `phrasetable.Window` and `phrase_key` make them: words joined by single
    spaces, which `vocab.encode_keys` turns into units (words, or subword units)."""
    ids, lens = vocab.encode_keys(phrases)
    width = int(lens.max(initial=0)) + (end is not None)
    matrix = np.full((len(phrases), max(width, 1)), -1, dtype=np.int64)
    matrix[np.arange(matrix.shape[1])[None, :] < lens[:, None]] = ids  # row-major: phrase by phrase
    if end is not None:
        matrix[np.arange(len(phrases)), lens] = end
    unknown = np.bincount(np.repeat(np.arange(len(phrases)), lens)[ids == vocab.unk_id], minlength=len(phrases))
    return matrix, lens, unknown


# Pairs of a table's first window that `--dtype auto` times its scoring on (`PhraseScorer.choose_dtype`): a
# call of a fraction of a second for the `paper` preset on a CPU core, so that the probe stays within its budget.
PROBE_PAIRS = 512


class PhraseScorer:
    def __init__(self, loaded: LoadedModel, token_budget: int = 16384, model_dir: str | None = None,
                 node_chunk: int | None = None, dtype: str = "fp32"):
        self.model_dir = model_dir  # lets worker processes load the same model
        self.src_vocab, self.tgt_vocab = loaded.src_vocab, loaded.tgt_vocab
        model = loaded.model.eval()
        self.device = next(model.parameters()).device
        # 'fp32' | 'bf16'; 'auto' until the first pairs are scored (`choose_dtype`), float32 meanwhile
        self.dtype = dtype
        self.amp = None if dtype == "auto" else amp_dtype(self.device, dtype)  # None: float32
        self.model = model if self.amp is None else bfloat16_copy(model)
        self.token_budget = token_budget
        self.node_chunk = node_chunk or default_node_chunk(self.device, len(self.tgt_vocab))
        self.eos = self.tgt_vocab.index[EOS]
        self.distinct_sources = 0  # running counts over all calls, for reports and benchmarks
        self.encoder_tokens = 0
        self.decoder_nodes = 0

    @classmethod
    def from_dir(cls, model_dir: str, device: str = "auto", **kw) -> "PhraseScorer":
        return cls(load_model(model_dir, resolve_device(device)), model_dir=model_dir, **kw)

    @property
    def compute_dtype(self) -> str:
        return dtype_name(self.amp)

    def choose_dtype(self, sources: list[bytes], targets: list[bytes], quiet: bool = False, combine=None) -> None:
        """Settle `--dtype auto` (`runtime.probe_dtype`; `combine` as there), once: on a CPU with native
        bfloat16, by timing the scoring of the first `PROBE_PAIRS` of these pairs with the float32 model
        and with its bfloat16 copy. The probe's scores are dropped and the running counts left as they
        were, so what follows is what a scorer made with the chosen dtype gives."""
        if self.dtype != "auto":
            return
        sample = sources[:PROBE_PAIRS], targets[:PROBE_PAIRS]
        models, counts = {None: self.model}, (self.distinct_sources, self.encoder_tokens, self.decoder_nodes)

        def step(amp: torch.dtype | None) -> None:
            if amp not in models:  # in the untimed warm-up call
                models[amp] = bfloat16_copy(models[None])
            self.amp, self.model = amp, models[amp]
            self._scores(*sample)

        amp = probe_dtype(self.device, self.dtype, step, what=f"scoring {len(sample[0])} pairs", quiet=quiet,
                          combine=combine)
        self.amp, self.model = amp, models[amp] if amp in models else bfloat16_copy(models[None])
        self.dtype = dtype_name(amp)  # what worker processes are given
        self.distinct_sources, self.encoder_tokens, self.decoder_nodes = counts

    def _upload(self, array: np.ndarray) -> torch.Tensor:
        """A host array on the scoring device: pinned and copied asynchronously on CUDA (the copy
        queues behind the kernels already launched instead of waiting for them)."""
        t = torch.from_numpy(np.ascontiguousarray(array))
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t

    def _batches(self, lengths: np.ndarray):
        """(length, member indices) batches of sources: one exact length each, under the token budget."""
        for length in np.unique(lengths).tolist():
            members = np.flatnonzero(lengths == length)
            per_batch = max(1, self.token_budget // max(length, 1))
            for i in range(0, len(members), per_batch):
                yield length, members[i : i + per_batch]

    def score(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """log p(target | source) of each (source, target) pair, float64 [len(pairs)]."""
        return self.log_probs(pairs)[0]

    def log_probs(self, pairs: Sequence[tuple[str, str]]) -> tuple[np.ndarray, np.ndarray]:
        """(log p(target | source), target symbols: units + </s>) of each pair, float64 [len(pairs)] each."""
        lp, symbols, _ = self._score_keys(*self._keys(pairs))
        return lp, symbols

    @staticmethod
    def _keys(pairs: Sequence[tuple[str, str]]) -> tuple[list[bytes], list[bytes]]:
        return [phrase_key(s) for s, _ in pairs], [phrase_key(t) for _, t in pairs]

    def features(self, pairs: Sequence[tuple[str, str]], normalize: bool = False, unknown: bool = False) -> np.ndarray:
        """Log-domain feature columns [len(pairs), 1 or 2]: log p (optionally per symbol), unknown count."""
        return self.phrase_features(*self._keys(pairs), normalize=normalize, unknown=unknown)

    def phrase_features(self, sources: list[bytes], targets: list[bytes], normalize: bool = False,
                        unknown: bool = False) -> np.ndarray:
        """`features` of pairs given as UTF-8 phrases (`phrasetable.Window`'s sources and targets)."""
        lp, symbols, unk = self._score_keys(sources, targets)
        cols = [lp / symbols if normalize else lp]
        if unknown:
            cols.append(unk)
        return np.stack(cols, axis=1)

    def _score_keys(self, sources: list[bytes], targets: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(log p, target symbols incl. </s>, words mapped to [UNK]) of each (source, target) pair."""
        if self.dtype == "auto":  # the first call settles it on its own pairs
            self.choose_dtype(sources, targets)
        return self._scores(sources, targets)

    @torch.inference_mode()
    def _scores(self, sources: list[bytes], targets: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`_score_keys` in the scorer's current dtype."""
        n = len(sources)
        if n == 0:
            return np.zeros(0), np.zeros(0), np.zeros(0)
        # distinct phrases of each side, in first-seen order; pairs point at them (all C-level passes)
        src_index = dict(zip(dict.fromkeys(sources), itertools.count()))
        tgt_index = dict(zip(dict.fromkeys(targets), itertools.count()))
        pair_src = np.fromiter(map(src_index.__getitem__, sources), dtype=np.int64, count=n)
        pair_tgt = np.fromiter(map(tgt_index.__getitem__, targets), dtype=np.int64, count=n)
        S, src_len, src_unk = _unit_ids(list(src_index), self.src_vocab)
        T, tgt_len, tgt_unk = _unit_ids(list(tgt_index), self.tgt_vocab, end=self.eos)
        self.distinct_sources += len(src_index)
        self.encoder_tokens += int(src_len.sum())
        with autocast(self.device, self.amp):
            ctx, row_of = self._encode(S, src_len)
            lp = self._decode_prefix_tree(ctx, row_of[pair_src], T[pair_tgt])
        symbols = (tgt_len + 1)[pair_tgt].astype(np.float64)
        return lp, symbols, (src_unk[pair_src] + tgt_unk[pair_tgt]).astype(np.float64)

    def _encode(self, S: np.ndarray, lengths: np.ndarray):
        """The decoder context of each distinct source (rows of S), and the context row of each."""
        contexts, order = [], []
        for length, members in self._batches(lengths):
            src = self._upload(S[members, :length])  # one exact length: no padding
            contexts.append(self.model.context(src, torch.ones_like(src, dtype=torch.bool)))
            order.append(members)
        row_of = np.empty(len(S), dtype=np.int64)
        row_of[np.concatenate(order)] = np.arange(len(S))
        return type(contexts[0]).cat(contexts), row_of

    def _decode_prefix_tree(self, ctx, pair_row: np.ndarray, Y: np.ndarray) -> np.ndarray:
        """Sum of log p(y_t | y_<t, source) for each pair (row of Y, -1 padded, ending in </s>).

        The decoder state and the output distribution at step t depend only on
        the source and y_<t, so they are computed once per distinct
        (source, prefix): the nodes of a prefix tree, visited level by level.
        Targets of one source often share their first words ("de la ...",
        "le ..."); on the shared en-fr table this removes about a quarter of
        the decoder's work. Nodes never mix: a pair's score is the same
        whichever pairs share the call.

        The tree's bookkeeping (which pairs go on, their children) is numpy on
        the host; each level's indices go to the device in one transfer and the
        log-probabilities are summed there, so a GPU is never waited for until
        the end.
        """
        model, V, chunk = self.model, len(self.tgt_vocab), self.node_chunk
        embed = model.target_embeddings()
        out = torch.zeros(len(Y), dtype=torch.float64, device=self.device)
        # level 0: one node per distinct source; pairs point at their node
        node_row, node_of_pair = np.unique(pair_row, return_inverse=True)
        node_tok = np.full(len(node_row), -1, dtype=np.int64)  # e(y_0) = 0
        state = model.start_state(ctx.select(self._upload(node_row)))
        active = np.arange(len(Y))
        for t in range(Y.shape[1]):
            nodes = len(node_row)
            self.decoder_nodes += nodes
            by_node = active[np.argsort(node_of_pair[active], kind="stable")]  # the pairs, grouped by node
            pair_node = node_of_pair[by_node]
            firsts = list(range(0, nodes, chunk))
            bounds = np.searchsorted(pair_node, firsts + [nodes]).tolist()
            rows_d, tok_d = self._upload(node_row), self._upload(node_tok)
            pair_d, node_d, word_d = self._upload(by_node), self._upload(pair_node), self._upload(Y[by_node, t])
            states = []
            for k, a in enumerate(firsts):
                b, p, q = min(a + chunk, nodes), bounds[k], bounds[k + 1]
                tok = tok_d[a:b]
                e_prev = embed(tok.clamp(min=0)) * (tok >= 0)[:, None]
                logits, s = model.step(ctx.select(rows_d[a:b]), state[a:b], e_prev)
                states.append(s)
                local = node_d[p:q] - a
                picked = logits[local, word_d[p:q]]
                out.index_add_(0, pair_d[p:q], (picked - log_normalizer_(logits)[local]).double())
            # children: (node, y_t) for the pairs that go on after y_t
            y = Y[active, t]
            going_on = y != self.eos
            active = active[going_on]
            if len(active) == 0:
                break
            key = node_of_pair[active] * V + y[going_on]
            uniq, node_of_child = np.unique(key, return_inverse=True)
            parent = uniq // V
            node_of_pair[active] = node_of_child
            node_row, node_tok = node_row[parent], uniq % V
            state = torch.cat(states)[self._upload(parent)]
        return out.cpu().numpy()


# -- tables -----------------------------------------------------------------------------------------------------
@dataclass
class ScoreStats:
    lines: int
    seconds: float
    distinct_sources: int
    workers: int = 1
    processes: int = 1  # torchrun ranks

    @property
    def pairs_per_second(self) -> float:
        return self.lines / max(self.seconds, 1e-9)


# The longest phrase, in words, `score_table` scores by default (`moses-rnn score --max-phrase-words`). Time and
# memory grow with a phrase's length (the encoder and decoder take a step per word): a 1 MB line of words took
# 840 MB and 90 s. Moses's phrase tables hold phrases of up to 7 words by default (-max-phrase-length), and
# hardly ever more than a few dozen, so a longer phrase is a damaged table or not a phrase table.
MAX_PHRASE_WORDS = 1000


@dataclass(frozen=True)
class TableJob:
    """What scoring one window of a table needs besides its lines."""

    path: str  # for error messages
    nscores: int  # every line must have the first line's number of scores
    normalize: bool = False
    unknown: bool = False
    max_words: int = MAX_PHRASE_WORDS  # the longest phrase scored, in words


def check_phrase_lengths(window, job: TableJob) -> None:
    """An InputError naming the first line of `window` (table order) with a phrase of more than
    `job.max_words` words. Free for ordinary tables: a phrase of more than k words has at least 2k + 1 bytes,
    so only windows holding a phrase that long are looked at word by word."""
    limit = job.max_words
    most = 2 * limit
    if max(map(len, window.sources), default=0) <= most and max(map(len, window.targets), default=0) <= most:
        return
    for i, pair in enumerate(zip(window.sources, window.targets)):
        for side, phrase in zip(("source", "target"), pair):
            if len(phrase) > most and (words := phrase.count(b" ") + 1) > limit:
                raise InputError(job.path, window.first_lineno + i,
                                 f"{side} phrase of {words} words, more than the limit of {limit} "
                                 f"(--max-phrase-words; Moses phrases have a few words)")


def rescore_window(scorer: PhraseScorer, job: TableJob, first_lineno: int, data: bytes) -> tuple[bytes, int, int]:
    """Parse, validate and score a window of raw table lines (`data`, whole lines).

    Returns the rewritten lines (columns appended to field 3, every other byte
    kept), the number of lines and the number of distinct source phrases. A
    phrase longer than `job.max_words` words raises InputError naming its line
    (`check_phrase_lengths`). A non-finite log p (a model that overflows)
    raises NonFiniteScores naming the model and the line (`mtcommon.finite`),
    so no `nan` is ever written.
    """
    window = parse_window(data, job.path, first_lineno, job.nscores)
    check_phrase_lengths(window, job)
    before = scorer.distinct_sources
    values = scorer.phrase_features(window.sources, window.targets, job.normalize, job.unknown)
    check_finite(values[:, 0], scorer.model_dir or "the model", lambda i: f"for {job.path}:{first_lineno + i}")
    return window.with_columns(format_columns(values)), len(window), scorer.distinct_sources - before


# -- worker processes ---------------------------------------------------------
_WORKER: tuple[PhraseScorer, TableJob] | None = None


def _init_worker(parent: int, model_dir: str, token_budget: int, node_chunk: int, dtype: str, job: TableJob) -> None:
    """A worker process's start: it dies with `parent` (`exit_with_parent`), leaves Ctrl-C and a closed
    terminal (SIGINT, SIGHUP, sent to the whole process group) to the parent, which stops the pool, and loads
    the model."""
    global _WORKER
    exit_with_parent(parent)
    for sig in ("SIGINT", "SIGHUP"):
        if hasattr(signal, sig):
            signal.signal(getattr(signal, sig), signal.SIG_IGN)
    torch.set_num_threads(1)
    _WORKER = (PhraseScorer.from_dir(model_dir, device="cpu", token_budget=token_budget, node_chunk=node_chunk,
                                     dtype=dtype), job)


def _run_worker(first_lineno: int, data: bytes) -> tuple[bytes, int, int]:
    scorer, job = _WORKER
    return rescore_window(scorer, job, first_lineno, data)


@dataclass
class ScoringSetup:
    """A scorer with the device, torch threads, worker processes and torchrun place `score_table` should use.

    A context manager: leaving it ends the torchrun process group, if one was started."""

    scorer: PhraseScorer
    device: torch.device
    threads: int
    workers: int
    dist: Distributed = field(default_factory=Distributed)

    def __enter__(self) -> "ScoringSetup":
        return self

    def __exit__(self, *exc) -> None:
        self.dist.stop()


def setup_scoring(model_dir: str, table: str, device: str = "auto", threads: int | None = None,
                  workers: int | None = None, token_budget: int = 16384, dtype: str = "fp32",
                  dist: Distributed | None = None) -> ScoringSetup:
    """Load the model of `model_dir` for scoring `table`, choosing what is not given.

    The device ('auto': CUDA when available; under torchrun, cuda:LOCAL_RANK),
    torch's CPU threads (`configure_threads`: by model size; under torchrun the
    processes of a machine share its cores), the worker processes
    (`default_workers`) and the compute dtype (`runtime.amp_dtype`; 'auto' is settled on the table's first
    window, `settle_dtype`). `moses-rnn
    score` and the benchmarks call this, so they measure what the command runs.
    """
    dist = dist or Distributed()
    dev = dist.start(resolve_device(device))
    scorer = PhraseScorer.from_dir(model_dir, device=str(dev), token_budget=token_budget, dtype=dtype)
    local = dist.local_world
    if threads is None and local > 1 and dev.type == "cpu" and is_big(scorer.model.config):
        threads = max(1, cpu_count() // local)
    used = configure_threads(dev, threads, scorer.model.config)
    if workers is None:
        workers = max(1, default_workers(dev, scorer.model.config, table) // local)
    if workers < 1:
        raise UserError(f"the number of worker processes must be at least 1, got {workers}")
    return ScoringSetup(scorer, dev, used, workers, dist)


def default_workers(device: torch.device, config, table: str) -> int:
    """Worker processes for `score_table`.

    On CPU, models smaller than the `small` preset spend most of their time
    in Python (parsing, formatting), which one process cannot spread over
    cores; there each core gets a process with one torch thread, once the
    table is large enough (> 8 MB on disk) to repay their start-up (~2 s).
    Larger models and GPUs use one process (torch's own threads or the GPU).
    """
    if device.type != "cpu" or is_big(config) or cpu_count() < 2:
        return 1
    if table != "-" and os.path.getsize(table) < 8 << 20:
        return 1
    return cpu_count()


def workers_warning(workers: int, local_world: int = 1) -> str | None:
    """A one-line warning when `workers` scoring processes (per torchrun process, `local_world` of them on
    this machine) outnumber the cores this process may use; None otherwise. A pool of two (this process and
    one worker, the least that runs the pool at all) is never warned about.

    A warning, not a cap: each process takes a core for a small model's Python work, so processes beyond the
    cores only add memory (a model each) and start-up time; but the run stays what was asked for, and the
    user may know better than the affinity mask (cores freed later, a machine shared on purpose)."""
    cores = cpu_count()
    if workers * local_world <= max(cores, 2):
        return None
    processes = f"{workers} (x {local_world} torchrun processes)" if local_world > 1 else f"{workers}"
    return (f"moses-rnn: warning: --workers {processes}: more scoring processes than the {cores} cores this "
            f"process may use; the extra ones add memory and start-up time, not speed")


def first_line_scores(table: str, head: tuple[int, bytes] | None) -> int:
    """The number of scores on line 1 (every line must have as many), from the table's first block
    `head`; None (an empty table) is an error."""
    if head is None:  # an empty table is an upstream failure, not a table to rewrite
        raise InputError(table, None, "the phrase table is empty (no lines)")
    data = head[1]
    first = data[: data.find(b"\n") + 1 or len(data)]
    return len(parse_line(decode_line(first, table, 1), table, 1).scores)


def settle_dtype(scorer: PhraseScorer, job: TableJob, head: tuple[int, bytes], quiet: bool = False,
                 combine=None) -> None:
    """Settle the scorer's `--dtype auto` (`PhraseScorer.choose_dtype`) on the table's first window `head`
    (first line, whole lines), before worker processes start: they are given the choice."""
    if scorer.dtype == "auto":
        window = parse_window(head[1], job.path, head[0], job.nscores)
        check_phrase_lengths(window, job)
        scorer.choose_dtype(window.sources, window.targets, quiet, combine)


class _Failed:
    """An exception met scoring a window in this process, raised when that window's turn comes."""

    def __init__(self, exc: BaseException):
        self.exc = exc


class WindowPool:
    """Scores a stream of windows with `workers` processes, this one included, yielding
    (first line, result) in input order.

    With more than one, `workers - 1` pool processes take windows while they have fewer than two
    each in hand, and this process scores the others itself, between reading and writing: so every
    core works from the first window on (the pool's processes need a second or two to import torch
    and load the model), and no process idles while another has a queue.
    """

    def __init__(self, scorer: PhraseScorer, job: TableJob, workers: int):
        if workers > 1 and scorer.model_dir is None:
            raise ValueError("worker processes need a scorer loaded with PhraseScorer.from_dir")
        self.scorer, self.job, self.workers, self.pool = scorer, job, workers, None

    def __enter__(self) -> "WindowPool":
        if self.workers > 1:
            s = self.scorer
            self.pool = ProcessPoolExecutor(self.workers - 1, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=_init_worker,
                                            initargs=(os.getpid(), s.model_dir, s.token_budget, s.node_chunk,
                                                      s.dtype, self.job))
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        if exc_type is BrokenProcessPool:  # an OSError, so the command line reports it in one line
            raise ChildProcessError(f"{self.job.path}: a scoring worker process died (killed, or out of "
                                    f"memory?); try fewer --workers") from None

    def _here(self, first: int, data: bytes):
        try:
            return rescore_window(self.scorer, self.job, first, data)
        except Exception as e:  # raised in its turn: an earlier window may hold an earlier error
            return _Failed(e)

    def results(self, blocks) -> Iterator[tuple[int, tuple[bytes, int, int]]]:
        if self.pool is None:
            return ((first, rescore_window(self.scorer, self.job, first, data)) for first, data in blocks)
        return self._shared(blocks)

    def _shared(self, blocks):
        room = 2 * (self.workers - 1)  # windows the pool may hold
        most = room + 2 * self.workers + 2  # windows held here at most, waiting for the head of the queue
        pending: deque = deque()  # (first line, Future | result | _Failed), in input order

        def take():
            first, x = pending.popleft()
            x = x.result() if isinstance(x, Future) else x
            if isinstance(x, _Failed):
                raise x.exc
            return first, x

        for first, data in blocks:
            busy = sum(isinstance(x, Future) and not x.done() for _, x in pending)
            if busy < room:
                pending.append((first, self.pool.submit(_run_worker, first, data)))
            else:
                pending.append((first, self._here(first, data)))
            while pending and not (isinstance(pending[0][1], Future) and not pending[0][1].done()):
                yield take()
            if len(pending) >= most:
                yield take()
        while pending:
            yield take()


def score_table(
    scorer: PhraseScorer,
    table: str,
    output: str,
    normalize: bool = False,
    unknown: bool = False,
    window: int = 8192,
    workers: int = 1,
    progress: bool = True,
    max_words: int = MAX_PHRASE_WORDS,
) -> ScoreStats:
    """Append the model's columns to every line of `table`, writing `output` atomically.

    The table is read in windows of `window` lines; each window is parsed,
    scored and formatted by one of `workers` processes (`WindowPool`): this
    one (with `workers` = 1 alone; torch uses its own threads or the GPU) and
    `workers` - 1 pool processes, each loading the model from
    `scorer.model_dir`. Results are written in input
    order; memory is bounded by a few windows per worker, whatever the size
    of the table. Gzip decompression and compression run in their own threads.
    A phrase of more than `max_words` words is an error naming its line.
    One process; `moses_rnn.scoring.shard.score_table` spreads it over a torchrun job.
    """
    start = time.perf_counter()
    blocks = iter_line_blocks(table, window)
    head = next(blocks, None)
    job = TableJob(table, first_line_scores(table, head), normalize, unknown, max_words)
    settle_dtype(scorer, job, head, quiet=not progress)
    blocks = itertools.chain([head], blocks)
    read = written = sources = 0

    def counted(blocks):
        nonlocal read
        for first, data in blocks:
            read += count_lines(data)
            yield first, data

    with tqdm(unit=" pairs", unit_scale=True, disable=not progress, dynamic_ncols=True, desc="scoring") as bar:
        with atomic_output(output) as stream, WindowPool(scorer, job, workers) as pool:
            for _, (text, n, distinct) in pool.results(counted(blocks)):
                stream.write(text)
                written += n
                sources += distinct
                bar.update(n)
            if written != read:
                raise RuntimeError(f"{output}: wrote {written} lines for {read} input lines")
    return ScoreStats(written, time.perf_counter() - start, sources, workers)


__all__ = ["PhraseScorer", "ScoreStats", "ScoringSetup", "TableJob", "WindowPool", "first_line_scores", "score_table", "rescore_window",
           "default_workers", "setup_scoring", "bfloat16_copy", "settle_dtype", "default_node_chunk",
           "MAX_PHRASE_WORDS", "check_phrase_lengths", "workers_warning"]
