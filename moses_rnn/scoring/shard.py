"""Sharded scoring under torchrun: each process scores its share of a phrase table's windows, rank 0 joins.

    torchrun --nproc-per-node N moses-rnn score TABLE -m MODEL -o OUT

`table.score_table` calls `score_shard` in a torchrun job of more than one process. See docs/scoring.md for
how a table is split (byte offsets of a plain file; windows of a gzip stream) and why the output is
byte-identical to a single process's.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
from tqdm import tqdm

from mtcommon.errors import UserError
from mtcommon.runtime import Distributed
from mtcommon.textio import InputError, after_newlines, count_lines, count_newlines, is_gzip, iter_line_blocks
from mtcommon.outputs import atomic_output, remove_stale_temporaries, sibling_temporary

from ..formats.phrasetable import Window
from .pool import WindowPool
from .scorer import PhraseScorer
from .window import TableJob


class _Board:
    """Messages between the processes of a sharded run, through the key-value store of torchrun's
    rendezvous (the store the process group was started from).

    Only the store, no collective: a process that finishes its shard early polls for the others
    without running into a collective's timeout (30 minutes for gloo, 10 for NCCL's watchdog), however
    long the slowest shard takes. Keys carry torchrun's restart count, so a restarted job never reads
    the messages of the attempt before.
    """

    def __init__(self, dist: Distributed, poll: float = 0.1):
        import torch.distributed as tdist

        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.store = tdist.PrefixStore(f"moses-rnn-score/{restart}/", tdist.distributed_c10d._get_default_store())
        self.rank, self.world, self.poll = dist.rank, dist.world, poll

    def post(self, key: str, value) -> None:
        self.store.set(f"{key}/{self.rank}", json.dumps(value))

    def gather(self, key: str, unless_aborted: bool = False) -> list:
        """Every process's `post(key, ...)`, in rank order, once all have posted; with
        `unless_aborted`, raises `_Stopped` when a process raises the abort flag first."""
        keys = [f"{key}/{r}" for r in range(self.world)]
        while not self.store.check(keys):
            if unless_aborted and self.flag("abort"):
                raise _Stopped
            time.sleep(self.poll)
        return [json.loads(self.store.get(k)) for k in keys]

    def add_up(self, values: list[float]) -> list[float]:
        """Element-wise sum of every process's `values`; each process calls it once in a run (one key)."""
        self.post("add-up", values)
        return [sum(column) for column in zip(*self.gather("add-up", unless_aborted=True))]

    def wait(self, key: str, rank: int = 0):
        """Process `rank`'s `post(key, ...)`, once posted."""
        while not self.store.check([f"{key}/{rank}"]):
            time.sleep(self.poll)
        return json.loads(self.store.get(f"{key}/{rank}"))

    def raise_flag(self, key: str) -> None:
        self.store.set(key, "1")

    def flag(self, key: str) -> bool:
        return self.store.check([key])


class _Stopped(Exception):
    """Another process of the sharded run failed: this one stops."""


@dataclass
class _Shard:
    """Which windows of the table one process scores.

    Windows are those of the single-process run (lines k*W+1 .. (k+1)*W), so every line is scored in
    the same batch as there and the output is the same bytes. A plain table is cut by byte offset:
    process r takes the lines from the first window boundary after byte r*size/N to the first one
    after byte (r+1)*size/N (the processes count the newlines of their byte ranges once, in parallel,
    and exchange the counts to place the boundaries; that count is also the input's line count). A
    gzip stream cannot be entered in the middle, so every process decompresses all of it and scores
    windows k with k mod N = r (and so counts all its lines).
    """

    blocks: Iterator[tuple[int, bytes]]
    total_lines: Callable[[], int]  # the input's line count (for gzip: known once the blocks are exhausted)


