"""`cslm serve`: the asyncio TCP server that reads decoders' requests and answers them (protocol:
docs/cslm.md).

One task per connection reads its frames; HELLO, LOOKUP, VOCAB and STATS are answered at once, SCORE and
SCORE_TEXT go to the batcher (cslm.batcher), which scores the requests of every connection in shared engine
calls. What a client may take is set in cslm.limits, what the server reports in cslm.stats.

Robustness: frames over `max_frame` bytes, unknown types, bad payloads and requests before the handshake
get an ERROR reply and that connection is closed; other connections never notice. A connection silent for
`idle_timeout` seconds is closed; so is one whose frame, once begun, has not arrived whole within
`frame_timeout` seconds, or whose client has not taken a reply within as long. A connection with
`max_pending` requests read and not yet answered, or whose requests hold `max_conn_bytes` (their payloads and
what answering them makes: `protocol.held_bytes`), is not read further until one is answered (the client
waits in its socket: backpressure), and all connections together hold at most `max_total_bytes`.
Non-finite scores are never sent: such a request gets an ERROR reply.

Connections are limited (`max_connections`, by default what the open-file limit leaves room for). At the
limit a new connection closes the least recently active one without a request in flight, idle or
stalled in the middle of a frame (clients survive the close as after the idle timeout, and
the Moses feature reconnects); only when every connection has a request in flight is the new one refused
with an ERROR frame (E_BUSY). Should descriptors run out all the same (another limit, a lowered one), a
failed accept() also closes such a connection. What the server reports about these events goes to stderr
through `RateLimitedLog`.

SIGTERM/SIGINT/SIGHUP: stop accepting, answer every request already read, answer a frame that arrives
meanwhile with E_SHUTTING_DOWN, close each connection once its requests are answered, and return.
"""

from __future__ import annotations

import asyncio
import collections
import json
import mmap
import os
import signal
import sys
import time
import traceback
from dataclasses import asdict, replace

import numpy as np

from mtcommon.errors import UserError
from mtcommon.finite import NonFiniteScores

from . import protocol as P
from .batcher import Batcher, CachedScorer
from .engine import Engine
from .limits import LISTEN_BACKLOG, OUT_OF_RESOURCES, ByteBudget, ServerConfig, connection_limit, open_file_limit
from .stats import RateLimitedLog, Stats, shutdown_summary, startup_message

__all__ = ["Server", "ServerConfig", "serve", "check_port_file", "connection_limit", "RateLimitedLog",
           "startup_message", "shutdown_summary"]

if sys.version_info >= (3, 11):
    async def _within(awaitable, deadline: float):
        """`awaitable`, or TimeoutError at `deadline` (the loop's clock)."""
        async with asyncio.timeout_at(deadline):  # a timer handle, not a new task
            return await awaitable
else:  # pragma: no cover
    async def _within(awaitable, deadline: float):
        return await asyncio.wait_for(awaitable, max(0.0, deadline - asyncio.get_running_loop().time()))


# A payload larger than this is read in pieces of this size into a buffer of its own (`_read_payload`).
READ_PIECE = 1 << 16


async def _read_payload(reader: asyncio.StreamReader, length: int, prefix: bytes = b"") -> bytes | mmap.mmap:
    """A frame's payload of `length` bytes, of which `prefix` was read already. `StreamReader.readexactly`
    gathers all of them in the reader's buffer, then copies them out: a large frame was held twice while it was
    read. One larger than READ_PIECE is copied piece by piece into one buffer instead, so that the reader holds
    no more than a piece or two (the rest waits in the socket until it is read). That buffer is pages of its
    own (an anonymous mapping), given back to the system when the request lets go of it: from the C library's
    heap, a freed payload's room stayed with the process, in pieces among the engine's and the replies' blocks.
    IncompleteReadError if the client goes away first, as readexactly."""
    if length <= READ_PIECE:
        return prefix + await reader.readexactly(length - len(prefix))
    payload = mmap.mmap(-1, length)
    payload[: len(prefix)] = prefix
    view, at = memoryview(payload), len(prefix)
    while at < length:
        piece = await reader.read(min(READ_PIECE, length - at))
        if not piece:
            raise asyncio.IncompleteReadError(b"", length)  # the part read is of no use to anyone
        view[at : at + len(piece)] = piece
        at += len(piece)
    return payload


