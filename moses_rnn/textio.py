"""Streaming text I/O shared by every tool: plain or gzip input, atomic output.

Reading: `open_input` sniffs the gzip magic bytes (not the file name) and
decompresses with ISA-L in a background thread, so a 10 GB table streams in
constant memory. Writing: `atomic_output` writes to a temporary file in the
destination's folder and renames it over the destination only when the block
finishes without an exception, so an interrupted or failed run never leaves a
partial file and never touches a previous output. A `.gz` destination is
compressed with ISA-L's multi-threaded gzip writer (see benchmarks/io_gzip.py
for the measurement that chose it).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import tempfile
from typing import BinaryIO, Iterator

from isal import igzip_threaded

GZIP_MAGIC = b"\x1f\x8b"


def is_gzip(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def open_input(path: str) -> BinaryIO:
    """Open `path` ('-' for stdin) for binary reading, decompressing gzip."""
    if path == "-":
        raw = sys.stdin.buffer
        head = raw.peek(2)[:2] if hasattr(raw, "peek") else b""
        if head == GZIP_MAGIC:
            return igzip_threaded.open(raw, "rb", threads=1)
        return raw
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    if is_gzip(path):
        return igzip_threaded.open(path, "rb", threads=1)
    return open(path, "rb", buffering=1 << 20)


def decode_line(raw: bytes, path: str, lineno: int) -> str:
    """UTF-8 decode one line, naming the file and line when it is not valid UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(path, lineno, f"invalid UTF-8 ({e.reason} at byte {e.start})") from None


def iter_lines(path: str, keepends: bool = False) -> Iterator[tuple[int, str]]:
    """Yield (line number, decoded line) from a plain or gzip UTF-8 text file.

    The line ending is stripped unless `keepends`. Undecodable bytes raise an
    InputError that names the file and line.
    """
    with contextlib.closing(open_input(path)) as f:
        for lineno, raw in enumerate(f, 1):
            line = decode_line(raw, path, lineno)
            yield lineno, (line if keepends else line.rstrip("\r\n"))


def iter_raw_windows(path: str, size: int) -> Iterator[tuple[int, list[bytes]]]:
    """Yield (number of the first line, up to `size` raw lines, endings kept)."""
    with contextlib.closing(open_input(path)) as f:
        first = 1
        while lines := list(itertools.islice(f, size)):
            yield first, lines
            first += len(lines)


class InputError(ValueError):
    """Bad input: carries the file and line number it was found at."""

    def __init__(self, path: str, lineno: int, message: str):
        self.path, self.lineno, self.message = path, lineno, message
        super().__init__(f"{path}:{lineno}: {message}")

    def __reduce__(self):  # survives the trip back from a worker process
        return (type(self), (self.path, self.lineno, self.message))


def default_threads() -> int:
    return max(1, min(4, os.cpu_count() or 1))


@contextlib.contextmanager
def atomic_output(path: str, compress: bool | None = None, threads: int | None = None) -> Iterator[BinaryIO]:
    """Yield a binary stream whose contents replace `path` only on success.

    `path` '-' writes to stdout (no atomicity is possible there). `compress`
    defaults to whether `path` ends in '.gz'.
    """
    if path == "-":
        out = sys.stdout.buffer
        yield out
        out.flush()
        return
    if compress is None:
        compress = path.endswith(".gz")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{path}: the output folder {folder} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        if compress:
            stream = igzip_threaded.open(tmp, "wb", threads=threads or default_threads())
        else:
            stream = open(tmp, "wb", buffering=1 << 20)
        try:
            yield stream
        finally:
            stream.close()
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
