"""The worker processes of `moses-rnn score --workers N`: the same bytes as one process, and signals that stop a run
without a traceback from any helper process and without leaking system resources.

The signal tests run the real command in a session of its own, reading a pipe held open, so that its worker has
loaded the model and waits for more input when the signal comes; their time limits are loose (seconds).
"""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from moses_rnn.cli import main
from test_faults import assert_nothing_left, group_members
from test_faults_processes import cpu_seconds, default_sighup, kill_group, table_bytes


def test_worker_processes_write_the_single_process_bytes(tmp_path, example_table, tiny_model):
    """The example table in windows of 64 lines, by one process and by two (each taking windows), plain and
    gzip: the same bytes."""
    outs = {}
    for name, extra in [("one.txt", []), ("two.txt", ["--workers", "2"]), ("two.gz", ["--workers", "2"])]:
        r = CliRunner().invoke(main, ["score", str(example_table), "-m", str(tiny_model), "-o", str(tmp_path / name),
                                      "--window", "64", "--unknown", "--device", "cpu", "--quiet", *extra])
        assert r.exit_code == 0, r.output
        outs[name] = (tmp_path / name).read_bytes()
    assert outs["one.txt"] == outs["two.txt"] == gzip.decompress(outs["two.gz"])
    assert len(outs["one.txt"].splitlines()) == len(example_table.read_bytes().splitlines())


def start_with_an_idle_worker(tiny_model, example_table, out: Path) -> subprocess.Popen:
    """`moses-rnn score - --workers 2` in a session of its own, reading a pipe held open: once it has scored the
    first megabyte it waits for more input. Returns once its worker has loaded the model, scored windows and gone
    idle."""
    p = subprocess.Popen([sys.executable, "-m", "moses_rnn.cli", "score", "-", "-m", str(tiny_model), "-o", str(out),
                          "--workers", "2", "--window", "200", "--device", "cpu", "--quiet"],
                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         start_new_session=True, preexec_fn=default_sighup)
    p.stdin.write(table_bytes(example_table, 3 << 19)[: 3 << 19])  # the reader takes 1 MB, waits for 1 MB more
    p.stdin.flush()
    deadline = time.monotonic() + 90
    last, quiet_since = None, None
    while time.monotonic() < deadline:
        assert p.poll() is None, p.communicate()[1].decode()
        helpers = [m for m in group_members(p.pid) if m != p.pid]
        try:
            busiest = max((cpu_seconds(m) for m in helpers), default=0.0)
        except OSError:
            busiest = 0.0
        if busiest != last:
            last, quiet_since = busiest, time.monotonic()
        elif busiest > 50 and time.monotonic() - quiet_since > 1.0 and any(out.parent.glob(f".{out.name}.*.tmp")):
            return p  # a helper has loaded the model (half a CPU-second and more), worked, and waits
        time.sleep(0.1)
    kill_group(p.pid)
    raise AssertionError("the worker never went idle")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sighup_to_the_process_group_stops_the_run_without_a_traceback(tmp_path, tiny_model, example_table):
    """A closed terminal sends SIGHUP to every process of the foreground group, the workers (and any helper of
    theirs) included: the command exits 129 through its clean-up, nothing prints a traceback, no process is left,
    the previous output is untouched and no temporary stays."""
    out = tmp_path / "out.gz"
    out.write_bytes(gzip.compress(b"previous\n"))
    p = start_with_an_idle_worker(tiny_model, example_table, out)
    try:
        os.killpg(p.pid, signal.SIGHUP)
        rc = p.wait(60)
        assert_nothing_left(p.pid, grace=10)
        err = p.stderr.read().decode()
        assert rc == 129, err
        assert "Traceback" not in err and "Error" not in err and "leaked" not in err, err
        assert sorted(x.name for x in tmp_path.iterdir()) == ["out.gz"]
        assert gzip.decompress(out.read_bytes()) == b"previous\n"
    finally:
        kill_group(p.pid)
        p.stdin.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_kill_9_of_the_main_process_leaks_nothing(tmp_path, tiny_model, example_table):
    """kill -9 of the main process alone: its workers go with it, and nothing is left to clean up after it (no
    'leaked semaphore objects' from a resource tracker)."""
    out = tmp_path / "out.gz"
    p = start_with_an_idle_worker(tiny_model, example_table, out)
    try:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(60)
        assert_nothing_left(p.pid, grace=10)
        err = p.stderr.read().decode()  # every holder of the pipe is gone: read to its end
        assert "leaked" not in err and "Traceback" not in err, err
    finally:
        kill_group(p.pid)
        p.stdin.close()
