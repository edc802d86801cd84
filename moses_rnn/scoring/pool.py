"""Scoring a stream of table windows with several processes, this one included, results in table order.

The worker processes are plain child processes that talk to this one over two pipes each (pickled windows in,
pickled results out), not a multiprocessing pool: multiprocessing's queues hold POSIX semaphores, which its
resource tracker, a process of its own, must clean up; a closed terminal (SIGHUP to the process group) kills
that tracker mid-run, and a kill -9 of this process leaves it the semaphores to report as leaked.
"""

from __future__ import annotations

import json
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import traceback
from collections import deque
from multiprocessing.connection import Connection
from typing import Iterator

import torch

from mtcommon.allocator import reuse_freed_memory
from mtcommon.runtime import exit_with_parent

from ..formats.phrasetable import Window
from ..networks.modelio import load_vocabularies, read_config
from .plan import Planner, ScoringPlan
from .scorer import PhraseScorer
from .window import TableJob, format_window, parse_checked, plan_window, rewrite_lines, rewrite_window

WORKER_TAG = "moses-rnn-scoring-worker"  # in a worker's command line, so that `ps` tells what it is

# A worker's command: the parent's sys.path first (as multiprocessing's spawn does), so that it imports the
# project the parent imported, wherever that came from.
_WORKER_BOOT = ("import json, sys; sys.path[:] = json.loads(sys.argv[2]); "
                "from moses_rnn.scoring.pool import worker_main; worker_main(*sys.argv[3:])")

WINDOWS_PER_WORKER = 2  # windows a worker holds at most: one scored, one waiting, so it never idles


class _Failed:
    """An exception met scoring a window, raised when that window's turn comes."""

    def __init__(self, exc: BaseException):
        self.exc = exc


class _WorkerTraceback(Exception):
    """The traceback of an exception raised in a worker process, attached to it as its cause."""

    def __str__(self) -> str:
        return "\n\n" + self.args[0]


class _Reply:
    """A window sent to a worker: `value` is None until the worker's reply has been read."""

    __slots__ = ("worker", "value")

    def __init__(self, worker: "_Worker"):
        self.worker, self.value = worker, None


def _dump_reply(value) -> bytes:
    """A worker's reply: (True, result) or (False, (exception, its traceback)); an exception that cannot be
    pickled goes as a RuntimeError with its text."""
    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        exc, text = value[1]
        return pickle.dumps((False, (RuntimeError(f"{type(exc).__name__}: {exc}"), text)))


def _planner(model_dir: str, token_budget: int, node_chunk: int) -> Planner:
    """A planner for the model of `model_dir`, from its vocabularies alone (no weights, no device)."""
    cfg, _ = read_config(model_dir)
    return Planner(*load_vocabularies(model_dir, cfg), token_budget, node_chunk)


def worker_main(parent: str, requests_fd: str, replies_fd: str) -> None:
    """A worker process: its first message says how to load the model and which table it scores; each later
    one is a window of raw lines, answered with the rewritten window (`window.rewrite_lines`) or the exception
    met. A planning worker gets two kinds: ("plan", first line, raw lines), answered with the window's plan
    (`window.plan_window`; the window is kept), and ("format", first line, log p), the device's scores of
    that plan, answered with the rewritten window (`window.format_window`). It ends when the parent closes
    its request pipe, and dies with the parent (`exit_with_parent`).

    Ctrl-C and a closed terminal (SIGINT, SIGHUP, sent to the whole process group) are left to the parent, which
    stops its workers. A thread takes each request as soon as it comes, so the parent never blocks sending a
    window while this process blocks sending the reply to an earlier one."""
    exit_with_parent(int(parent))
    reuse_freed_memory()
    for sig in ("SIGINT", "SIGHUP"):
        if hasattr(signal, sig):
            signal.signal(getattr(signal, sig), signal.SIG_IGN)
    requests = Connection(int(requests_fd), writable=False)
    replies = Connection(int(replies_fd), readable=False)
    inbox: queue.SimpleQueue = queue.SimpleQueue()

    def take_requests() -> None:
        try:
            while True:
                inbox.put(requests.recv_bytes())
        except (EOFError, OSError):
            inbox.put(None)

    threading.Thread(target=take_requests, name="requests", daemon=True).start()
    setup = inbox.get()
    if setup is None:
        return
    model_dir, device, token_budget, node_chunk, dtype, job, planning = pickle.loads(setup)
    torch.set_num_threads(1)
    try:
        if planning:
            planner, failure = _planner(model_dir, token_budget, node_chunk), None
        else:
            scorer, failure = PhraseScorer.from_dir(model_dir, device=device, token_budget=token_budget,
                                                    node_chunk=node_chunk, dtype=dtype), None
    except Exception as e:  # every window is answered with it
        failure = e
    held = {}  # planning: the windows planned and not yet formatted, by first line
    while (request := inbox.get()) is not None:
        try:
            if failure is not None:
                raise failure
            if not planning:
                reply = (True, rewrite_lines(scorer, job, *pickle.loads(request)))
            elif (message := pickle.loads(request))[0] == "plan":
                planned = held[message[1]] = plan_window(planner, parse_checked(job, *message[1:]))
                reply = (True, planned.plan)
            else:
                reply = (True, format_window(job, model_dir, held.pop(message[1]), message[2]))
        except Exception as e:
            reply = (False, (e, traceback.format_exc()))
        replies.send_bytes(_dump_reply(reply))


