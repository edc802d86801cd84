"""What `cslm serve` reports: its counters (the STATS reply), its start-up and shutdown lines, and its
rate-limited log on stderr."""

from __future__ import annotations

import asyncio
import collections
import sys
import time

import numpy as np

from . import protocol as P

REQUEST_NAMES = {P.HELLO: "hello", P.SCORE: "score", P.SCORE_TEXT: "score_text", P.LOOKUP: "lookup",
                 P.VOCAB: "vocab", P.STATS: "stats"}


class Stats:
    def __init__(self):
        self.started = time.time()
        self.requests: collections.Counter = collections.Counter()
        self.ngrams = 0
        self.batches = 0
        self.batch_ngrams_total = 0
        self.batch_ngrams_max = 0
        self.batch_requests_total = 0
        self.cache_hits = 0
        self.cache_misses = 0
        self.errors = 0
        self.connections_open = 0
        self.connections_total = 0
        self.connections_evicted = 0  # closed to make room (connection limit, descriptor shortage)
        self.connections_refused = 0  # new ones refused: at the limit with every connection busy
        self.connections_stalled = 0  # closed for a frame or a reply that did not move within --frame-timeout
        self.latencies: collections.deque = collections.deque(maxlen=10000)  # seconds, score requests
        self.computes: collections.deque = collections.deque(maxlen=10000)  # seconds, each batch's scoring

    def to_dict(self, cache_len: int, cache_cap: int, max_connections: int = 0, buffered: dict | None = None) -> dict:
        return {
            "uptime_s": round(time.time() - self.started, 1),
            "requests": sum(self.requests.values()),
            "requests_by_type": {REQUEST_NAMES.get(t, str(t)): n for t, n in self.requests.items()},
            "ngrams": self.ngrams,
            "batches": self.batches,
            "batch_ngrams": {
                "mean": round(self.batch_ngrams_total / max(self.batches, 1), 1),
                "max": self.batch_ngrams_max,
                "requests_per_batch": round(self.batch_requests_total / max(self.batches, 1), 2),
            },
            "cache": {"hits": self.cache_hits, "misses": self.cache_misses, "size": cache_len, "capacity": cache_cap},
            # a score request's, from its payload read to its reply written; of that, its batch's scoring
            "latency_ms": _percentiles(self.latencies),
            "compute_ms": _percentiles(self.computes),
            "errors": self.errors,
            "connections": {"open": self.connections_open, "total": self.connections_total},
            "connection_limit": {"max": max_connections, "evicted": self.connections_evicted,
                                 "refused": self.connections_refused},
            "stalled": self.connections_stalled,
            "buffered_bytes": buffered or {},
        }


def _percentiles(seconds: collections.deque) -> dict:
    """p50, p90, p99 and max in milliseconds of the last `window` values."""
    ms = np.array(seconds) * 1e3 if seconds else np.zeros(1)
    return {**{f"p{q}": round(float(np.percentile(ms, q)), 3) for q in (50, 90, 99)},
            "max": round(float(ms.max()), 3), "window": len(seconds)}


class RateLimitedLog:
    """Lines about events on stderr, at most one per kind of event every `interval` seconds.

    The first event of a kind is written at once; those that follow within the interval are held back and
    counted, and at its end one line reports them: the last one's message with "(N more like this in the
    last T s)". A flood of errors (a descriptor shortage fails accept() thousands of times a second) thus
    costs a line per interval, not megabytes. Used on the event loop's thread only.
    """

    def __init__(self, interval: float = 10.0, stream=None):
        self.interval, self.stream = interval, stream
        self.last: dict[str, float] = {}  # kind -> when its last line was written
        self.held: dict[str, list] = {}  # kind -> [count, latest message]
        self.timers: dict[str, asyncio.TimerHandle] = {}

    def event(self, kind: str, message: str, detail: str = "") -> None:
        """Report `message` (one line; `detail`, e.g. a traceback, follows it) unless a line of `kind` was
        written less than `interval` seconds ago."""
        now = time.monotonic()
        last = self.last.get(kind)
        if last is None or now - last >= self.interval:
            held = self.held.pop(kind, None)
            self._write(message + (f" ({held[0]} more like this before)" if held else ""), detail)
            self.last[kind] = now
            return
        held = self.held.setdefault(kind, [0, message])
        held[0] += 1
        held[1] = message
        if kind not in self.timers:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop: reported with the next line of its kind, or at close()
                return
            self.timers[kind] = loop.call_later(last + self.interval - now, self._flush, kind)

    def _flush(self, kind: str) -> None:
        self.timers.pop(kind, None)
        held = self.held.pop(kind, None)
        if held:
            count, message = held
            now = time.monotonic()
            elapsed = now - self.last[kind]
            self._write(f"{message} ({count} more like this in the last {elapsed:.{0 if elapsed >= 10 else 1}f} s)")
            self.last[kind] = now

    def close(self) -> None:
        """Report what is still held back, now."""
        for kind in list(self.held):
            timer = self.timers.pop(kind, None)
            if timer is not None:
                timer.cancel()
            self._flush(kind)

    def _write(self, line: str, detail: str = "") -> None:
        stream = self.stream or sys.stderr
        stream.write(line + "\n" + detail)
        stream.flush()


def startup_message(engine, host: str, port: int, name: str | None = None) -> str:
    """The line `cslm serve` prints once listening."""
    what = f" {name}" if name else ""
    scores = "" if engine.normalized else \
        "; self-normalized scores o_w, no softmax: log-probabilities only if the model was trained with --self-norm"
    native, graphs = engine.native, engine.graphs
    device = f"device {engine.device}"
    if native is not None:
        layers = f", {native.precision} layers after the first" if native.precision != "fp32" else ""
        device += f", the C++ evaluator ({native.kernels} kernels{layers})"
    if graphs is not None:
        device += f", CUDA graphs of {len(graphs.sizes)} batch sizes up to {graphs.sizes[-1]}"
    return (f"cslm: serving{what} on {host}:{port} (order {engine.order}, {len(engine.vocab)} words, "
            f"mode {engine.mode}, {device}{scores})")


def shutdown_summary(stats: dict) -> str:
    """The line `cslm serve` prints at shutdown: traffic, cache share and latency, from `Server.stats_dict()`."""
    by_type = stats["requests_by_type"]
    score = by_type.get("score", 0) + by_type.get("score_text", 0)
    looked = stats["cache"]["hits"] + stats["cache"]["misses"]
    hits = f", {100 * stats['cache']['hits'] / looked:.0f}% from the cache" if looked else ""
    history = stats.get("history_cache", {})
    seen = history.get("hits", 0) + history.get("misses", 0)
    if seen:
        hits += f", {100 * history['hits'] / seen:.0f}% of {seen} histories from the history cache"
    return (f"cslm: server stopped after {stats['uptime_s']:.0f} s: {score} score requests, {stats['ngrams']} n-grams"
            f"{hits}, {stats['connections']['total']} connections; latency p50 {stats['latency_ms']['p50']} ms, "
            f"p99 {stats['latency_ms']['p99']} ms")