def _plan_shard(table: str, window: int, board: _Board) -> _Shard:
    rank, world = board.rank, board.world
    if is_gzip(table):
        seen = [0]

        def windows_of_this_rank():
            for first, data in iter_line_blocks(table, window):
                seen[0] += count_lines(data)
                if ((first - 1) // window) % world == rank:
                    yield first, data

        return _Shard(windows_of_this_rank(), lambda: seen[0])
    size = os.path.getsize(table)
    cut = [r * size // world for r in range(world + 1)]
    board.post("newlines", count_newlines(table, cut[rank], cut[rank + 1]))
    counts = board.gather("newlines", unless_aborted=True)
    before = np.concatenate([[0], np.cumsum(counts)]).tolist()  # newlines before byte cut[r]
    total = before[-1]
    if size:
        with open(table, "rb") as f:
            f.seek(size - 1)
            total += f.read(1) != b"\n"  # a last line without its newline

    def boundary(r: int) -> int:
        """Index (0-based) of process r's first line: the first window start after the cut's line."""
        if r == 0:
            return 0
        if r == world:
            return total
        return min(total, (before[r] // window + 1) * window)

    lo, hi = boundary(rank), boundary(rank + 1)
    # line `lo` starts after the (lo - before[rank])-th newline at or after the cut (lo > before[rank])
    start = 0 if lo == 0 else after_newlines(table, cut[rank], lo - before[rank])
    blocks = iter_line_blocks(table, window, start=start, first_line=lo + 1, max_lines=hi - lo) if hi > lo else iter(())
    return _Shard(blocks, lambda: total)


def score_shard(scorer: PhraseScorer, prologue: Callable[..., tuple[TableJob, Window, Iterator[tuple[int, bytes]]]],
                table: str, output: str, window: int, workers: int, progress: bool,
                dist: Distributed) -> tuple[int, int]:
    """This process's part of a sharded run of `table.score_table` (see `_Shard` for the split): returns the
    lines written and the distinct sources scored, by all processes on rank 0, by this one elsewhere.

    Every process runs the `prologue` of every run (`prologue(combine)`: the job and the parsed first window,
    `--dtype auto` settled with the probe's times added up over the processes); rank 0, whose share begins
    with that window, scores it without reading it again.

    Each process writes its windows to a part file beside the output and posts
    its status; rank 0 waits for all, checks that the windows cover the table
    in order and that their lines add up to the input's line count, and copies
    the parts, in order, into the atomic output (compressed as a single-process
    run would be). A process that fails raises a flag the others check after
    every window; all then stop, rank 0 reports the first error (an `InputError`
    names the file and line as a single process would) and no output is
    written. A process that dies outright is torchrun's to handle: it stops the
    others, whose temporaries are removed on the way out, with the parts of
    processes already gone (the killed one's). Every process also removes, as
    it starts, the parts and temporaries of `output` that no live process owns
    (those of earlier runs killed outright), so failed runs leave nothing
    behind for long.
    """
    if table == "-" or output == "-":
        raise UserError("sharded scoring (torchrun) needs a table file and an output file, not '-'")
    if not os.path.isfile(table):  # every process reads the table, by byte offsets: a pipe cannot be shared
        raise UserError(f"{table}: sharded scoring (torchrun) needs a table file, not a pipe")
    board = _Board(dist)
    folder, name = os.path.dirname(os.path.abspath(output)), os.path.basename(output)
    remove_stale_temporaries(folder, name)  # parts of earlier runs killed outright
    part = sibling_temporary(output, f"part{dist.rank}")
    windows: list[tuple[int, int, int]] = []  # (window index, bytes, lines) of this process's part
    sources = 0
    status: dict = {"ok": True}
    interrupted = False
    try:
        try:
            job, head, rest = prologue(board.add_up)
            rest.close()  # each process reads its own share
            shard = _plan_shard(table, window, board)
            blocks = shard.blocks
            if dist.rank == 0:  # its share begins with the first window
                first, data = next(blocks)
                if (first, len(data)) != (head.first_lineno, len(head.data)):
                    raise RuntimeError(f"{table}: rank 0's share does not begin with the first window")
            else:
                head = None
            desc = f"scoring (rank 0 of {dist.world})"
            with open(part, "wb") as sink, WindowPool(scorer, job, workers) as pool, \
                    tqdm(unit=" pairs", unit_scale=True, disable=not (progress and dist.is_main),
                         dynamic_ncols=True, desc=desc) as bar:
                for first, (text, n, distinct) in pool.results(head, blocks):
                    sink.write(text)
                    windows.append(((first - 1) // window, len(text), n))
                    sources += distinct
                    bar.update(n)
                    if board.flag("abort"):
                        raise _Stopped
            status.update(lines=sum(w[2] for w in windows), total=shard.total_lines(), windows=windows,
                          sources=sources, part=part)
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C, SIGTERM (torchrun stopping us): no waiting
            interrupted = True
            board.raise_flag("abort")
            raise
        except _Stopped:
            status = {"ok": False, "aborted": True}
        except Exception as e:
            board.raise_flag("abort")
            status = {"ok": False, "error": str(e) or type(e).__name__}
            if isinstance(e, InputError):
                status.update(path=e.path, lineno=e.lineno, message=e.message)
        board.post("status", status)
        if dist.is_main:
            statuses = board.gather("status")
            lines = _join_parts(statuses, output, window)
            sources = sum(st["sources"] for st in statuses)
            board.post("verdict", {"ok": True})
        else:
            verdict = board.wait("verdict")
            if not verdict["ok"]:
                raise ChildProcessError(f"rank {dist.rank}: stopped; {verdict['error']}")
            lines = status["lines"]
    except BaseException as e:
        interrupted = interrupted or isinstance(e, (KeyboardInterrupt, SystemExit))
        if dist.is_main and not interrupted:
            with suppress(Exception):
                board.post("verdict", {"ok": False, "error": str(e) or type(e).__name__})
        with suppress(Exception):  # never in the way of the error itself
            remove_stale_temporaries(folder, name)  # the parts of processes that died outright (kill -9, OOM)
        raise
    finally:
        with suppress(FileNotFoundError):
            os.unlink(part)
        if not interrupted:
            with suppress(Exception):  # rank 0 leaves last: it may be the store's host
                board.post("bye", 1)
                if dist.is_main:
                    board.gather("bye")
    return lines, sources


def _join_parts(statuses: list[dict], output: str, window: int) -> int:
    """Rank 0: check the processes' statuses and copy their parts into `output` in table order."""
    failed = [(r, s) for r, s in enumerate(statuses) if not s["ok"] and not s.get("aborted")]
    if failed:
        firsts = sorted(failed, key=lambda rs: (rs[1].get("lineno") is None, rs[1].get("lineno") or 0, rs[0]))
        r, s = firsts[0]
        if "message" in s:
            raise InputError(s["path"], s["lineno"], s["message"])
        raise ChildProcessError(f"rank {r} failed: {s['error']}")
    if any(not s["ok"] for s in statuses):
        raise ChildProcessError("sharded scoring stopped: a process was interrupted")
    pieces = sorted((k, r, nbytes, n) for r, s in enumerate(statuses) for k, nbytes, n in s["windows"])
    total = statuses[0]["total"]
    lines = sum(p[3] for p in pieces)
    if [p[0] for p in pieces] != list(range(len(pieces))) or any(p[3] != window for p in pieces[:-1]):
        raise RuntimeError(f"{output}: the shards' windows do not tile the table")
    if lines != total:
        raise RuntimeError(f"{output}: the shards wrote {lines} lines for {total} input lines")
    with ExitStack() as stack:
        parts = [stack.enter_context(open(s["part"], "rb")) for s in statuses]  # opened before any clean-up
        with atomic_output(output) as stream:
            for _, r, nbytes, _ in pieces:
                while nbytes > 0:
                    data = parts[r].read(min(nbytes, 1 << 22))
                    if not data:
                        raise RuntimeError(f"{output}: part of rank {r} is shorter than reported")
                    stream.write(data)
                    nbytes -= len(data)
    return lines

