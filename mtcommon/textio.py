"""Streaming text input shared by every tool: plain or gzip, files, pipes and stdin.

`open_input` is the one way every tool opens an input: a file, a gzip
file, a pipe (`<(...)`, a FIFO, /dev/fd/N) or '-' (stdin). It opens the input
once and reads each byte once: the gzip magic bytes (not the file name) are
sniffed from the opened stream and handed on with the rest of it, since a pipe
cannot be read twice. Gzip is decompressed with ISA-L in a background thread,
so a 10 GB table streams in constant memory. Outputs are `outputs.py`'s.

A gzip input that is cut short (a half-copied file) or corrupt (bad deflate
data, CRC mismatch) raises `InputError` naming the file and the last line
read, from every reader here (`iter_lines`, `iter_line_blocks`), never the
decompressor's bare EOFError. Bytes after the gzip data are read as `gzip -d`
reads them: zeros are padding; anything else that does not start a gzip member
is trailing garbage, ignored with a one-line warning on stderr (gzip -d's
"decompression OK, trailing garbage ignored"); a single such byte, or a member
cut short, is a truncated stream (`_GzipFile`).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import stat
import sys
import zlib
from typing import BinaryIO, Iterable, Iterator

import numpy as np
from isal import igzip_threaded, isal_zlib

from .errors import UserError

GZIP_MAGIC = b"\x1f\x8b"

# What the decompressors raise on a cut or damaged stream: EOFError (ended
# before the end-of-stream marker), gzip.BadGzipFile (CRC or length check, bad
# header), ISA-L's and zlib's errors (invalid deflate data).
GZIP_ERRORS = (EOFError, gzip.BadGzipFile, isal_zlib.error, zlib.error)


def gzip_error(path: str, lines_read: int, exc: BaseException) -> "InputError":
    """The InputError for a decompression failure met after `lines_read` complete lines."""
    if isinstance(exc, EOFError):
        what = f"truncated gzip stream after line {lines_read}"
    else:
        what = f"corrupt gzip stream after line {lines_read} ({exc})"
    return InputError(path, None, what)


def is_gzip(path: str) -> bool:
    """Whether the regular file `path` starts with the gzip magic bytes (it is opened for this alone: never
    ask it of a pipe, which would lose what it reads; `open_input` sniffs its own stream)."""
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


class _GzipFile(io.RawIOBase):
    """A gzip file, decompressed by ISA-L's threaded reader and, should that fail, read again exactly.

    ISA-L's reader raises on anything after the last gzip member that is not one (EOFError for a few bytes,
    BadGzipFile for more) and loses the data of the read that met it, so its error says neither how far the
    good data went nor whether the file was damaged or merely followed by garbage. On a decompression error
    the file is therefore read again member by member (`_exact_gzip`) from the byte where the fast reader
    stopped, and what follows the last member is judged as `gzip -d` judges it.

    An error of that exact reading is held back (`error`) while the stream ends as at EOF, after the last
    whole line before the damage: a buffered reader would drop the bytes it gathered in the read that
    raised. The readers of this module raise it once the stream is exhausted (`_raise_held_error`), so
    they report the lines truly read, and never hand on a line cut by the damage.
    """

    def __init__(self, path: str, source: BinaryIO, start: int | None):
        self.path = path  # for messages
        self.source = source  # the opened input, owned (closed with this)
        self.start = start  # where the gzip data starts in `source`; None: a stream that cannot be read again
        self.opened = igzip_threaded.open(source, "rb", threads=1)  # kept: collecting it would close its raw reader
        self.fast = self.opened.raw  # read directly: the only buffer is the one around this object
        self.delivered = 0  # bytes handed out
        self.exact: Iterator[bytes] | None = None  # after a failure of the fast reader
        self.failed = False  # the fast reader failed: exact reading from then on
        self.ended = False  # the exact reading is over (end, or error held back)
        self.pending = memoryview(b"")  # exact data ready to hand out: whole lines
        self.partial = b""  # exact data after the last newline, handed out with the next lines or at the end
        self.error: BaseException | None = None
        self.fast_error: BaseException | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if not self.failed:
            try:
                n = self.fast.readinto(b)
            except GZIP_ERRORS as e:
                if self.start is None:  # a pipe: what was read is gone, and so is the exact reading
                    raise
                self.failed, self.fast_error = True, e
                self.opened.close()  # its reading thread stops; the source stays open
                self.source.seek(self.start)
                self.exact = _exact_gzip(self.path, self.source, skip=self.delivered)
            else:
                self.delivered += n
                return n
        while not self.pending:
            if self.ended:
                return 0
            try:
                data = next(self.exact, None)
            except GZIP_ERRORS as e:  # damage, not garbage, at the exact reader's place
                # a stream cut short says so; for damaged data the fast reader's words are the clearer ("CRC
                # check failed" where zlib says "incorrect checksum")
                truncated = isinstance(e, EOFError) or isinstance(self.fast_error, EOFError)
                self.error = e if truncated else self.fast_error
                self.ended, self.partial = True, b""
                return 0
            if data is None:  # the end: the last line may lack its newline
                self.ended, data, self.partial = True, self.partial, b""
            else:
                data = self.partial + data
                cut = data.rfind(b"\n") + 1
                data, self.partial = data[:cut], data[cut:]
            self.pending = memoryview(data)
        n = min(len(b), len(self.pending))
        b[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        self.delivered += n
        return n

    def close(self) -> None:
        if not self.closed:
            self.opened.close()
            if self.exact is not None:
                self.exact.close()
            self.pending.release()
            self.source.close()
        super().close()


def _raise_held_error(stream: BinaryIO) -> None:
    """Raise the decompression error a `_GzipFile` held back, once `stream` (from `open_input`) is exhausted."""
    raw = getattr(stream, "raw", None)
    if isinstance(raw, _GzipFile) and raw.error is not None:
        raise raw.error


_TRUNCATED = "Compressed file ended before the end-of-stream marker was reached"  # the decompressors' EOFError


def _exact_gzip(path: str, f: BinaryIO, skip: int = 0, chunk: int = 1 << 16) -> Iterator[bytes]:
    """The decompressed bytes of the gzip stream `f` (named `path`), from its position, after the first
    `skip`, member by member, as `gzip -d` reads them: a member cut short raises EOFError, a damaged one the
    decompressor's error; after the last member, zero bytes are padding, a single other byte is a member
    header cut short (EOFError), and more bytes that do not start a member are trailing garbage: a warning
    on stderr, then the end."""
    rest = b""
    while True:
        if len(rest) < 2:
            rest += f.read(chunk)
        if not rest:
            return
        if rest[:2] != GZIP_MAGIC:
            garbage, nonzero = len(rest), bool(rest.strip(b"\0"))
            while data := f.read(chunk):
                garbage += len(data)
                nonzero = nonzero or bool(data.strip(b"\0"))
            if not nonzero:
                return  # zero padding (tar blocks): gzip ignores it silently
            if garbage == 1:
                raise EOFError(_TRUNCATED)
            print(f"warning: {path}: {garbage} bytes of trailing garbage after the gzip data ignored "
                  f"(as gzip -d does)", file=sys.stderr, flush=True)
            return
        member = isal_zlib.decompressobj(wbits=31)  # one gzip member, header and CRC checked
        while not member.eof:
            if not rest:
                rest = f.read(chunk)
                if not rest:
                    raise EOFError(_TRUNCATED)
            piece, rest = rest[:chunk], rest[chunk:]
            out = member.decompress(piece)
            if skip:
                cut = min(skip, len(out))
                out, skip = out[cut:], skip - cut
            if out:
                yield out
        rest = member.unused_data + rest


class _Prefixed(io.RawIOBase):
    """A stream that cannot be read twice (a pipe), its first bytes already read to sniff its format: those
    bytes, then the rest of the stream. Closing it closes the stream."""

    def __init__(self, head: bytes, rest: BinaryIO):
        self.head, self.rest = head, rest
        self._read_rest = getattr(rest, "readinto1", rest.readinto)  # one read at a time: lines as they come

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self.head:
            n = min(len(b), len(self.head))
            b[:n], self.head = self.head[:n], self.head[n:]
            return n
        return self._read_rest(b) or 0

    def close(self) -> None:
        if not self.closed:
            self.rest.close()
        super().close()


def _read_exactly(f: BinaryIO, n: int) -> bytes:
    """The next `n` bytes of `f` (fewer at its end), however a pipe hands them over."""
    data = b""
    while len(data) < n and (piece := f.read(n - len(data))):
        data += piece
    return data


def _open_error(path: str, e: OSError) -> "InputError":
    """An input that cannot be opened, in one line naming it ("t.gz: no such file")."""
    if isinstance(e, FileNotFoundError):
        what = "no such file"
    elif isinstance(e, IsADirectoryError):
        what = "is a folder, not a file"
    else:
        what = (e.strerror or type(e).__name__).lower()
    return InputError(path, None, what)


def _open(path: str) -> tuple[BinaryIO, bool]:
    """`open_input`'s stream, and whether it is a plain (not compressed) file that can seek."""
    if path == "-":
        source = sys.stdin.buffer
    else:
        try:
            source = open(path, "rb", buffering=0)
        except OSError as e:
            raise _open_error(path, e) from None
    try:
        try:
            start = source.tell() if source.seekable() else None
        except OSError:
            start = None
        head = _read_exactly(source, len(GZIP_MAGIC))
        if start is not None:
            source.seek(start)
        if head == GZIP_MAGIC:
            if start is None:  # not read again on failure: the threaded reader's error is the one raised
                source = io.BufferedReader(_Prefixed(head, source), buffer_size=1 << 17)
            return io.BufferedReader(_GzipFile(path, source, start), buffer_size=1 << 17), False
        if start is None:
            return io.BufferedReader(_Prefixed(head, source), buffer_size=1 << 20), False
        return (io.BufferedReader(source, buffer_size=1 << 20) if path != "-" else source), True
    except BaseException:
        source.close()
        raise


