"""`cslm serve`: an asyncio TCP server that scores n-grams for decoders (protocol: docs/cslm.md).

Dynamic batching. Every SCORE/SCORE_TEXT request, from any connection, goes
into one queue. The batcher takes the oldest request, then keeps collecting
for at most `max_delay` seconds (busy-polling the event loop, since epoll's
timer resolution is a millisecond) or until `max_batch` n-grams are waiting,
and not at all once every open connection has a request queued (a lone
decoder thread never waits);
it scores the lot with one `Engine.score_ids` call (in a worker thread, or
on the loop's own thread for a batch of at most INLINE_ROWS n-grams, where the
thread hop would cost more than the work) and hands each request its own
slice. While the worker computes, new requests queue up and form the next
batch, so under load batches fill without waiting.

An n-gram cache (FIFO eviction, keyed by the padded id n-gram) sits in front
of the engine; hits skip the network's forward pass entirely.

Robustness: frames over `max_frame` bytes, unknown types, bad payloads and
requests before the handshake get an ERROR reply and that connection is
closed; other connections never notice. Idle connections are closed after
`idle_timeout` seconds. SIGTERM/SIGINT/SIGHUP stop accepting, finish the
requests already read, and return.

Connections are limited (`max_connections`, by default what the open-file
limit leaves room for: `connection_limit`), so that idle connections can never
take every file descriptor and lock real clients out. At the limit a new
connection closes the least recently active idle one (a request in flight is
never lost; clients already survive the idle timeout's close in the same way,
and the Moses feature reconnects); only when every connection has a request in
flight is the new one refused with an ERROR frame (E_BUSY). Should descriptors
run out all the same (another limit, a lowered one), a failed accept() also
closes an idle connection. What the server reports about such events goes to
stderr through `RateLimitedLog`: one line per kind of event per interval, with
the count of those held back.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import itertools
import json
import signal
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace

import numpy as np

from mtcommon.errors import UserError

from . import protocol as P
from .engine import Engine


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 5555
    max_batch: int = 8192  # n-grams per engine call
    max_delay: float = 0.0002  # seconds a request may wait for others to fill a batch
    cache_size: int = 1_000_000  # n-grams; 0 disables the cache
    max_frame: int = P.DEFAULT_MAX_FRAME
    idle_timeout: float = 300.0
    max_connections: int | None = None  # None: what the open-file limit leaves room for (`connection_limit`)
    log_interval: float = 10.0  # seconds between two stderr lines about one kind of event


# Connections asyncio may accept in one pass over the listening socket (also the kernel's accept queue), and
# the descriptors kept for everything but connections (stdio, the event loop, model and KenLM files, CUDA):
# the default connection limit leaves both free, so a burst of connections never meets the open-file limit.
LISTEN_BACKLOG = 64
FD_RESERVE = 64
# accept() errors that mean "no descriptor or memory left" (asyncio logs them and retries a second later)
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def open_file_limit() -> int | None:
    """This process's soft limit on open files (RLIMIT_NOFILE, `ulimit -n`); None where there is none."""
    try:
        import resource
    except ImportError:  # pragma: no cover (not POSIX)
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def connection_limit(asked: int | None = None, fds: int | None = None) -> int:
    """The connection limit: `asked` (--max-connections), or by default the open-file limit `fds` (this
    process's) less the descriptors kept for a burst of accepts and for the rest of the server: 128 connections
    under `ulimit -n 256`, 896 under 1024. An `asked` limit the open files cannot hold is a UserError."""
    fds = open_file_limit() if fds is None else fds
    most = None if fds is None else max(1, fds - min(fds // 2, LISTEN_BACKLOG + FD_RESERVE))
    if asked is None:
        return most if most is not None else 4096
    if asked < 1:
        raise UserError(f"--max-connections must be at least 1, got {asked}")
    if most is not None and asked > most:
        raise UserError(f"--max-connections {asked} needs more open files than this process may have (ulimit -n "
                        f"{fds}: at most {most} connections); raise the limit or lower --max-connections")
    return asked


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


# Batches of at most this many n-grams are scored on the event loop's thread
# (about 0.1 ms on the CPU); larger ones in the worker thread, so that reading
# new requests overlaps the forward pass.
INLINE_ROWS = 64

if sys.version_info >= (3, 11):
    async def _read(reader: asyncio.StreamReader, n: int, timeout: float) -> bytes:
        async with asyncio.timeout(timeout):  # a timer handle, not a new task per frame
            return await reader.readexactly(n)
else:  # pragma: no cover
    async def _read(reader: asyncio.StreamReader, n: int, timeout: float) -> bytes:
        return await asyncio.wait_for(reader.readexactly(n), timeout)


NAMES = {P.HELLO: "hello", P.SCORE: "score", P.SCORE_TEXT: "score_text", P.LOOKUP: "lookup", P.VOCAB: "vocab",
         P.STATS: "stats"}


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
        self.connections_evicted = 0  # idle ones closed to make room (connection limit, descriptor shortage)
        self.connections_refused = 0  # new ones refused: at the limit with every connection busy
        self.latencies: collections.deque = collections.deque(maxlen=10000)  # seconds, score requests

    def to_dict(self, cache_len: int, cache_cap: int, max_connections: int = 0) -> dict:
        lat = np.array(self.latencies) * 1e3 if self.latencies else np.zeros(1)
        pct = {f"p{q}": round(float(np.percentile(lat, q)), 3) for q in (50, 90, 99)}
        return {
            "uptime_s": round(time.time() - self.started, 1),
            "requests": sum(self.requests.values()),
            "requests_by_type": {NAMES.get(t, str(t)): n for t, n in self.requests.items()},
            "ngrams": self.ngrams,
            "batches": self.batches,
            "batch_ngrams": {
                "mean": round(self.batch_ngrams_total / max(self.batches, 1), 1),
                "max": self.batch_ngrams_max,
                "requests_per_batch": round(self.batch_requests_total / max(self.batches, 1), 2),
            },
            "cache": {"hits": self.cache_hits, "misses": self.cache_misses, "size": cache_len, "capacity": cache_cap},
            "latency_ms": {**pct, "max": round(float(lat.max()), 3), "window": len(self.latencies)},
            "errors": self.errors,
            "connections": {"open": self.connections_open, "total": self.connections_total},
            "connection_limit": {"max": max_connections, "evicted": self.connections_evicted,
                                 "refused": self.connections_refused},
        }


class CachedScorer:
    """Engine.score_ids behind an n-gram cache; called by the batcher only, one call at a time."""

    def __init__(self, engine: Engine, capacity: int, stats: Stats):
        self.engine, self.capacity, self.stats = engine, capacity, stats
        self.cache: dict[bytes, tuple[float, int]] = {}

    def __call__(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not self.capacity:
            return self.engine.score_ids(rows)
        keys = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel().tolist()
        get = self.cache.get
        found = [get(k) for k in keys]
        miss = [i for i, f in enumerate(found) if f is None]
        self.stats.cache_hits += len(keys) - len(miss)
        self.stats.cache_misses += len(miss)
        logp = np.empty(len(rows), np.float32)
        flags = np.empty(len(rows), np.uint8)
        if len(miss) < len(keys):
            hit = np.array([i for i, f in enumerate(found) if f is not None])
            vals = np.array([found[i] for i in hit], dtype=np.float64)
            logp[hit], flags[hit] = vals[:, 0], vals[:, 1]
        if miss:
            m = np.array(miss)
            lp, fl = self.engine.score_ids(rows[m])
            logp[m], flags[m] = lp, fl
            self.cache.update(zip((keys[i] for i in miss), zip(lp.tolist(), fl.tolist())))
            over = len(self.cache) - self.capacity
            if over > 0:  # FIFO: dicts keep insertion order
                for k in list(itertools.islice(self.cache, over)):
                    del self.cache[k]
        return logp, flags


class Batcher:
    def __init__(self, scorer: CachedScorer, cfg: ServerConfig, stats: Stats):
        self.scorer, self.cfg, self.stats = scorer, cfg, stats
        self.queue: collections.deque = collections.deque()
        self.wakeup = asyncio.Event()
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cslm-engine")
        self.task: asyncio.Task | None = None
        self.stopping = False

    def submit(self, rows: np.ndarray, conn: object = None) -> asyncio.Future:
        """Queue `rows` from connection `conn`; the future gets (log-probs, flags)."""
        fut = asyncio.get_running_loop().create_future()
        self.queue.append((rows, fut, conn))
        self.wakeup.set()
        return fut

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.queue:
                if self.stopping:
                    return
                self.wakeup.clear()
                await self.wakeup.wait()
                continue
            # Wait up to max_delay for other requests to join, polling the loop,
            # but only while some open connection has nothing queued: when every
            # client is already waiting (one decoder thread, say) nobody can join.
            deadline = time.perf_counter() + self.cfg.max_delay
            while (self._waiting() < self.cfg.max_batch and time.perf_counter() < deadline and not self.stopping
                   and self._queued_connections() < self.stats.connections_open):
                await asyncio.sleep(0)
            batch, total = [], 0
            while self.queue and (not batch or total + len(self.queue[0][0]) <= self.cfg.max_batch):
                rows, fut, _ = self.queue.popleft()
                if fut.cancelled():
                    continue
                batch.append((rows, fut))
                total += len(rows)
            if not batch:
                continue
            rows = np.concatenate([r for r, _ in batch]) if len(batch) > 1 else batch[0][0]
            try:
                if total <= INLINE_ROWS:  # a thread hop would cost more than the forward pass
                    logp, flags = self.scorer(rows)
                else:
                    logp, flags = await loop.run_in_executor(self.pool, self.scorer, rows)
            except Exception as e:  # surfaces as an INTERNAL error on each request
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(e)
                continue
            self.stats.batches += 1
            self.stats.batch_ngrams_total += total
            self.stats.batch_ngrams_max = max(self.stats.batch_ngrams_max, total)
            self.stats.batch_requests_total += len(batch)
            at = 0
            for r, fut in batch:
                if not fut.done():
                    fut.set_result((logp[at : at + len(r)], flags[at : at + len(r)]))
                at += len(r)

    def _waiting(self) -> int:
        return sum(len(r) for r, _, _ in self.queue)

    def _queued_connections(self) -> int:
        return len({c for _, _, c in self.queue})


class _Conn:
    """What the connection limit needs to know of an open connection."""

    __slots__ = ("mine", "busy")

    def __init__(self, mine: set):
        self.mine = mine  # its score requests in flight
        self.busy = False  # between a frame's header and its reply

    @property
    def idle(self) -> bool:
        return not self.busy and not self.mine


class Server:
    def __init__(self, engine: Engine, cfg: ServerConfig | None = None):
        self.engine = engine
        cfg = cfg or ServerConfig()
        self.cfg = replace(cfg, max_connections=connection_limit(cfg.max_connections))
        self.log = RateLimitedLog(self.cfg.log_interval)
        self.stats = Stats()
        self.scorer = CachedScorer(engine, self.cfg.cache_size, self.stats)
        v = engine.vocab
        self.hello = P.encode_hello_reply(engine.order, len(v), engine.bos_id, engine.eos_id, engine.unk_id,
                                          self.cfg.max_frame, engine.mode, v.checksum())
        self.vocab_payload = P.encode_vocab(v.words)
        self.batcher: Batcher | None = None
        self.server: asyncio.base_events.Server | None = None
        # open connections by their task, least recently active first (a frame moves its connection to the end)
        self.connections: collections.OrderedDict[asyncio.Task, _Conn] = collections.OrderedDict()
        self.inflight: set[asyncio.Task] = set()
        self.closing = False
        self.port: int | None = None
        self._done: asyncio.Event | None = None

    # -- lifecycle ----------------------------------------------------------
    async def start(self) -> int:
        self.batcher = Batcher(self.scorer, self.cfg, self.stats)
        self.batcher.task = asyncio.create_task(self.batcher.run())
        self._done = asyncio.Event()
        asyncio.get_running_loop().set_exception_handler(self._loop_exception)
        self.server = await asyncio.start_server(self._connection, self.cfg.host, self.cfg.port,
                                                 limit=1 << 16, reuse_address=True, backlog=LISTEN_BACKLOG)
        self.port = self.server.sockets[0].getsockname()[1]
        return self.port

    def request_shutdown(self) -> None:
        if not self.closing:
            self.closing = True
            asyncio.get_running_loop().create_task(self._shutdown())

    async def _shutdown(self) -> None:
        self.server.close()
        if self.inflight:  # drain: answer every request already read
            await asyncio.gather(*list(self.inflight), return_exceptions=True)
        for t in list(self.connections):
            t.cancel()
        if self.connections:
            await asyncio.gather(*list(self.connections), return_exceptions=True)
        self.batcher.stopping = True
        self.batcher.wakeup.set()
        await self.batcher.task
        self.batcher.pool.shutdown(wait=True)
        self.log.close()
        self._done.set()

    async def wait_closed(self) -> None:
        await self._done.wait()

    # -- the connection limit -----------------------------------------------
    def _evict_idle(self) -> bool:
        """Close the least recently active idle connection; False if every connection is busy."""
        for task, conn in self.connections.items():
            if conn.idle:
                del self.connections[task]  # counted out now: more connections may arrive before it ends
                task.cancel()
                self.stats.connections_evicted += 1
                return True
        return False

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """An ERROR frame (E_BUSY), then the close; the client's HELLO is read first (for up to a second), so
        that the close does not reset the connection before the client reads the error."""
        limit = self.cfg.max_connections
        self.stats.connections_refused += 1
        self.log.event("refused", f"cslm: refused a connection: all {limit} connections (--max-connections) "
                                  f"have requests in flight")
        try:
            writer.write(P.frame(P.ERROR, 0, P.encode_error(
                P.E_BUSY, f"server busy: all {limit} connections have requests in flight; try again later")))
            await writer.drain()
            await asyncio.wait_for(reader.read(P.HEADER_SIZE + 8), 1.0)
        except (asyncio.TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        """The event loop's error reports, through the rate-limited log. A failed accept() for want of
        descriptors (asyncio retries it a second later, and reports it for every connection waiting) is one
        line, and closes an idle connection, so that the next accept() finds a descriptor; anything else is a
        bug, reported with its traceback (at most once per interval and kind)."""
        exc = context.get("exception")
        message = context.get("message") or "error in the event loop"
        if isinstance(exc, OSError) and exc.errno in _OUT_OF_RESOURCES:
            evicted = self._evict_idle()
            fds = open_file_limit()
            self.log.event(f"accept:{exc.errno}", f"cslm: {message}: {exc.strerror} (open-file limit "
                           f"{fds if fds is not None else 'none'}, --max-connections {self.cfg.max_connections})"
                           + ("; closed the least recently active idle connection" if evicted else ""))
            return
        detail = "".join(traceback.format_exception(exc)) if exc is not None else ""
        self.log.event(f"loop:{message}:{type(exc).__name__}", f"cslm: {message}", detail)

    # -- one connection -----------------------------------------------------
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if len(self.connections) >= self.cfg.max_connections:
            if not self._evict_idle():
                await self._refuse(reader, writer)
                return
            self.log.event("evicted", f"cslm: at the connection limit ({self.cfg.max_connections}, "
                                      f"--max-connections): closed the least recently active idle connection")
        mine: set[asyncio.Task] = set()
        conn = self.connections[task] = _Conn(mine)
        self.stats.connections_open += 1
        self.stats.connections_total += 1
        try:
            await self._serve_frames(reader, writer, conn)
        except (asyncio.CancelledError, ConnectionError):
            pass
        finally:
            if mine:
                await asyncio.gather(*list(mine), return_exceptions=True)
            self.stats.connections_open -= 1
            self.connections.pop(task, None)
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, asyncio.CancelledError):
                pass

    async def _serve_frames(self, reader, writer, conn: _Conn) -> None:
        cfg, handshaken, mine = self.cfg, False, conn.mine
        task = asyncio.current_task()
        while not self.closing:
            conn.busy = False
            try:
                head = await _read(reader, P.HEADER_SIZE, cfg.idle_timeout)
            except (asyncio.TimeoutError, asyncio.IncompleteReadError):
                return  # idle, or the client went away (possibly mid-header)
            conn.busy = True
            if task in self.connections:
                self.connections.move_to_end(task)  # the most recently active
            length, type_, rid = P.parse_header(head)
            try:
                if length > cfg.max_frame:
                    raise P.ProtocolError(P.E_TOO_LARGE, f"frame of {length} bytes exceeds the limit of {cfg.max_frame}")
                if type_ not in P.REQUEST_TYPES:
                    raise P.ProtocolError(P.E_UNKNOWN_TYPE, f"unknown frame type 0x{type_:02x}")
                try:
                    payload = await _read(reader, length, cfg.idle_timeout)
                except (asyncio.TimeoutError, asyncio.IncompleteReadError):
                    return  # truncated frame: nobody left to answer
                t0 = time.perf_counter()
                self.stats.requests[type_] += 1
                if type_ == P.HELLO:
                    P.check_hello(payload)
                    handshaken = True
                    writer.write(P.frame(P.HELLO | P.REPLY, rid, self.hello))
                elif not handshaken:
                    raise P.ProtocolError(P.E_NO_HANDSHAKE, "the first frame must be HELLO")
                elif type_ == P.SCORE:
                    rows = self.engine.pad(P.decode_score(payload, self.engine.order, len(self.engine.vocab)))
                    self._spawn(mine, self._score(writer, rid, rows, None, t0))
                elif type_ == P.SCORE_TEXT:
                    grams = P.decode_score_text(payload, self.engine.order)
                    rows = np.full((len(grams), self.engine.order), self.engine.bos_id, np.int32)
                    for i, g in enumerate(grams):
                        rows[i, self.engine.order - len(g):] = self.engine.vocab.encode(g)
                    self._spawn(mine, self._score(writer, rid, rows, grams, t0))
                elif type_ == P.LOOKUP:
                    words = P.decode_lookup(payload)
                    writer.write(P.frame(P.LOOKUP | P.REPLY, rid, P.encode_ids(self.engine.vocab.encode(words))))
                elif type_ == P.VOCAB:
                    writer.write(P.frame(P.VOCAB | P.REPLY, rid, self.vocab_payload))
                elif type_ == P.STATS:
                    writer.write(P.frame(P.STATS | P.REPLY, rid, json.dumps(self.stats_dict()).encode("utf-8")))
                await writer.drain()
            except P.ProtocolError as e:
                await self._error(writer, rid, e.code, str(e))
                return

    def _spawn(self, mine: set, coro) -> None:
        t = asyncio.create_task(coro)
        for s in (mine, self.inflight):
            s.add(t)
            t.add_done_callback(s.discard)

    async def _score(self, writer, rid: int, rows: np.ndarray, grams, t0: float) -> None:
        try:
            logp, flags = await self.batcher.submit(rows, conn=writer)
            if grams is not None and self.engine.backoff is not None and (flags & 1).any():
                logp, flags = logp.copy(), flags.copy()
                self.engine.apply_backoff(grams, logp, flags)
        except Exception as e:  # the error reply closes this connection only
            await self._error(writer, rid, P.E_INTERNAL, f"scoring failed: {e}")
            writer.close()
            return
        self.stats.ngrams += len(rows)
        writer.write(P.frame(P.SCORES, rid, P.encode_scores(logp, flags)))
        self.stats.latencies.append(time.perf_counter() - t0)
        try:
            await writer.drain()
        except ConnectionError:
            pass

    async def _error(self, writer, rid: int, code: int, message: str) -> None:
        self.stats.errors += 1
        try:
            writer.write(P.frame(P.ERROR, rid, P.encode_error(code, message)))
            await writer.drain()
        except ConnectionError:
            pass

    def stats_dict(self) -> dict:
        d = self.stats.to_dict(len(self.scorer.cache), self.cfg.cache_size, self.cfg.max_connections)
        d["config"] = asdict(self.cfg)
        d["model"] = {"order": self.engine.order, "vocab_size": len(self.engine.vocab), "mode": self.engine.mode,
                      "scores": self.engine.scores, "device": str(self.engine.device)}
        return d


def startup_message(engine: Engine, host: str, port: int, name: str | None = None) -> str:
    """The line `cslm serve` prints once listening."""
    what = f" {name}" if name else ""
    scores = "" if engine.normalized else \
        "; self-normalized scores o_w, no softmax: log-probabilities only if the model was trained with --self-norm"
    return (f"cslm: serving{what} on {host}:{port} (order {engine.order}, {len(engine.vocab)} words, "
            f"mode {engine.mode}, device {engine.device}{scores})")


def shutdown_summary(stats: dict) -> str:
    """The line `cslm serve` prints at shutdown: traffic, cache share and latency, from `Server.stats_dict()`."""
    by_type = stats["requests_by_type"]
    score = by_type.get("score", 0) + by_type.get("score_text", 0)
    looked = stats["cache"]["hits"] + stats["cache"]["misses"]
    hits = f", {100 * stats['cache']['hits'] / looked:.0f}% from the cache" if looked else ""
    return (f"cslm: server stopped after {stats['uptime_s']:.0f} s: {score} score requests, {stats['ngrams']} n-grams"
            f"{hits}, {stats['connections']['total']} connections; latency p50 {stats['latency_ms']['p50']} ms, "
            f"p99 {stats['latency_ms']['p99']} ms")


def write_port_file(path: str, port: int) -> None:
    """The bound port, written atomically: a reader never sees a partial number."""
    from mtcommon.textio import atomic_output

    with atomic_output(path, compress=False) as f:
        f.write(f"{port}\n".encode())


async def _main(engine: Engine, cfg: ServerConfig, announce) -> dict:
    srv = Server(engine, cfg)
    port = await srv.start()
    loop = asyncio.get_running_loop()
    stops = [signal.SIGTERM, signal.SIGINT]
    if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # not under nohup
        stops.append(signal.SIGHUP)  # a closed terminal stops the server as SIGTERM does
    for sig in stops:
        loop.add_signal_handler(sig, srv.request_shutdown)
    announce(srv, port)
    await srv.wait_closed()
    return srv.stats_dict()


def serve(engine: Engine, cfg: ServerConfig, announce=None, name: str | None = None, port_file: str | None = None,
          summary: bool = False) -> dict:
    """Run the server until SIGTERM/SIGINT; return the final statistics (as the STATS request reports them).

    Once listening, `announce(server, port)` is called; by default the start-up
    line (`startup_message`, naming the model as `name`) goes to stderr and,
    with `port_file`, the bound port is written there. With `summary`, the
    shutdown line (`shutdown_summary`) goes to stderr at the end.
    """

    def default_announce(srv, port):
        print(startup_message(engine, cfg.host, port, name), file=sys.stderr, flush=True)
        if port_file:
            write_port_file(port_file, port)

    stats = asyncio.run(_main(engine, cfg, announce or default_announce))
    if summary:
        print(shutdown_summary(stats), file=sys.stderr, flush=True)
    return stats
