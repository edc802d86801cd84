"""`score_table`: rewrite a phrase table with the model's columns, in one process (with its workers) or as one
process of a torchrun job, and the set-up that chooses the device, threads and workers for it."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Iterator

import torch
from tqdm import tqdm

from mtcommon.errors import UserError
from mtcommon.runtime import Distributed, configure_threads, cpu_count, is_big, resolve_device
from mtcommon.textio import count_lines, iter_line_blocks
from mtcommon.outputs import atomic_output

from ..formats.phrasetable import Window
from .pool import WindowPool
from .scorer import PhraseScorer
from .shard import score_shard
from .window import MAX_PHRASE_WORDS, TableJob, first_window


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
                  workers: int | None = None, token_budget: int | None = None, dtype: str = "fp32",
                  dist: Distributed | None = None) -> ScoringSetup:
    """Load the model of `model_dir` for scoring `table`, choosing what is not given.

    The device ('auto': CUDA when available; under torchrun, cuda:LOCAL_RANK),
    torch's CPU threads (`configure_threads`: by model size; under torchrun the
    processes of a machine share its cores), the worker processes
    (`default_workers`), the encoder's token budget (`scorer.device_sizes`) and the compute dtype
    (`runtime.amp_dtype`; 'auto' is settled on the table's first window by `score_table`). `moses-rnn
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


# Processes beside a GPU's: each plans and formats 120,000-180,000 lines/s of the shared table (2-core Intel
# Xeon, one thread), and the process that runs the plans spends 0.5-0.9 µs a line on the host besides its
# kernels with a GPU's windows (benchmarks/bench_score_host.py, docs/scoring.md), so a few keep it fed.
GPU_WORKERS = 8


def default_workers(device: torch.device, config, table: str) -> int:
    """Worker processes for `score_table`, this one included, once the table is large enough (> 8 MB on
    disk) to repay their start-up (importing torch and loading the model or its vocabularies); else 1.

    On CPU, models smaller than the `small` preset spend most of their time in Python (parsing, formatting),
    which one process cannot spread over cores; there each core gets a process with one torch thread. Larger
    models use one process and torch's threads. On a GPU the host's work (reading, parsing, planning,
    formatting, writing: 6-8 µs a line in one process) would set the pace, so up to `GPU_WORKERS`
    processes, one per core, plan and format windows for this one, which alone runs them
    (`pool.WindowPool`'s planning)."""
    if cpu_count() < 2 or (device.type == "cpu" and is_big(config)):
        return 1
    if table != "-" and os.path.getsize(table) < 8 << 20:
        return 1
    return cpu_count() if device.type == "cpu" else min(cpu_count(), GPU_WORKERS)


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



def _prologue(scorer: PhraseScorer, table: str, window: int, normalize: bool, unknown: bool, max_words: int,
              quiet: bool, combine=None) -> tuple[TableJob, Window, Iterator[tuple[int, bytes]]]:
    """Open `table` in windows of `window` lines, take the job from its first window (`first_window`: parsed
    once, here), and settle the scorer's `--dtype auto` on that window (`PhraseScorer.choose_dtype`; `combine`
    as there), so that worker processes are given the choice. Returns the job, the parsed first window and the
    windows after it."""
    blocks = iter_line_blocks(table, window)
    job, head = first_window(table, next(blocks, None), normalize, unknown, max_words)
    scorer.choose_dtype(head.sources, head.targets, quiet, combine)
    return job, head, blocks


def score_table(scorer: PhraseScorer, table: str, output: str, normalize: bool = False, unknown: bool = False,
                window: int | None = None, workers: int = 1, progress: bool = True, dist: Distributed | None = None,
                max_words: int = MAX_PHRASE_WORDS, planning: bool | None = None) -> ScoreStats:
    """Append the model's columns to every line of `table`, writing `output` atomically.

    The table is read in windows of `window` lines (by default the scorer's device's, `scorer.device_sizes`);
    each window is parsed, scored and formatted by one of `workers` processes (`WindowPool`): this one (with
    `workers` = 1 alone; torch uses its own threads or the GPU) and `workers` - 1 worker processes, each loading the model from `scorer.model_dir` (with `planning`,
    the default on a GPU, they only parse and plan windows and this process scores them all). Results are
    written in input order; memory is bounded by a few windows per worker, whatever the size of the table.
    Gzip decompression and compression run in their own threads. A phrase of more than `max_words` words is an
    error naming its line. In a torchrun job of more than one process (`dist`), this process scores its share
    of the windows and rank 0 joins the shares into `output` (`shard.score_shard`).
    """
    start = time.perf_counter()
    sharded = dist is not None and dist.enabled
    window = window or scorer.sizes.window

    def prologue(combine=None):
        quiet = not progress or (sharded and not dist.is_main)
        return _prologue(scorer, table, window, normalize, unknown, max_words, quiet, combine)

    if sharded:
        lines, sources = score_shard(scorer, prologue, table, output, window, workers, progress, dist)
        return ScoreStats(lines, time.perf_counter() - start, sources, workers, dist.world)
    job, head, blocks = prologue()
    read, written, sources = count_lines(head.data), 0, 0

    def counted(blocks):
        nonlocal read
        for first, data in blocks:
            read += count_lines(data)
            yield first, data

    with tqdm(unit=" pairs", unit_scale=True, disable=not progress, dynamic_ncols=True, desc="scoring") as bar:
        with atomic_output(output) as stream, WindowPool(scorer, job, workers, planning) as pool:
            for _, (text, n, distinct) in pool.results(head, counted(blocks)):
                stream.write(text)
                written += n
                sources += distinct
                bar.update(n)
            if written != read:
                raise RuntimeError(f"{output}: wrote {written} lines for {read} input lines")
    return ScoreStats(written, time.perf_counter() - start, sources, workers)