_STDERR = 2  # the descriptor, whatever object sys.stderr is (under click's test runner, not a file)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


class _Worker:
    """The parent's end of one worker process: the process, its two pipes, and the windows sent to it whose
    replies are not read yet, in the order sent (the order it answers in)."""

    def __init__(self, setup: bytes, path: str):
        self.path = path
        child_requests, self_requests = os.pipe()
        self_replies, child_replies = os.pipe()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _WORKER_BOOT, WORKER_TAG, json.dumps(sys.path), str(os.getpid()),
                 str(child_requests), str(child_replies)],
                pass_fds=(child_requests, child_replies), stdin=subprocess.DEVNULL,
                stdout=_STDERR if _is_open(_STDERR) else subprocess.DEVNULL)  # never into this process's output
        finally:
            os.close(child_requests)
            os.close(child_replies)
        self.requests = Connection(self_requests, readable=False)
        self.replies = Connection(self_replies, writable=False)
        self.waiting: deque[_Reply] = deque()
        try:
            self._send(setup)
        except BaseException:
            self.stop()
            raise

    def _died(self) -> ChildProcessError:
        # an OSError, so that the command line reports it in one line
        return ChildProcessError(f"{self.path}: a scoring worker process died (killed, or out of memory?); "
                                 f"try fewer --workers")

    def _send(self, message: bytes) -> None:
        try:
            self.requests.send_bytes(message)
        except OSError:
            raise self._died() from None

    def send(self, *message) -> _Reply:
        reply = _Reply(self)
        self._send(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        self.waiting.append(reply)
        return reply

    def read_replies(self, until: _Reply | None = None) -> None:
        """Read the replies that have arrived, or with `until`, every reply up to that one, waiting for them."""
        while self.waiting and ((until is not None and until.value is None) or self.replies.poll(0)):
            try:
                ok, value = pickle.loads(self.replies.recv_bytes())
            except (EOFError, OSError):
                raise self._died() from None
            if not ok:
                exc, text = value
                exc.__cause__ = _WorkerTraceback(text)
                value = _Failed(exc)
            self.waiting.popleft().value = value

    def stop(self) -> None:
        """End the process at once: by then its replies are read or no longer wanted, and a worker still
        loading the model would take seconds to see the end of its requests."""
        self.process.kill()
        for end in (self.requests, self.replies):
            end.close()
        self.process.wait()


class WindowPool:
    """Scores a stream of windows with `workers` processes, this one included, yielding
    (first line, result) in input order.

    With more than one, `workers - 1` worker processes take windows while they have fewer than
    `WINDOWS_PER_WORKER` each in hand, and this process scores the others itself, between reading and
    writing: so every core works from the first window on (the workers need a second or two to import torch
    and load the model), and no process idles while another has a queue.

    On a CPU each worker scores whole windows with a model of its own. With `planning` (the default on a
    GPU) the workers parse and plan windows (`window.plan_window`: the host's half, from the vocabularies
    alone) and format them once scored; this process runs every plan on the device. One process and one
    CUDA context feed the GPU, and the host work that a lone process does between its kernels (6-8 µs a
    line, docs/scoring.md, "The GPU path") is spread over cores.
    """

    def __init__(self, scorer: PhraseScorer, job: TableJob, workers: int, planning: bool | None = None):
        if workers > 1 and scorer.model_dir is None:
            raise ValueError("worker processes need a scorer loaded with PhraseScorer.from_dir")
        self.scorer, self.job, self.workers = scorer, job, workers
        self.planning = scorer.device.type != "cpu" if planning is None else planning
        self.processes: list[_Worker] = []

    def __enter__(self) -> "WindowPool":
        s = self.scorer
        setup = pickle.dumps((s.model_dir, str(s.device), s.token_budget, s.node_chunk, s.dtype, self.job,
                              self.planning))
        try:
            for _ in range(self.workers - 1):  # they load the model while this process scores the first windows
                self.processes.append(_Worker(setup, self.job.path))
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop()

    def _stop(self) -> None:
        for worker in self.processes:
            worker.stop()
        self.processes = []

    def results(self, head: Window | None, blocks) -> Iterator[tuple[int, tuple[bytes, int, int]]]:
        """The rewritten windows: `head`, a window already parsed (or None), then the raw (first line, bytes)
        `blocks` that follow it."""
        if head is not None:
            yield head.first_lineno, rewrite_window(self.scorer, self.job, head)
        if not self.processes:
            for first, data in blocks:
                yield first, rewrite_lines(self.scorer, self.job, first, data)
            return
        yield from (self._with_planners if self.planning else self._with_workers)(blocks)

    def _in_this_process(self, first: int, data: bytes):
        try:
            return rewrite_lines(self.scorer, self.job, first, data)
        except Exception as e:  # raised in its turn: an earlier window may hold an earlier error
            return _Failed(e)

    def _with_workers(self, blocks):
        most = len(self.processes) * WINDOWS_PER_WORKER + 2 * self.workers + 2  # windows held here at most
        pending: deque = deque()  # (first line, _Reply | result | _Failed), in input order

        def take():
            first, x = pending.popleft()
            if isinstance(x, _Reply):
                x.worker.read_replies(until=x)
                x = x.value
            if isinstance(x, _Failed):
                raise x.exc
            return first, x

        for first, data in blocks:
            for worker in self.processes:
                worker.read_replies()
            idlest = min(self.processes, key=lambda w: len(w.waiting))
            if len(idlest.waiting) < WINDOWS_PER_WORKER:
                pending.append((first, idlest.send(first, data)))
            else:
                pending.append((first, self._in_this_process(first, data)))
            while pending and not (isinstance(pending[0][1], _Reply) and pending[0][1].value is None):
                yield take()
            if len(pending) >= most:
                yield take()
        while pending:
            yield take()

    def _with_planners(self, blocks):
        """`results` with planning workers: a window goes to a worker to be planned ("plan"), its plan is run
        here as soon as it arrives, in table order, and its scores go back to the same worker to be formatted
        ("format"); this process rewrites a window itself when every worker has its share in hand."""
        most = len(self.processes) * WINDOWS_PER_WORKER + 2 * self.workers + 2
        pending: deque[list] = deque()  # [first line, _Reply of the plan or of the text, or the result / _Failed]

        def advance(entry: list, wait: bool) -> None:
            """Move `entry` on: a plan that has arrived (or, with `wait`, once it has) is run and sent back to
            be formatted; a text that has arrived (or, with `wait`, once it has) is its result."""
            while isinstance(reply := entry[1], _Reply):
                if reply.value is None:
                    if not wait:
                        return
                    reply.worker.read_replies(until=reply)
                if not isinstance(reply.value, ScoringPlan):  # the rewritten window, or the error met
                    entry[1] = reply.value
                    return
                try:
                    log_p = self.scorer.run(reply.value)
                except Exception as e:  # raised in its turn
                    entry[1] = _Failed(e)
                    return
                entry[1] = reply.worker.send("format", entry[0], log_p)

        def finished():
            entry = pending.popleft()
            advance(entry, wait=True)
            if isinstance(entry[1], _Failed):
                raise entry[1].exc
            return entry[0], entry[1]

        for first, data in blocks:
            for worker in self.processes:
                worker.read_replies()
            for entry in pending:  # run the plans that have arrived, in table order
                advance(entry, wait=False)
            idlest = min(self.processes, key=lambda w: len(w.waiting))
            if len(idlest.waiting) < WINDOWS_PER_WORKER:
                pending.append([first, idlest.send("plan", first, data)])
            else:
                pending.append([first, self._in_this_process(first, data)])
            while pending and not isinstance(pending[0][1], _Reply):
                yield finished()
            if len(pending) >= most:
                yield finished()
        while pending:
            yield finished()
