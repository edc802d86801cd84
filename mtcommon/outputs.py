"""Writing results safely: the one check of a command's files, atomic outputs and their temporaries.

`check_paths` is the one check of a command's files before any work (inputs
that exist, an output that is not one of them: `check_output`, which
`atomic_output` applies too, so no command can write over its own input).

`atomic_output` writes to a temporary file in the destination's folder and
renames it over the destination only when the block finishes without an
exception, so an interrupted or failed run never leaves a partial file and
never touches a previous output. A `.gz` destination is compressed with
ISA-L's multi-threaded gzip writer (`benchmarks/bench_rewrite.py` times it
against `gzip -c`: docs/scoring.md, "The rewrite with a small model"). The
temporary carries the writer's host and process id; a killed run's leftover
(kill -9 gives no chance to clean up) is removed by the next run writing the
same output once that process is gone, and a live run's never is.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import sys
import tempfile
from typing import BinaryIO, Iterable, Iterator

from isal import igzip_threaded

from .errors import UserError
from .textio import BLOCK_BYTES, check_inputs


def default_threads() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def _host_tag() -> str:
    """8 hex digits naming this machine, so that a folder shared between hosts (NFS) never
    has one host judge another's process ids."""
    return hashlib.sha1(socket.gethostname().encode("utf-8", "replace")).hexdigest()[:8]


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` runs on this host (one of another user counts as alive; a zombie, dead but
    not yet reaped by its parent, does not)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:  # gone meanwhile, or no /proc to tell (not Linux: alive, as kill() said)
        return not os.path.exists("/proc/self/stat")
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] != b"Z"


def remove_stale_temporaries(folder: str, name: str) -> list[str]:
    """Remove the temporaries `.NAME.HOST-PID.XXXX.tmp` that `atomic_output` runs killed
    without clean-up (kill -9, power loss) left in `folder`: those of this host whose
    process is gone. A live run's temporary, another host's and any other file stay.
    Returns the names removed."""
    pattern = re.compile(re.escape(f".{name}.{_host_tag()}-") + r"(\d+)\.[^/]*\.tmp\Z")
    removed = []
    try:
        entries = os.listdir(folder)
    except OSError:
        return removed
    for entry in entries:
        m = pattern.match(entry)
        if m is None or int(m.group(1)) == os.getpid() or pid_alive(int(m.group(1))):
            continue
        try:
            os.unlink(os.path.join(folder, entry))
        except OSError:  # removed by another run first, or another user's in a sticky folder
            continue
        removed.append(entry)
    return removed


def new_file_mode() -> int:
    """The mode `open` gives a new file: 0666 less the process's umask."""
    try:  # Linux: read without changing it, so no other thread ever sees a different umask
        with open("/proc/self/status", encoding="ascii") as f:
            mask = next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask


def sibling_temporary(path: str, label: str = "") -> str:
    """Create an empty temporary file beside `path`, `.NAME.HOST-PID.[LABEL.]XXXX.tmp` (`atomic_output`'s
    have no label), so the one a killed run leaves behind is removed by `remove_stale_temporaries`.
    Returns its path; the caller removes it."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.{_host_tag()}-{os.getpid()}."
                                      + (f"{label}." if label else ""), suffix=".tmp", dir=folder)
    os.close(fd)
    return tmp


class _FixedBlocks:
    """A write-only stream that hands `raw` exactly `size` bytes at a time (the rest at close).

    ISA-L's threaded writer compresses each block it is given on its own (with the previous one as
    dictionary), so its output depends on how the text was cut into writes. Cutting it into blocks
    of a fixed size makes the compressed file a function of its text alone: a table written in one
    process and the same table joined from the parts of a sharded run are the same bytes.
    """

    def __init__(self, raw: BinaryIO, size: int = BLOCK_BYTES):
        self.raw, self.size = raw, size
        self.buffer = bytearray()

    def write(self, data) -> int:
        self.buffer += data
        if len(self.buffer) >= self.size:
            view = memoryview(self.buffer)
            whole = len(self.buffer) - len(self.buffer) % self.size
            for i in range(0, whole, self.size):
                self.raw.write(view[i : i + self.size])
            view.release()
            del self.buffer[:whole]
        return len(data)

    def flush(self) -> None:
        pass  # blocks are handed over whole; the remainder goes at close

    def close(self) -> None:
        if self.buffer:
            self.raw.write(bytes(self.buffer))
            self.buffer.clear()
        self.raw.close()


def check_output(path: str, inputs: Iterable[str | None] = ()) -> None:
    """Refuse, in one line naming it, an output `path` ('-': stdout, always fine) that `atomic_output` could
    not put in place: in a folder that does not exist, a folder itself, or the same file as one of `inputs`
    (also through a symbolic or hard link), which writing it would destroy."""
    if path == "-":
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UserError(f"{path}: the output folder {folder} does not exist")
    if os.path.isdir(path):
        raise UserError(f"{path}: is a folder; give the output a file name")
    try:
        out = os.stat(path)
    except OSError:  # not there yet (or a dangling link, which the output replaces): no input it can be
        return
    for given in inputs:
        if given is None or given == "-":
            continue
        try:
            same = os.path.samestat(out, os.stat(given))
        except OSError:
            continue
        if same:
            what = "an input" if given == path else f"the input {given} (the same file)"
            raise UserError(f"{path}: the output would overwrite {what}: give another output")


def check_paths(inputs: Iterable[str | None], output: str | None = None) -> None:
    """`check_inputs` and `check_output`: the one check of a command's files before it does any work."""
    inputs = list(inputs)
    check_inputs(inputs)
    if output is not None:
        check_output(output, inputs)


@contextlib.contextmanager
def atomic_output(path: str, compress: bool | None = None, threads: int | None = None,
                  inputs: Iterable[str | None] = ()) -> Iterator[BinaryIO]:
    """Yield a binary stream whose contents replace `path` only on success.

    `path` '-' writes to stdout (no atomicity is possible there). `compress`
    defaults to whether `path` ends in '.gz'. `path` must not be any of `inputs`
    (`check_output`). The temporary file,
    `.NAME.HOST-PID.XXXX.tmp` beside `path`, is removed on any failure; those
    of killed runs of this host are removed first (`remove_stale_temporaries`).
    """
    check_output(path, inputs)
    if path == "-":
        out = sys.stdout.buffer
        yield out
        out.flush()
        return
    if compress is None:
        compress = path.endswith(".gz")
    folder = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)
    remove_stale_temporaries(folder, name)
    tmp = sibling_temporary(path)
    try:
        if compress:
            stream = _FixedBlocks(igzip_threaded.open(tmp, "wb", threads=threads or default_threads()))
        else:
            stream = open(tmp, "wb", buffering=1 << 20)
        try:
            yield stream
        finally:
            stream.close()
        os.chmod(tmp, new_file_mode())  # mkstemp's 0600 would hide the output from the user's group and others
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
