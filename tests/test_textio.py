"""textio: cut and corrupt gzip input named in one line; temporaries of killed runs cleaned up, live ones kept."""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys

import pytest

from moses_rnn.formats.phrasetable import read_phrase_table
from mtcommon import outputs
from mtcommon.textio import InputError, iter_line_blocks, iter_lines
from mtcommon.outputs import atomic_output

LINES = [f"source {i} ||| cible {i} ||| 0.5 0.25\n" for i in range(60000)]


@pytest.fixture(scope="module")
def gz_bytes() -> bytes:
    return gzip.compress("".join(LINES).encode("utf-8"), compresslevel=1)


def test_truncated_gzip_names_the_file_and_the_last_line(tmp_path, gz_bytes):
    cut = tmp_path / "cut.gz"
    cut.write_bytes(gz_bytes[: len(gz_bytes) // 2])  # a half-copied file
    got = []
    with pytest.raises(InputError) as e:
        for lineno, line in iter_lines(str(cut), keepends=True):
            got.append(line)
    n = len(got)
    assert 0 < n < len(LINES) and got == LINES[:n]  # what was read is right, and nothing more
    assert str(e.value) == f"{cut}: truncated gzip stream after line {n}"
    with pytest.raises(InputError, match=r"cut\.gz: truncated gzip stream after line \d+$"):
        for _ in iter_line_blocks(str(cut), 1000):
            pass
    with pytest.raises(InputError, match="truncated gzip stream"):
        list(read_phrase_table(str(cut)))
    header_only = tmp_path / "header.gz"
    header_only.write_bytes(gz_bytes[:3])
    with pytest.raises(InputError, match="truncated gzip stream after line 0"):
        list(iter_lines(str(header_only)))


@pytest.mark.parametrize("where", ["crc", "deflate"])
def test_corrupt_gzip_is_named_too(tmp_path, gz_bytes, where):
    bad = bytearray(gz_bytes)
    if where == "crc":
        bad[-8] ^= 0xFF  # the CRC-32 of the trailer
    else:
        for k in range(len(bad) // 3, len(bad) // 3 + 64):
            bad[k] = 0xFF
    path = tmp_path / "bad.gz"
    path.write_bytes(bytes(bad))
    with pytest.raises(InputError) as e:
        list(iter_lines(str(path)))
    # damaged deflate data may also decode to bytes that are not UTF-8 before the decoder notices
    assert str(e.value).startswith(f"{path}: corrupt gzip stream after line ") or "invalid UTF-8" in str(e.value)
    if where == "crc":
        assert "CRC" in str(e.value)


def test_input_error_without_a_line_survives_pickling():
    import pickle

    e = pickle.loads(pickle.dumps(InputError("t.gz", None, "truncated gzip stream after line 7")))
    assert str(e) == "t.gz: truncated gzip stream after line 7" and e.lineno is None


# -- temporaries of killed runs ---------------------------------------------------------
def temporaries(folder, name="out.gz"):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(f".{name}."))


def test_temporary_name_carries_host_and_pid(tmp_path):
    out = tmp_path / "out.gz"
    with atomic_output(str(out)) as f:
        f.write(b"x\n")
        tmp = temporaries(tmp_path)[0]
        assert tmp.startswith(f".out.gz.{outputs._host_tag()}-{os.getpid()}.") and tmp.endswith(".tmp")
    assert temporaries(tmp_path) == []


def test_stale_temporaries_of_dead_runs_are_removed_live_ones_kept(tmp_path):
    host = outputs._host_tag()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = {
            "dead": f".out.gz.{host}-{dead.pid}.k3j_x9.tmp",
            "live": f".out.gz.{host}-{live.pid}.a8b7c6.tmp",
            "other host": f".out.gz.{'0' * 8 if host != '0' * 8 else '1' * 8}-{dead.pid}.zzz.tmp",
            "old style": ".out.gz.q1w2e3.tmp",
            "other output": f".other.gz.{host}-{dead.pid}.abc.tmp",
        }
        for n in names.values():
            (tmp_path / n).write_bytes(b"partial")
        with atomic_output(str(tmp_path / "out.gz")) as f:
            f.write(b"new\n")
        left = set(p.name for p in tmp_path.iterdir())
        assert names["dead"] not in left
        assert {names["live"], names["other host"], names["old style"], names["other output"], "out.gz"} <= left
    finally:
        live.kill()
        live.wait()


def test_kill_9_leftover_is_removed_by_the_next_run(tmp_path):
    """A writer killed with SIGKILL leaves its temporary; the next run writing the same output removes it."""
    out = tmp_path / "out.gz"
    out.write_bytes(gzip.compress(b"previous\n"))
    code = ("import sys, time\n"
            "from mtcommon.outputs import atomic_output\n"
            f"with atomic_output({str(out)!r}) as f:\n"
            "    f.write(b'partial ' * 10000)\n"
            "    print('writing', flush=True)\n"
            "    time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "writing\n"
        left = temporaries(tmp_path)
        assert len(left) == 1 and f"-{child.pid}." in left[0]
        # while the writer lives, another run leaves its temporary alone
        with atomic_output(str(tmp_path / "out.gz")) as f:
            f.write(b"other\n")
        assert temporaries(tmp_path) == left
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert temporaries(tmp_path) == left  # kill -9: no clean-up possible
        with atomic_output(str(out)) as f:
            f.write(b"next\n")
        assert temporaries(tmp_path) == [] and gzip.decompress(out.read_bytes()) == b"next\n"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