def open_input(path: str) -> BinaryIO:
    """Open the input `path` for binary reading: a file, a gzip file (decompressed, `_GzipFile`), a pipe or
    FIFO (`<(...)`, /dev/fd/N) or '-' (stdin). The input is opened once and each byte read once, whatever
    it is (see the module's docstring). An input that cannot be opened is an InputError naming it."""
    return _open(path)[0]


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
    lineno = 0
    try:
        with contextlib.closing(open_input(path)) as f:
            for lineno, raw in enumerate(f, 1):
                if not raw.endswith(b"\n"):  # the last line: not one cut by damage
                    _raise_held_error(f)
                line = decode_line(raw, path, lineno)
                yield lineno, (line if keepends else line.rstrip("\r\n"))
            _raise_held_error(f)
    except GZIP_ERRORS as e:  # raised by the decompressor only: a consumer's errors never enter a generator
        raise gzip_error(path, lineno, e) from None


BLOCK_BYTES = 1 << 20  # bytes read at a time by `iter_line_blocks`


def iter_line_blocks(path: str, lines: int, start: int = 0, first_line: int = 1,
                     max_lines: int | None = None) -> Iterator[tuple[int, bytes]]:
    """Yield (number of the first line, bytes of `lines` consecutive lines, endings kept); the last
    block may be shorter, and its last line may lack a newline.

    The stream is read in blocks of `BLOCK_BYTES` and cut at newlines found with numpy, so no
    per-line object is made. `start` (plain files only) is the byte offset of a line start to begin
    at, `first_line` the number of that line; `max_lines` stops after that many lines.
    """
    if lines < 1:
        raise ValueError(f"lines per block must be at least 1, got {lines}")
    first, done, have = first_line, 0, 0  # `have`: complete lines held in `pieces`
    pieces: list[bytes] = []
    want = lines if max_lines is None else min(lines, max_lines)
    try:
        f, plain_file = _open(path)
        with contextlib.closing(f):
            if start:
                if not plain_file:
                    raise ValueError(f"{path}: cannot start reading a compressed stream or a pipe at byte {start}")
                f.seek(start, os.SEEK_CUR)
            while want > 0:
                chunk = f.read(BLOCK_BYTES)
                if not chunk:
                    break
                newlines = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 10)
                used, cut = 0, 0  # newlines of this chunk consumed; bytes of it consumed
                while want > 0 and len(newlines) - used >= want - have:
                    used += want - have
                    end = int(newlines[used - 1]) + 1
                    pieces.append(chunk[cut:end])
                    cut = end
                    block, pieces, have = b"".join(pieces), [], 0
                    yield first, block
                    first, done = first + want, done + want
                    want = lines if max_lines is None else min(lines, max_lines - done)
                if want > 0:
                    pieces.append(chunk[cut:])
                    have += len(newlines) - used
            tail = b"".join(pieces)
            if want > 0:
                _raise_held_error(f)
            if want > 0 and tail:
                yield first, tail
    except GZIP_ERRORS as e:  # the lines of the block being read are lost with the stream
        raise gzip_error(path, first - 1 + have, e) from None


