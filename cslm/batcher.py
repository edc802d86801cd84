"""Scores the requests of every connection in shared engine calls, taking turns between connections, behind
an n-gram cache.

The batcher takes the oldest waiting request, then keeps collecting for at most `max_delay` seconds or until
`max_batch` n-grams are waiting (or `full_batch`, where a larger batch costs the scorer as much per n-gram),
and not at all once every attached connection has a request waiting (a lone decoder thread never waits). A
batch is filled in turns: each connection with work gives one slice of its oldest request (as much of it as
the batch has room for), then the next connection, round and round; the turn passes on from batch to batch,
so a connection that sends a flood of large requests gets a batch's share, not the whole engine, and another
connection's request is scored within the next batch or two. A request split over several batches is
answered once its last slice is scored.

Each batch is one `Engine.score_rows` call: in a worker thread, or on the loop's own thread for at most
`inline_rows` n-grams: INLINE_ROWS, where the thread hop would cost more than the work, or, with the C++
evaluator, whose own threads share out a call's rows, INLINE_FULL_BATCHES full batches (on 2 threads 5 ms of
the `small` model's work, 36 ms of the paper-size one's).
While the worker computes, new requests queue up and form the next batch, so under load batches fill without
waiting.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .ngram_cache import NgramCache
from .stats import Stats

# Batches of at most this many n-grams are scored on the event loop's thread (about 0.1 ms on the CPU);
# larger ones in the worker thread, so that reading new requests overlaps the forward pass.
INLINE_ROWS = 64
# ... and with the C++ evaluator, batches of up to this many full batches: its threads hold the cores while it
# scores, and the hop to the worker thread and back (waking the loop through its self-pipe, the GIL changing
# hands) cost the server more than the reading of new requests that it lets overlap.
INLINE_FULL_BATCHES = 4


class CachedScorer:
    """Engine.score_rows behind an n-gram cache (cslm.ngram_cache: a set-associative table looked up and filled
    a whole request at a time); hits skip the network's forward pass. Called by the batcher only, one call at
    a time."""

    def __init__(self, engine, capacity: int, stats: Stats):
        self.engine, self.stats = engine, stats
        self.cache = NgramCache(capacity) if capacity else None

    def __len__(self) -> int:
        """N-grams the cache holds."""
        return len(self.cache) if self.cache is not None else 0

    def __call__(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.cache is None:
            return self.engine.score_rows(rows)
        found, logp, flags, hashes = self.cache.lookup(rows)
        miss = np.flatnonzero(~found)
        self.stats.cache_hits += len(rows) - len(miss)
        self.stats.cache_misses += len(miss)
        if len(miss):
            missed = np.ascontiguousarray(rows[miss])
            lp, fl = self.engine.score_rows(missed)
            logp[miss], flags[miss] = lp, fl
            self.cache.insert(missed, hashes[miss], lp, fl)
        return logp, flags


class Alarm:
    """Sets an asyncio.Event at a deadline (time.monotonic()) without spinning, to a fraction of a millisecond.

    The event loop's own timers round up to epoll's millisecond, five times the default batching delay; a
    thread waiting on a condition variable does not. One deadline at a time: a new one replaces the last.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, event: asyncio.Event):
        self.loop, self.event = loop, event
        self.cond = threading.Condition()
        self.deadline: float | None = None
        self.closed = False
        self.thread = threading.Thread(target=self._run, name="cslm-batch-alarm", daemon=True)
        self.thread.start()

    def ring_at(self, deadline: float) -> None:
        with self.cond:
            self.deadline = deadline
            self.cond.notify()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify()
        self.thread.join()

    def _run(self) -> None:
        with self.cond:
            while not self.closed:
                if self.deadline is None:
                    self.cond.wait()
                    continue
                left = self.deadline - time.monotonic()
                if left > 0:
                    self.cond.wait(left)
                    continue
                self.deadline = None
                try:
                    self.loop.call_soon_threadsafe(self.event.set)
                except RuntimeError:  # the loop is closed: nobody waits any more
                    return