def _uncancel() -> None:
    """Forget a cancellation that was caught and acted on (Python >= 3.11 counts them)."""
    task = asyncio.current_task()
    if hasattr(task, "uncancel"):
        task.uncancel()


class _Conn:
    """What the server tracks of one open connection."""

    __slots__ = ("task", "pending", "bytes", "awaiting", "receiving", "released")

    def __init__(self, task: asyncio.Task):
        self.task = task
        self.pending: set[asyncio.Task] = set()  # its score requests read and not yet answered
        self.bytes = 0  # bytes its requests read and not yet answered hold (`protocol.held_bytes`)
        self.awaiting = False  # waiting for the first byte of a frame
        self.receiving = False  # in the middle of a frame
        self.released = asyncio.Event()  # set when one of its requests is answered

    @property
    def evictable(self) -> bool:
        """No request in flight, and idle or in the middle of a frame (not answering one)."""
        return not self.pending and (self.awaiting or self.receiving)


class Server:
    def __init__(self, engine: Engine, cfg: ServerConfig | None = None):
        self.engine = engine
        cfg = cfg or ServerConfig()
        self.cfg = replace(cfg, max_connections=connection_limit(cfg.max_connections))
        self.log = RateLimitedLog(self.cfg.log_interval)
        self.stats = Stats()
        self.scorer = CachedScorer(engine, self.cfg.cache_size, self.stats)
        # self-normalised on a CPU: the C++ evaluator of Moses's in-process mode, or torch's, where a history met
        # again costs one output row; on a GPU: CUDA graphs, where the network costs less than the launches of an
        # eager call and its bookkeeping; else torch (docs/cslm.md, "Server")
        self.evaluator = engine.use_evaluator(self.cfg.evaluator, self.cfg.history_cache, self.cfg.precision,
                                              self.cfg.max_batch)
        self.budget = ByteBudget(self.cfg.max_total_bytes)
        v = engine.vocab
        self.hello = P.encode_hello_reply(engine.order, len(v), engine.bos_id, engine.eos_id, engine.unk_id,
                                          self.cfg.max_frame, engine.mode, v.checksum())
        self.vocab_payload = P.encode_vocab(v.words)
        self.batcher: Batcher | None = None
        self.server: asyncio.base_events.Server | None = None
        # open connections by their task, least recently active first (a frame moves its connection to the end)
        self.connections: collections.OrderedDict[asyncio.Task, _Conn] = collections.OrderedDict()
        self.handlers: set[asyncio.Task] = set()  # every connection's task, refused ones included
        self.closing = False
        self.port: int | None = None
        self._done: asyncio.Event | None = None
        self._shutdown_task: asyncio.Task | None = None

    # -- lifecycle ----------------------------------------------------------
    async def start(self) -> int:
        """Listen; a port that cannot be bound is a UserError naming the address."""
        loop = asyncio.get_running_loop()
        try:
            self.server = await asyncio.start_server(self._connection, self.cfg.host, self.cfg.port,
                                                     limit=1 << 16, reuse_address=True, backlog=LISTEN_BACKLOG)
        except OSError as e:
            # asyncio's message repeats the address; the errno's own text does not
            reason = os.strerror(e.errno) if e.errno and e.errno > 0 else (e.strerror or str(e))
            raise UserError(f"cannot listen on {self.cfg.host}:{self.cfg.port}: {reason[:1].lower()}{reason[1:]} "
                            f"(--host, --port; --port 0 takes any free port)") from None
        self.batcher = Batcher(self.scorer, self.cfg.max_batch, self.cfg.max_delay, self.stats,
                               self.engine.full_batch)
        self.batcher.task = asyncio.create_task(self.batcher.run())
        self._done = asyncio.Event()
        loop.set_exception_handler(self._loop_exception)
        self.port = self.server.sockets[0].getsockname()[1]
        return self.port

    def request_shutdown(self) -> None:
        if not self.closing:
            self.closing = True
            self._shutdown_task = asyncio.get_running_loop().create_task(self._shutdown())

    async def _shutdown(self) -> None:
        self.server.close()
        for conn in list(self.connections.values()):
            if conn.awaiting:  # nothing read from it: wake it, it closes once its requests are answered
                conn.task.cancel()
        while self.handlers:
            await asyncio.wait(list(self.handlers))
        self.batcher.stop()
        await self.batcher.task
        self.batcher.close()
        self.log.close()
        self._done.set()

    async def wait_closed(self) -> None:
        await self._done.wait()

    # -- the connection limit -----------------------------------------------
    def _evict(self) -> bool:
        """Close the least recently active connection without a request in flight (idle, or stalled in the
        middle of a frame); False if every connection has a request in flight."""
        for task, conn in self.connections.items():
            if conn.evictable:
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
        line, and closes a connection without a request in flight, so that the next accept() finds a
        descriptor; anything else is a bug, reported with its traceback (at most once per interval and kind)."""
        exc = context.get("exception")
        message = context.get("message") or "error in the event loop"
        if isinstance(exc, OSError) and exc.errno in OUT_OF_RESOURCES:
            evicted = self._evict()
            fds = open_file_limit()
            self.log.event(f"accept:{exc.errno}", f"cslm: {message}: {exc.strerror} (open-file limit "
                           f"{fds if fds is not None else 'none'}, --max-connections {self.cfg.max_connections})"
                           + ("; closed the least recently active connection without a request in flight"
                              if evicted else ""))
            return
        detail = "".join(traceback.format_exception(exc)) if exc is not None else ""
        self.log.event(f"loop:{message}:{type(exc).__name__}", f"cslm: {message}", detail)

    # -- one connection -----------------------------------------------------
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self.handlers.add(task)
        task.add_done_callback(self.handlers.discard)
        if len(self.connections) >= self.cfg.max_connections:
            if not self._evict():
                await self._refuse(reader, writer)
                return
            self.log.event("evicted", f"cslm: at the connection limit ({self.cfg.max_connections}, "
                                      f"--max-connections): closed the least recently active connection "
                                      f"without a request in flight")
        conn = self.connections[task] = _Conn(task)
        self.stats.connections_open += 1
        self.stats.connections_total += 1
        self.batcher.attach()
        try:
            await self._serve_frames(reader, writer, conn)
        except (asyncio.CancelledError, ConnectionError):
            pass
        finally:
            if conn.pending:  # answered before the close, whatever ended the reading
                await asyncio.wait(list(conn.pending))
            self.batcher.detach()
            self.stats.connections_open -= 1
            self.connections.pop(task, None)
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, asyncio.CancelledError):
                pass

    async def _serve_frames(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: _Conn) -> None:
        cfg, handshaken = self.cfg, False
        loop = asyncio.get_running_loop()
        while True:
            while len(conn.pending) >= cfg.max_pending:  # backpressure: nothing more read until one is answered
                conn.released.clear()
                await conn.released.wait()
            if self.closing:
                return await self._close_at_shutdown(reader, writer, conn)
            conn.awaiting = True
            try:
                first = await _within(reader.readexactly(1), loop.time() + cfg.idle_timeout)
            except asyncio.CancelledError:
                if not self.closing:
                    raise
                _uncancel()
                return await self._close_at_shutdown(reader, writer, conn)
            except (asyncio.TimeoutError, asyncio.IncompleteReadError):
                return  # idle, or the client went away
            finally:
                conn.awaiting = False
            conn.receiving = True
            if conn.task in self.connections:
                self.connections.move_to_end(conn.task)  # the most recently active
            rid, taken = 0, 0
            try:
                head = first + await _within(reader.readexactly(P.HEADER_SIZE - 1), loop.time() + cfg.frame_timeout)
                length, type_, rid = P.parse_header(head)
                if length > cfg.max_frame:
                    raise P.ProtocolError(P.E_TOO_LARGE,
                                          f"frame of {length} bytes exceeds the limit of {cfg.max_frame}")
                if type_ not in P.REQUEST_TYPES:
                    raise P.ProtocolError(P.E_UNKNOWN_TYPE, f"unknown frame type 0x{type_:02x}")
                # a score request's count, from its payload's first bytes: what answering it will hold
                prefix = b""
                if type_ in P.COUNT_PREFIX:
                    prefix = await _within(reader.readexactly(min(length, P.COUNT_PREFIX[type_])),
                                           loop.time() + cfg.frame_timeout)
                held = P.held_bytes(type_, length, prefix, self.engine.order)
                await self._admit(conn, held)  # no deadline: the server, not the client, holds it up
                taken = held
                payload = await _within(_read_payload(reader, length, prefix), loop.time() + cfg.frame_timeout)
                conn.receiving = False
                t0 = time.perf_counter()
                self.stats.requests[type_] += 1
                if type_ == P.HELLO:
                    P.check_hello(payload)
                    handshaken = True
                    writer.write(P.frame(P.HELLO | P.REPLY, rid, self.hello))
                elif not handshaken:
                    raise P.ProtocolError(P.E_NO_HANDSHAKE, "the first frame must be HELLO")
                elif type_ == P.SCORE:
                    rows = self.engine.left_pad(P.decode_score(payload, self.engine.order, len(self.engine.vocab)))
                    del payload
                    if self.batcher.takes_now(len(rows)):
                        # the fast path: a request the batcher would score at once and alone on the loop's
                        # thread (Batcher.takes_now), scored here and now, without its task, future and turn.
                        # Others go through the batcher.
                        if not self._answer(writer, rid, rows, None, t0, lambda: self.batcher.score_now(rows)):
                            await self._drain(writer)
                            return
                    else:
                        self._spawn(conn, self._score(writer, conn, rid, rows, None, t0), taken)
                        taken = 0  # given back when that request is answered
                    del rows  # held by its request alone, not by this loop until the next frame's
                elif type_ == P.SCORE_TEXT:
                    grams = P.decode_score_text(payload, self.engine.order)
                    del payload
                    self._spawn(conn, self._score(writer, conn, rid, self.engine.word_rows(grams), grams, t0), taken)
                    taken = 0
                    del grams
                elif type_ == P.LOOKUP:
                    words = P.decode_lookup(payload)
                    writer.write(P.frame(P.LOOKUP | P.REPLY, rid, P.encode_ids(self.engine.vocab.encode(words))))
                elif type_ == P.VOCAB:
                    writer.write(P.frame(P.VOCAB | P.REPLY, rid, self.vocab_payload))
                elif type_ == P.STATS:
                    writer.write(P.frame(P.STATS | P.REPLY, rid, json.dumps(self.stats_dict()).encode("utf-8")))
                if not await self._drain(writer):
                    return
            except P.ProtocolError as e:
                await self._error(writer, rid, e.code, str(e))
                return
            except asyncio.TimeoutError:
                self._stalled("a frame did not arrive whole")
                return
            except asyncio.IncompleteReadError:
                return  # the client went away mid-frame: nobody left to answer
            finally:
                conn.receiving = False
                if taken:
                    self._release(conn, taken)

    async def _admit(self, conn: _Conn, length: int) -> None:
        """Wait until a request that holds `length` bytes (`protocol.held_bytes`) fits this connection's and the
        server's budgets; take them. A request is admitted alone whatever it holds (the frame limit bounds it)."""
        while True:
            if conn.bytes and conn.bytes + length > self.cfg.max_conn_bytes:
                conn.released.clear()
                await conn.released.wait()
            elif not self.budget.fits(length):
                await self.budget.wait_for(length)
            else:
                break
        conn.bytes += length
        self.budget.take(length)

    def _release(self, conn: _Conn, length: int) -> None:
        conn.bytes -= length
        self.budget.give(length)
        conn.released.set()

    def _spawn(self, conn: _Conn, coro, length: int) -> None:
        """Run a score request; its `length` payload bytes are held until it is answered."""
        t = asyncio.create_task(coro)
        conn.pending.add(t)

        def done(_):
            conn.pending.discard(t)
            self._release(conn, length)

        t.add_done_callback(done)

    async def _close_at_shutdown(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                                 conn: _Conn) -> None:
        """Shutting down: this connection's requests in flight are answered; then a frame already here gets
        E_SHUTTING_DOWN (the client may try again elsewhere, or later), and the connection closes."""
        if conn.pending:
            await asyncio.wait(list(conn.pending))
        try:
            head = await _within(reader.readexactly(P.HEADER_SIZE), asyncio.get_running_loop().time())
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            return
        await self._error(writer, P.parse_header(head)[2], P.E_SHUTTING_DOWN, "the server is shutting down")

    async def _score(self, writer, conn: _Conn, rid: int, rows: np.ndarray, grams, t0: float) -> None:
        """A request through the batcher: answered when its batch (or its last slice's) is scored."""
        scored = self.batcher.submit(rows, conn)
        try:
            await scored
        except Exception:  # noqa: BLE001 -- raised again by scored.result, inside _answer
            pass
        answered = self._answer(writer, rid, rows, grams, t0, scored.result)
        rows = grams = scored = None  # while the reply waits for its client, only the reply is held
        await self._drain(writer)
        if not answered:
            writer.close()

    def _answer(self, writer, rid: int, rows: np.ndarray, grams, t0: float, scores) -> bool:
        """Write the reply to one score request: SCORES with what `scores()` returns (back-off applied to text
        requests), or an ERROR when it raises. False when the connection must close (a failed request)."""
        try:
            logp, flags = scores()
            if grams is not None and self.engine.backoff is not None:
                self.engine.apply_backoff(grams, logp, flags)
        except NonFiniteScores as e:  # the engine's check (`Engine._run`): never a NaN or an infinity on the wire;
            # the model's weights are broken: every client is told, the log once a while
            self.log.event("nonfinite", f"cslm: {e}; answered with an error")
            self._error_now(writer, rid, P.E_INTERNAL, str(e))
            return False
        except Exception as e:  # noqa: BLE001 -- the error reply closes this connection only
            self._error_now(writer, rid, P.E_INTERNAL, f"scoring failed: {e}")
            return False
        self.stats.ngrams += len(rows)
        writer.write(P.scores_frame(rid, logp, flags))
        self.stats.latencies.append(time.perf_counter() - t0)
        return True

    async def _drain(self, writer: asyncio.StreamWriter) -> bool:
        """Wait for the client to take what was written, within `frame_timeout`; False: closed (stalled, gone)."""
        try:
            await _within(writer.drain(), asyncio.get_running_loop().time() + self.cfg.frame_timeout)
            return True
        except asyncio.TimeoutError:
            self._stalled("its client did not read a reply")
            writer.transport.abort()
        except ConnectionError:
            pass
        return False

    def _stalled(self, why: str) -> None:
        self.stats.connections_stalled += 1
        self.log.event(f"stalled:{why}", f"cslm: closed a connection: {why} within {self.cfg.frame_timeout:g} s "
                                         f"(--frame-timeout)")

    def _error_now(self, writer, rid: int, code: int, message: str) -> None:
        """Write an ERROR reply (the caller drains)."""
        self.stats.errors += 1
        try:
            writer.write(P.frame(P.ERROR, rid, P.encode_error(code, message)))
        except ConnectionError:
            pass

    async def _error(self, writer, rid: int, code: int, message: str) -> None:
        self._error_now(writer, rid, code, message)
        try:
            await _within(writer.drain(), asyncio.get_running_loop().time() + self.cfg.frame_timeout)
        except (ConnectionError, asyncio.TimeoutError):
            pass

    def stats_dict(self) -> dict:
        d = self.stats.to_dict(len(self.scorer), self.cfg.cache_size, self.cfg.max_connections,
                               {"now": self.budget.used, "peak": self.budget.peak, "max": self.budget.cap})
        d["config"] = asdict(self.cfg)
        d["model"] = {"order": self.engine.order, "vocab_size": len(self.engine.vocab), "mode": self.engine.mode,
                      "scores": self.engine.scores, "device": str(self.engine.device)}
        d["model"]["evaluator"] = self.evaluator
        hc, native = self.engine.history_cache, self.engine.native
        if native is not None:  # one cache of `history_slots` rows, shared by the evaluator's threads
            d["model"]["precision"] = native.precision
            d["model"]["kernels"] = native.kernels
            hits, misses = native.cache_counts()
            d["history_cache"] = {"hits": hits, "misses": misses, "size": None, "capacity": native.history_slots}
        elif hc is not None:
            d["history_cache"] = {"hits": hc.hits, "misses": hc.misses, "size": len(hc), "capacity": hc.slots}
        else:
            d["history_cache"] = {"hits": 0, "misses": 0, "size": 0, "capacity": 0}
        return d


