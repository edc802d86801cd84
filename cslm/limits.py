"""What `cslm serve` lets clients take: its configuration, the connection limit and the byte budgets."""

from __future__ import annotations

import asyncio
import errno
from dataclasses import dataclass

from mtcommon.errors import UserError

from . import protocol as P

# The longest wait for other requests to join a batch (ServerConfig.max_delay, --max-delay-us): batching pays
# off within a forward pass's time; past that a request only waits.
MAX_DELAY_US = 10_000


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 5555
    max_batch: int = 8192  # n-grams per engine call
    max_delay: float = 0.0002  # seconds a request may wait for others to fill a batch (at most MAX_DELAY_US)
    cache_size: int = 0  # n-grams in the server's cache (cslm.ngram_cache); 0: none (decoders cache their own)
    evaluator: str = "auto"  # self-normalised: "native" (CPU), "graphs" (CUDA), "torch", "auto" (Engine.use_evaluator)
    history_cache: int | None = None  # rows of the history cache (self-normalised, CPU); None: the evaluator's default
    precision: str = "fp32"  # the C++ evaluator's layers after the first: "fp32" or "int8" (cslm_local.h, Precision)
    max_frame: int = P.DEFAULT_MAX_FRAME
    idle_timeout: float = 300.0
    frame_timeout: float = 30.0  # seconds for a frame to arrive whole once begun, and for a reply to be taken
    max_connections: int | None = None  # None: what the open-file limit leaves room for (`connection_limit`)
    max_pending: int = 16  # requests one connection may have read and not yet answered
    max_conn_bytes: int | None = None  # bytes one connection's requests read and not answered may hold [2 frames]
    max_total_bytes: int | None = None  # the same over all connections [16 frames]
    log_interval: float = 10.0  # seconds between two stderr lines about one kind of event

    def __post_init__(self):
        if self.max_conn_bytes is None:
            self.max_conn_bytes = 2 * self.max_frame
        if self.max_total_bytes is None:
            self.max_total_bytes = max(16 * self.max_frame, self.max_conn_bytes)
        check_config(self)


# The command-line option that sets each checked field, for one-line errors.
OPTIONS = {"max_delay": "--max-delay-us", "max_frame": "--max-frame", "max_pending": "--max-pending",
           "max_conn_bytes": "--max-conn-bytes", "max_total_bytes": "--max-total-bytes",
           "frame_timeout": "--frame-timeout", "history_cache": "--history-cache"}


def check_config(cfg: ServerConfig) -> None:
    """Refuse (UserError, naming the option) limits that contradict each other: a byte budget smaller than
    the largest frame would never admit such a frame."""
    if not 0 <= cfg.max_delay <= MAX_DELAY_US * 1e-6:
        raise UserError(f"{OPTIONS['max_delay']} must be within 0..{MAX_DELAY_US}, got {cfg.max_delay * 1e6:g}")
    if cfg.max_pending < 1:
        raise UserError(f"{OPTIONS['max_pending']} must be at least 1, got {cfg.max_pending}")
    if cfg.history_cache is not None and cfg.history_cache < 0:
        raise UserError(f"{OPTIONS['history_cache']} must be at least 0, got {cfg.history_cache}")
    if cfg.precision not in ("fp32", "int8"):
        raise UserError(f"--precision must be fp32 or int8, got {cfg.precision!r}")
    if cfg.precision != "fp32" and cfg.evaluator in ("torch", "graphs"):
        raise UserError(f"--precision {cfg.precision} is the C++ evaluator's: --evaluator auto or native")
    if cfg.frame_timeout <= 0:
        raise UserError(f"{OPTIONS['frame_timeout']} must be above 0, got {cfg.frame_timeout}")
    for name, floor in (("max_conn_bytes", "max_frame"), ("max_total_bytes", "max_conn_bytes")):
        if getattr(cfg, name) < getattr(cfg, floor):
            raise UserError(f"{OPTIONS[name]} {getattr(cfg, name)} is below {OPTIONS[floor]} "
                            f"{getattr(cfg, floor)}: such a request could never be read")


# Connections asyncio may accept in one pass over the listening socket (also the kernel's accept queue), and
# the descriptors kept for everything but connections (stdio, the event loop, model and KenLM files, CUDA):
# the default connection limit leaves both free, so a burst of connections never meets the open-file limit.
LISTEN_BACKLOG = 64
FD_RESERVE = 64
# accept() errors that mean "no descriptor or memory left" (asyncio logs them and retries a second later)
OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


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


class ByteBudget:
    """Bytes that requests read and not yet answered hold, within `cap`: `wait_for` waits until more fit.

    Waiters are woken in turn as bytes are given back; each checks again (others may have taken the room).
    Used on the event loop's thread only.
    """

    def __init__(self, cap: int):
        self.cap, self.used, self.peak = cap, 0, 0
        self._waiters: list[asyncio.Future] = []

    def fits(self, n: int) -> bool:
        """Whether `n` more bytes fit; into an empty budget anything does (a request alone is always taken)."""
        return not self.used or self.used + n <= self.cap

    async def wait_for(self, n: int) -> None:
        """Wait until `n` more bytes fit (without taking them)."""
        while not self.fits(n):
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            finally:
                if fut in self._waiters:
                    self._waiters.remove(fut)

    def take(self, n: int) -> None:
        self.used += n
        self.peak = max(self.peak, self.used)

    def give(self, n: int) -> None:
        self.used -= n
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