class Request:
    """One score request: padded rows in, (log-probs, flags) out through `future`, possibly in slices."""

    __slots__ = ("rows", "future", "taken", "scored", "logp", "flags")

    def __init__(self, rows: np.ndarray, future: asyncio.Future):
        self.rows, self.future = rows, future
        self.taken = 0  # rows handed to a batch
        self.scored = 0  # rows whose scores are back
        self.logp: np.ndarray | None = None  # gathered here when the request is split over batches
        self.flags: np.ndarray | None = None


class Batcher:
    def __init__(self, scorer, max_batch: int, max_delay: float, stats: Stats, full_batch: int | None = None):
        self.scorer, self.max_batch, self.max_delay, self.stats = scorer, max_batch, max_delay, stats
        # rows past which a larger batch is no cheaper per row (the C++ evaluator's, once every thread has a
        # part), where the scorer has such a size; None: every row more helps (torch), up to max_batch
        self.full_batch = min(max_batch, full_batch) if full_batch else None
        # the largest batch scored on the loop's own thread
        self.inline_rows = INLINE_ROWS if self.full_batch is None else \
            max(INLINE_ROWS, min(max_batch, INLINE_FULL_BATCHES * self.full_batch))
        self.queues: dict[object, collections.deque] = {}  # connection -> its waiting requests, oldest first
        self.turns: collections.deque = collections.deque()  # the connections in `queues`, next turn first
        self.attached = 0  # connections that may send requests
        self.waiting = 0  # rows not yet handed to a batch
        self.wakeup = asyncio.Event()
        self.alarm = Alarm(asyncio.get_running_loop(), self.wakeup) if max_delay > 0 else None
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cslm-engine")
        self.task: asyncio.Task | None = None
        self.stopping = False
        self.computing = False  # a batch is being scored (in the worker thread, or on the loop's)

    # -- what the server tells it -------------------------------------------
    def attach(self) -> None:
        """A connection opened: batches may wait for its requests."""
        self.attached += 1

    def detach(self) -> None:
        """A connection closed: no batch waits for it any more."""
        self.attached -= 1
        self.wakeup.set()

    def submit(self, rows: np.ndarray, owner: object) -> asyncio.Future:
        """Queue padded `rows` from connection `owner`; the future gets (log-probs, flags)."""
        fut = asyncio.get_running_loop().create_future()
        if not len(rows):
            fut.set_result((np.empty(0, np.float32), np.zeros(0, np.uint8)))
            return fut
        queue = self.queues.get(owner)
        if queue is None:
            queue = self.queues[owner] = collections.deque()
            self.turns.append(owner)
        queue.append(Request(rows, fut))
        self.waiting += len(rows)
        self.wakeup.set()
        return fut

    def free(self) -> bool:
        """Nothing waiting, nothing being scored, not stopping: a new request would be the next batch alone."""
        return not self.turns and not self.computing and not self.stopping

    def idle(self) -> bool:
        """Whether a new request would be scored at once, alone: `free`, and no other connection whose
        request a batch would wait for (`_should_wait`). Such a request may be scored on the caller's thread
        (`score_now`), with the same result and less bookkeeping."""
        return self.free() and (self.attached <= 1 or self.max_delay <= 0)

    def takes_now(self, rows: int) -> bool:
        """Whether a request of `rows` n-grams is scored on the caller's thread (`score_now`): when the batcher
        would score it at once and alone, as one batch of at most `inline_rows` (milliseconds, during which
        other connections' requests wait to be read): `idle`, or `free` with the request a full batch already
        (`full_batch`, where the scorer gives one), for which no batch would wait."""
        if rows > self.inline_rows:
            return False
        if self.full_batch is not None and rows >= self.full_batch:
            return self.free()
        return self.idle()

    def score_now(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Score `rows` on the caller's thread, as one batch: the server's fast path for a small request
        that finds the batcher `idle` (no other request to batch with, none to wait behind)."""
        self.computing = True
        try:
            logp, flags, seconds = self._timed(rows)
        finally:
            self.computing = False
        self._count(len(rows), 1, seconds)
        return logp, flags

    def _timed(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """The scorer's answer for `rows`, and the seconds it took (on the thread that calls it)."""
        t0 = time.perf_counter()
        logp, flags = self.scorer(rows)
        return logp, flags, time.perf_counter() - t0

    def _count(self, ngrams: int, requests: int, seconds: float) -> None:
        self.stats.computes.append(seconds)
        self.stats.batches += 1
        self.stats.batch_ngrams_total += ngrams
        self.stats.batch_ngrams_max = max(self.stats.batch_ngrams_max, ngrams)
        self.stats.batch_requests_total += requests

    def stop(self) -> None:
        """Score what is queued, then end `run`."""
        self.stopping = True
        self.wakeup.set()

    def close(self) -> None:
        if self.alarm is not None:
            self.alarm.close()
        self.pool.shutdown(wait=True)

    # -- the loop -------------------------------------------------------------
    def _should_wait(self, deadline: float) -> bool:
        """Whether others may still join, and it pays: a batch not yet full (`full_batch`), a connection with
        nothing waiting, time left."""
        return (self.waiting < (self.full_batch or self.max_batch) and len(self.turns) < self.attached
                and not self.stopping and time.monotonic() < deadline)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = None
        while True:
            if not self.turns:
                if self.stopping:
                    return
                deadline = None
                self.wakeup.clear()
                await self.wakeup.wait()
                continue
            if deadline is None:
                deadline = time.monotonic() + self.max_delay
            if self._should_wait(deadline):
                self.wakeup.clear()
                self.alarm.ring_at(deadline)
                await self.wakeup.wait()  # a new request, a connection gone, or the deadline
                continue
            deadline = None
            await self._score_batch(self._take(), loop)

    async def _score_batch(self, batch: list[tuple[Request, int, int]], loop: asyncio.AbstractEventLoop) -> None:
        """Score one batch (`_take`) and hand each request its scores. Its own frame: the batch's requests,
        rows and scores are no longer held once it returns (`run` waits for the next with none of them)."""
        if not batch:
            return
        total = sum(stop - start for _, start, stop in batch)
        req, start, stop = batch[0]
        rows = req.rows[start:stop] if len(batch) == 1 else np.concatenate([r.rows[a:b] for r, a, b in batch])
        self.computing = True
        try:
            if total <= self.inline_rows:  # a thread hop would cost more than it saves
                logp, flags, seconds = self._timed(rows)
            else:
                logp, flags, seconds = await loop.run_in_executor(self.pool, self._timed, rows)
        except Exception as e:  # surfaces as an INTERNAL error on each request
            for r, _, _ in batch:
                if not r.future.done():
                    r.future.set_exception(e)
            return
        finally:
            self.computing = False
        self._count(total, len(batch), seconds)
        self._hand_back(batch, logp, flags)

    def _take(self) -> list[tuple[Request, int, int]]:
        """Up to max_batch rows, one slice per connection per turn: [(request, first row, end row)]."""
        room, batch = self.max_batch, []
        while room and self.turns:
            owner = self.turns.popleft()
            queue = self.queues[owner]
            req = queue[0]
            left = len(req.rows) - req.taken
            if req.future.done():  # failed in an earlier slice, or its connection went away
                queue.popleft()
                self.waiting -= left
            else:
                n = min(left, room)
                batch.append((req, req.taken, req.taken + n))
                req.taken += n
                room -= n
                self.waiting -= n
                if req.taken == len(req.rows):
                    queue.popleft()
            if queue:
                self.turns.append(owner)
            else:
                del self.queues[owner]
        return batch

    @staticmethod
    def _hand_back(batch, logp: np.ndarray, flags: np.ndarray) -> None:
        at = 0
        for req, start, stop in batch:
            n = stop - start
            lp, fl = logp[at : at + n], flags[at : at + n]
            at += n
            if req.future.done():
                continue
            if n == len(req.rows):  # the whole request in this batch
                req.future.set_result((lp, fl))
                continue
            if req.logp is None:
                req.logp, req.flags = np.empty(len(req.rows), np.float32), np.empty(len(req.rows), np.uint8)
            req.logp[start:stop], req.flags[start:stop] = lp, fl
            req.scored += n
            if req.scored == len(req.rows):
                req.future.set_result((req.logp, req.flags))