def count_lines(block: bytes) -> int:
    """Lines in a block of text: its newlines, plus a last line without one."""
    return block.count(b"\n") + (bool(block) and not block.endswith(b"\n"))


def count_newlines(path: str, lo: int, hi: int) -> int:
    """Newlines in bytes [lo, hi) of a plain (not compressed) file."""
    n = 0
    with open(path, "rb", buffering=0) as f:
        f.seek(lo)
        left = hi - lo
        while left > 0 and (chunk := f.read(min(BLOCK_BYTES, left))):
            n += chunk.count(b"\n")
            left -= len(chunk)
    return n


def after_newlines(path: str, offset: int, k: int) -> int:
    """Byte offset just after the k-th newline (k >= 1) at or after `offset` in a plain file; the
    file's size if it has fewer."""
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        pos = offset
        while chunk := f.read(BLOCK_BYTES):
            found = chunk.count(b"\n")
            if found >= k:
                end = -1
                for _ in range(k):
                    end = chunk.index(b"\n", end + 1)
                return pos + end + 1
            k -= found
            pos += len(chunk)
    return pos


class InputError(UserError):
    """Bad input: carries the file and line number it was found at (None: about the file as a whole)."""

    def __init__(self, path: str, lineno: int | None, message: str):
        self.path, self.lineno, self.message = path, lineno, message
        super().__init__(f"{path}: {message}" if lineno is None else f"{path}:{lineno}: {message}")

    def __reduce__(self):  # survives the trip back from a worker process
        return (type(self), (self.path, self.lineno, self.message))


def check_inputs(paths: Iterable[str | None]) -> None:
    """Refuse, in one line naming it, an input (None: not given; '-': stdin) that does not exist or is a
    folder: what a command checks before it loads a model. Only `stat`ed, never opened: a FIFO opened and
    closed here would lose its writer. Stdin can be one input only: the first would read it to its end."""
    paths = [p for p in paths if p is not None]
    if paths.count("-") > 1:
        raise UserError("stdin ('-') is given as more than one input: it can be read once")
    for path in paths:
        if path == "-":
            continue
        try:
            info = os.stat(path)
        except OSError as e:
            raise _open_error(path, e) from None
        if stat.S_ISDIR(info.st_mode):
            raise _open_error(path, IsADirectoryError())