def check_port_file(path: str) -> None:
    """Refuse (UserError) a --port-file that cannot be written, before anything is announced."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UserError(f"--port-file {path}: is a directory")
    if not os.path.isdir(folder):
        raise UserError(f"--port-file {path}: no such folder {folder}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(f"--port-file {path}: the folder {folder} is not writable")


def write_port_file(path: str, port: int) -> None:
    """The bound port, written atomically: a reader never sees a partial number."""
    from mtcommon.outputs import atomic_output

    with atomic_output(path, compress=False) as f:
        f.write(f"{port}\n".encode())


def remove_port_file(path: str, port: int) -> None:
    """The port file removed once the server has stopped, so that nobody waiting for one reads a port no
    longer served; left alone if it no longer names `port` (another server's since)."""
    try:
        with open(path, encoding="utf-8") as f:
            if f.read().strip() == str(port):
                os.unlink(path)
    except OSError:
        pass


async def _main(engine: Engine, cfg: ServerConfig, announce) -> dict:
    srv = Server(engine, cfg)
    port = await srv.start()
    loop = asyncio.get_running_loop()
    stops = [signal.SIGTERM, signal.SIGINT]
    if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # not under nohup
        stops.append(signal.SIGHUP)  # a closed terminal stops the server as SIGTERM does
    for sig in stops:
        loop.add_signal_handler(sig, srv.request_shutdown)
    try:
        announce(srv, port)
    except BaseException:
        srv.request_shutdown()
        await srv.wait_closed()
        raise
    await srv.wait_closed()
    return srv.stats_dict()


def serve(engine: Engine, cfg: ServerConfig, announce=None, name: str | None = None, port_file: str | None = None,
          summary: bool = False) -> dict:
    """Run the server until SIGTERM/SIGINT; return the final statistics (as the STATS request reports them).

    Once listening, `announce(server, port)` is called; by default, with `port_file`, the bound port is
    written there (and the file removed when the server stops), then the start-up line (`startup_message`,
    naming the model as `name`) goes to stderr. With `summary`, the shutdown line (`shutdown_summary`) goes
    to stderr at the end.
    """
    if port_file:
        check_port_file(port_file)
    written: list[int] = []

    def default_announce(srv, port):
        if port_file:
            write_port_file(port_file, port)
            written.append(port)
        print(startup_message(engine, cfg.host, port, name), file=sys.stderr, flush=True)

    try:
        stats = asyncio.run(_main(engine, cfg, announce or default_announce))
    finally:
        for port in written:
            remove_port_file(port_file, port)
    if summary:
        print(shutdown_summary(stats), file=sys.stderr, flush=True)
    return stats
