"""Faults of processes and their resources (issue 21, Reliability 4-6): worker processes that outlive their
parent, the CSLM server when file descriptors run out, part files of failed torchrun runs, --workers above
the core count; and two input faults met while scoring (gzip with trailing garbage, a huge phrase).

Each test runs the real command in a process of its own where a process's life is the point; timing
limits are loose (seconds), so that a loaded 2-core machine passes them.
"""

from __future__ import annotations

import gzip
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from moses_rnn.scoring.pool import WORKER_TAG
from test_faults import assert_nothing_left, assert_one_line_error, group_members, run, tiny_cslm  # noqa: F401


# -- helpers ------------------------------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (/proc), in clock ticks."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return float(fields[11]) + float(fields[12])


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def default_sighup() -> None:
    """preexec_fn of the processes that tests send SIGHUP to: SIGHUP as a terminal delivers it, even when the
    test run itself was started under nohup (an ignored signal stays ignored across exec, and the commands
    rightly keep it so)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def kill_group(pgid: int) -> None:
    """Kill whatever a failed test left of process group `pgid` (the test's own processes only)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def table_bytes(example_table: Path, size: int) -> bytes:
    """Lines of the example table, repeated to at least `size` bytes."""
    text = example_table.read_bytes()
    return text * (size // len(text) + 1)


# -- 4. worker processes die with their parent ---------------------------------------------------------------------
def start_scoring_from_a_held_pipe(tiny_model, example_table, out: Path) -> tuple[subprocess.Popen, int]:
    """`moses-rnn score - --workers 2` in a session of its own, reading a pipe held open: once it has scored the
    first megabyte it waits for more input, its worker idle. Returns the process and the worker's pid, once the
    worker has loaded the model and gone idle."""
    p = subprocess.Popen([sys.executable, "-m", "moses_rnn.cli", "score", "-", "-m", str(tiny_model), "-o", str(out),
                          "--workers", "2", "--window", "200", "--device", "cpu", "--quiet"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True, preexec_fn=default_sighup)
    data = table_bytes(example_table, 3 << 19)[: 3 << 19]  # 1.5 MB: the reader takes 1 MB, waits for 1 MB more
    p.stdin.write(data)
    p.stdin.flush()
    deadline = time.monotonic() + 90
    worker, last, quiet_since = None, None, None
    while time.monotonic() < deadline:
        assert p.poll() is None, p.communicate()[1].decode()
        if worker is None:
            worker = next((m for m in group_members(p.pid) if WORKER_TAG in cmdline(m)), None)
        else:
            t = cpu_seconds(worker)
            if t != last:
                last, quiet_since = t, time.monotonic()
            elif time.monotonic() - quiet_since > 1.0 and any(out.parent.glob(f".{out.name}.*.tmp")):
                return p, worker  # the worker has worked and waits for more
        time.sleep(0.1)
    kill_group(p.pid)
    raise AssertionError("the worker never went idle")


@pytest.mark.parametrize("how", ["SIGKILL", "SIGHUP"])
def test_workers_and_the_resource_tracker_exit_when_the_main_process_dies(how, tmp_path, tiny_model, example_table):
    """kill -9 of `moses-rnn score --workers 2` leaves no worker (nor any other helper process) behind;
    SIGHUP (a closed terminal) cleans up as SIGTERM does: exit 129, the temporary removed, the previous
    output untouched."""
    out = tmp_path / "out.gz"
    out.write_bytes(gzip.compress(b"previous\n"))
    p, worker = start_scoring_from_a_held_pipe(tiny_model, example_table, out)
    try:
        assert len(group_members(p.pid)) >= 2  # main, worker
        os.kill(p.pid, getattr(signal, how))
        rc = p.wait(60)
        assert_nothing_left(p.pid, grace=10)
        if how == "SIGHUP":
            err = p.stderr.read().decode()
            assert rc == 129 and "Traceback" not in err, err
            assert sorted(x.name for x in tmp_path.iterdir()) == ["out.gz"]
        assert gzip.decompress(out.read_bytes()) == b"previous\n"
    finally:
        kill_group(p.pid)
        p.stdin.close()


def test_a_helper_watching_its_parent_exits_without_prctl(tmp_path):
    """The portable fallback (a thread watching os.getppid()), without Linux's PR_SET_PDEATHSIG: a helper whose
    parent is killed exits on its own within a few seconds."""
    helper = ("import sys, time\n"
              "from mtcommon.runtime import exit_with_parent\n"
              "exit_with_parent(int(sys.argv[1]), poll=0.2, use_prctl=False)\n"
              "print('ready', flush=True)\n"
              "time.sleep(120)\n")
    parent = ("import os, subprocess, sys, time\n"
              f"h = subprocess.Popen([sys.executable, '-c', {helper!r}, str(os.getpid())], stdout=subprocess.PIPE)\n"
              "assert h.stdout.readline() == b'ready\\n'\n"
              "print(h.pid, flush=True)\n"
              "time.sleep(120)\n")
    p = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, start_new_session=True)
    try:
        helper_pid = int(p.stdout.readline())
        assert helper_pid in group_members(p.pid)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
        assert_nothing_left(p.pid, grace=10)
    finally:
        kill_group(p.pid)


def test_sighup_is_left_ignored_under_nohup():
    """Under nohup (SIGHUP ignored when the command starts) a closed terminal must not stop the run."""
    code = ("import signal\n"
            "from mtcommon.cliutil import exit_on_signals\n"
            "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
            "exit_on_signals()\n"
            "assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN\n"
            "signal.signal(signal.SIGHUP, signal.SIG_DFL)\n"
            "exit_on_signals()\n"
            "assert callable(signal.getsignal(signal.SIGHUP))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


# -- 5. the CSLM server under file-descriptor exhaustion ----------------------------------------------------------
def serve_with_open_file_limit(model_dir: Path, tmp_path: Path, nofile: int, *extra) -> tuple[subprocess.Popen, int, Path]:
    """`cslm serve` in a process whose open-file limit is `nofile` (as under `ulimit -n`); its stderr goes to a
    file. Returns the process, its port and the stderr file."""
    port_file, err = tmp_path / "port", tmp_path / "serve.err"
    boot = ("import resource, sys\n"
            f"resource.setrlimit(resource.RLIMIT_NOFILE, ({nofile}, {nofile}))\n"
            "from cslm.cli import main\n"
            "sys.argv[0] = 'cslm'\n"
            "main()\n")
    with open(err, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", boot, "serve", str(model_dir), "--port", "0", "--port-file",
                                 str(port_file), "--device", "cpu", *map(str, extra)],
                                stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True,
                                preexec_fn=default_sighup)
    deadline = time.monotonic() + 60
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            kill_group(proc.pid)
            raise AssertionError(f"the server did not start: {err.read_text()}")
        time.sleep(0.05)
    return proc, int(port_file.read_text()), err


def idle_sockets(port: int, count: int) -> list[socket.socket]:
    """`count` connections that never send a byte (connects still pending in the kernel included)."""
    socks = []
    for _ in range(count):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        socks.append(s)
    return socks


def answer_time(port: int, timeout: float = 20.0) -> tuple[float, dict]:
    """Seconds a fresh client takes to connect, score and ask for the statistics."""
    from cslm.client import Client

    t0 = time.monotonic()
    with Client("127.0.0.1", port, timeout=timeout) as c:
        logp, _ = c.score(np.zeros((3, 7), np.int32))
        stats = c.stats()
    assert logp.shape == (3,) and np.isfinite(logp).all()
    return time.monotonic() - t0, stats


def stop_server(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(30)
    finally:
        kill_group(proc.pid)


def test_sighup_stops_the_server_as_sigterm_does(tmp_path, tiny_cslm):
    proc, port, err = serve_with_open_file_limit(tiny_cslm, tmp_path, 1024)
    try:
        answer_time(port)
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(30) == 0
    finally:
        kill_group(proc.pid)
    assert "cslm: server stopped after" in err.read_text()


def test_idle_connections_cannot_lock_a_client_out_under_ulimit_256(tmp_path, tiny_cslm):
    """Under `ulimit -n 256`, 300 connections that say nothing: a real client is still answered at once (the
    least recently active idle connections are closed to make room), and stderr gets a line or two, not
    megabytes of accept() tracebacks."""
    proc, port, err = serve_with_open_file_limit(tiny_cslm, tmp_path, 256)
    socks = []
    try:
        socks = idle_sockets(port, 300)
        time.sleep(0.5)  # the server takes them in (those the kernel's accept queue dropped come back later)
        seconds, stats = answer_time(port)
        assert seconds < 5, seconds
        deadline = time.monotonic() + 20
        while stats["connections"]["total"] < 200 and time.monotonic() < deadline:  # well past the limit
            time.sleep(0.5)
            seconds, stats = answer_time(port)
            assert seconds < 5, seconds
        limit = stats["connection_limit"]
        assert stats["connections"]["total"] >= 200, stats["connections"]
        assert limit["max"] == 256 - 128 and limit["evicted"] > 0 and limit["refused"] == 0, limit
        assert stats["connections"]["open"] <= limit["max"], stats["connections"]
        assert stop_server(proc) == 0
    finally:
        for s in socks:
            s.close()
        kill_group(proc.pid)
    text, lines = rate_limited_lines(err, "connection limit (128, --max-connections)")
    assert any(line.endswith(" s)") and "more like this in the last" in line for line in lines), text


def rate_limited_lines(err: Path, event: str) -> tuple[str, list[str]]:
    """The server's stderr and its lines about `event`: stderr small and without a traceback, and the event
    logged one to four times (one line at once, then one per 10 s counting those held back)."""
    text = err.read_text()
    assert len(text) < 4000 and "Traceback" not in text, text[:4000]
    lines = [line for line in text.splitlines() if event in line]
    assert 1 <= len(lines) <= 4, text
    return text, lines


def test_accept_errors_are_one_line_per_interval_and_free_a_descriptor(tmp_path, tiny_cslm):
    """Descriptors run out all the same (the limit lowered under a running server, as another limit or a
    leak would): the failed accept()s (asyncio reports one per waiting connection, for ever) are one line per
    interval with a count, and each closes an idle connection, so that a real client gets in."""
    import resource

    proc, port, err = serve_with_open_file_limit(tiny_cslm, tmp_path, 256, "--max-connections", 100)
    socks = []
    try:
        resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (40, 40))  # below the connection limit
        socks = idle_sockets(port, 45)
        time.sleep(0.5)
        seconds, stats = answer_time(port)
        assert seconds < 15, seconds
        assert stats["connection_limit"]["evicted"] > 0, stats["connection_limit"]
        assert stop_server(proc) == 0
    finally:
        for s in socks:
            s.close()
        kill_group(proc.pid)
    text, lines = rate_limited_lines(err, "Too many open files")
    assert "socket.accept() out of system resource: Too many open files (open-file limit 40, " \
           "--max-connections 100)" in lines[0], text
    assert any("more like this in the last" in line for line in lines), text


@pytest.fixture
def cslm_engine(tiny_cslm):
    from cslm.engine import Engine

    return Engine.load(str(tiny_cslm), device="cpu")


def test_the_least_recently_active_idle_connection_goes_first(cslm_engine):
    from cslm import protocol as P
    from test_cslm_server import ServerThread, raw_connection, read_frame

    s = ServerThread(cslm_engine, max_connections=2, idle_timeout=30.0)
    try:
        a = raw_connection(s.port)
        b = raw_connection(s.port)
        a.sendall(P.frame(P.LOOKUP, 2, P.encode_lookup(["w1"])))  # a is now the more recently active
        assert read_frame(a)[:2] == (P.LOOKUP | P.REPLY, 2)
        c = raw_connection(s.port)  # at the limit: b, idle for longest, is closed
        assert read_frame(b) is None
        for sock, rid in ((a, 3), (c, 4)):
            sock.sendall(P.frame(P.LOOKUP, rid, P.encode_lookup(["w2"])))
            assert read_frame(sock)[:2] == (P.LOOKUP | P.REPLY, rid)
        for sock in (a, b, c):
            sock.close()
    finally:
        s.stop()


def test_a_new_connection_is_refused_with_an_error_frame_when_every_one_is_busy(cslm_engine):
    """A connection with a request in flight is never closed to make room: the newcomer gets ERROR 9 (busy),
    one line on the client's side, and gets in once a connection is idle again."""
    import numpy as np

    from cslm import protocol as P
    from cslm.client import Client, ServerError
    from test_cslm_server import ServerThread, raw_connection, read_frame
    from test_faults_server import ROWS, GatedEngine, wait_for

    gated = GatedEngine(cslm_engine)
    gated.gate.clear()
    s = ServerThread(gated, max_connections=1, idle_timeout=30.0)
    try:
        a = raw_connection(s.port)
        grams = np.ones((ROWS, 7), np.int32)
        a.sendall(P.frame(P.SCORE, 5, P.encode_score(grams)))
        wait_for(lambda: len(gated.batches) == 1, "a's request in the engine")  # a is busy
        with pytest.raises(ServerError, match="server busy: all 1 connections have requests in flight") as e:
            Client("127.0.0.1", s.port, timeout=10)
        assert e.value.code == P.E_BUSY == 9
        gated.gate.set()
        assert read_frame(a)[:2] == (P.SCORES, 5)
        with Client("127.0.0.1", s.port, timeout=10) as c:  # a is idle now: closed to make room
            assert c.lookup(["w1"]).tolist() == cslm_engine.vocab.encode(["w1"])
            stats = c.stats()
        assert read_frame(a) is None
        assert stats["connection_limit"] == {"max": 1, "evicted": 1, "refused": 1}
        a.close()
    finally:
        gated.gate.set()
        s.stop()


def test_the_default_connection_limit_follows_the_open_file_limit():
    from cslm.server import connection_limit
    from mtcommon.errors import UserError

    assert connection_limit(fds=256) == 128 and connection_limit(fds=1024) == 896
    assert connection_limit(fds=100) == 50 and connection_limit(fds=2) == 1
    assert connection_limit(500, fds=1024) == 500
    with pytest.raises(UserError, match=r"--max-connections 2000 needs more open files than this process may "
                                        r"have \(ulimit -n 1024: at most 896 connections\)"):
        connection_limit(2000, fds=1024)


def test_an_impossible_connection_limit_is_one_line(tiny_cslm):
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        pytest.skip("no open-file limit")
    r = run("cslm", "serve", tiny_cslm, "--port", 0, "--max-connections", soft + 1, timeout=60)
    assert r.returncode == 1
    assert_one_line_error(r.stderr, f"--max-connections {soft + 1} needs more open files", f"ulimit -n {soft}")


def test_the_rate_limited_log_counts_what_it_holds_back(capsys):
    """A thousand events of two kinds within an interval: each kind's first line at once, then one line per
    kind counting the rest when the interval ends; a later event is written at once again."""
    import asyncio
    import re

    from cslm.server import RateLimitedLog

    async def flood():
        log = RateLimitedLog(interval=0.5)
        for i in range(1000):
            log.event("accept", f"accept failed ({i})")
            log.event("other", "something else")
        await asyncio.sleep(2.0)
        log.event("accept", "accept failed (late)")
        log.close()

    asyncio.run(flood())
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 5, lines
    assert lines[:2] == ["accept failed (0)", "something else"] and lines[4] == "accept failed (late)", lines
    # the two kinds' summaries end their intervals at the same moment: either may come first
    summaries = sorted(lines[2:4])
    assert re.fullmatch(r"accept failed \(999\) \(999 more like this in the last \d\.\d s\)", summaries[0]), lines
    assert re.fullmatch(r"something else \(999 more like this in the last \d\.\d s\)", summaries[1]), lines


def test_a_bug_in_the_event_loop_keeps_its_traceback_but_not_a_thousand_times(cslm_engine, capsys):
    import asyncio

    from cslm.server import Server, ServerConfig

    async def go():
        srv = Server(cslm_engine, ServerConfig(port=0, log_interval=60))
        await srv.start()
        loop = asyncio.get_running_loop()
        for _ in range(1000):
            try:
                raise KeyError("a bug")
            except KeyError as e:
                loop.call_exception_handler({"message": "Exception in callback", "exception": e})
        srv.request_shutdown()
        await srv.wait_closed()

    asyncio.run(go())
    err = capsys.readouterr().err
    assert err.count("Traceback") == 1 and "KeyError: 'a bug'" in err, err
    assert "cslm: Exception in callback (999 more like this in the last" in err, err


# -- 6. smaller faults --------------------------------------------------------------------------------------------
# gzip followed by bytes that are not gzip: what `gzip -d` does, the readers do
@pytest.fixture(scope="module")
def gz_table(example_table) -> tuple[bytes, bytes]:
    """(text, gzip) of the example table 50 times: 20,200 lines."""
    text = example_table.read_bytes() * 50
    return text, gzip.compress(text, compresslevel=1)


def gzip_verdict(path: Path) -> tuple[int, str]:
    """`gzip -dc`'s exit status and stderr for `path` (0 ok, 1 error, 2 warning)."""
    r = subprocess.run(["gzip", "-dc", str(path)], capture_output=True, timeout=60)
    return r.returncode, r.stderr.decode()


@pytest.mark.parametrize("tail, gzip_status", [
    (b"garbage after the stream\n", 2),  # gzip: "decompression OK, trailing garbage ignored"
    (b"xy", 2),
    (bytes(512), 0),  # zero padding (a tar block): ignored silently
    (b"\0\0\x01", 2),
])
def test_trailing_garbage_is_ignored_with_a_warning_as_gzip_does(tail, gzip_status, tmp_path, gz_table, capfd):
    from mtcommon.textio import iter_line_blocks, iter_lines

    text, blob = gz_table
    path = tmp_path / "t.gz"
    path.write_bytes(blob + tail)
    if shutil.which("gzip"):
        assert gzip_verdict(path)[0] == gzip_status
    lines = text.splitlines(keepends=True)
    assert [line.encode() for _, line in iter_lines(str(path), keepends=True)] == lines
    assert b"".join(b for _, b in iter_line_blocks(str(path), 3000)) == text
    err = capfd.readouterr().err
    if gzip_status == 0:
        assert err == ""
    else:
        warning = f"warning: {path}: {len(tail)} bytes of trailing garbage after the gzip data ignored (as gzip -d does)\n"
        assert err == warning * 2, err


@pytest.mark.parametrize("damage", ["one byte", "a member cut short", "a stream cut short"])
def test_a_damaged_end_names_the_last_line_read(damage, tmp_path, gz_table):
    """A single byte after the data (gzip: "unexpected end of file"), a second member cut short, or the stream
    itself cut short: a truncated stream, after the line where the good data ends, in every reader (the fast
    reader alone said "after line 0", or a line a megabyte too early)."""
    from mtcommon.textio import InputError, iter_line_blocks, iter_lines

    text, blob = gz_table
    if damage == "one byte":
        data, good = blob + b"x", text.count(b"\n")
    elif damage == "a member cut short":
        data, good = blob + gzip.compress(b"one more line\n")[:15], text.count(b"\n")
    else:
        data = blob[: len(blob) - 200]
        good = subprocess.run(["gzip", "-dc"], input=data, capture_output=True).stdout.count(b"\n") \
            if shutil.which("gzip") else None
    path = tmp_path / "t.gz"
    path.write_bytes(data)
    if shutil.which("gzip"):
        status, err = gzip_verdict(path)
        assert status == 1 and "unexpected end of file" in err
    readers = {"lines": lambda: list(iter_lines(str(path))), "blocks": lambda: list(iter_line_blocks(str(path), 3000))}
    for name, read in readers.items():
        with pytest.raises(InputError) as e:
            read()
        message = str(e.value)
        assert message.startswith(f"{path}: truncated gzip stream after line "), (name, message)
        if good is not None:
            assert message == f"{path}: truncated gzip stream after line {good}", (name, message)


def test_score_reads_a_table_with_trailing_garbage_and_says_so(tmp_path, example_table, tiny_model):
    table = tmp_path / "t.gz"
    table.write_bytes(gzip.compress(example_table.read_bytes()) + b"\n\n-- end of copy --\n")
    out = tmp_path / "out.gz"
    r = run("moses-rnn", "score", table, "-m", tiny_model, "-o", out, "--quiet")
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith(f"warning: {table}: 20 bytes of trailing garbage after the gzip data ignored"), r.stderr
    assert len(gzip.decompress(out.read_bytes()).splitlines()) == len(example_table.read_bytes().splitlines())


# a huge phrase: a limit in words, an error naming the line
def test_a_huge_phrase_is_refused_naming_its_line(tmp_path, example_table, tiny_model):
    """A 1 MB phrase took 840 MB and 90 s: now a one-line error naming FILE:LINE, at once, in the worker
    processes too; --max-phrase-words moves the limit."""
    from click.testing import CliRunner

    from moses_rnn.cli import main

    lines = example_table.read_text(encoding="utf-8").splitlines(keepends=True)
    huge = " ".join(["livre"] * 200_000)  # 1.2 MB
    lines.insert(300, f"a big book ||| {huge} ||| 0.5 0.5 0.5 0.5\n")
    table = tmp_path / "t.txt"
    table.write_text("".join(lines), encoding="utf-8")
    out = tmp_path / "out.gz"
    t0 = time.monotonic()
    r = run("moses-rnn", "score", table, "-m", tiny_model, "-o", out, "--window", 100, "--workers", 2, "--quiet")
    assert r.returncode == 1 and time.monotonic() - t0 < 60
    assert_one_line_error(r.stderr, f"{table}:301: target phrase of 200000 words, more than the limit of 1000",
                          "--max-phrase-words")
    assert not out.exists()
    assert_nothing_left(r.pid)

    small = tmp_path / "small.txt"
    small.write_text("".join(lines[:10]) + f"{' '.join(['big'] * 40)} ||| un livre ||| 0.5 0.5 0.5 0.5\n",
                     encoding="utf-8")
    score = ["score", str(small), "-m", str(tiny_model), "-o", str(out), "--quiet", "--max-phrase-words"]
    r = CliRunner().invoke(main, [*score, "39"])
    assert r.exit_code == 1
    assert_one_line_error(r.output, f"{small}:11: source phrase of 40 words, more than the limit of 39")
    r = CliRunner().invoke(main, [*score, "40"])
    assert r.exit_code == 0 and len(gzip.decompress(out.read_bytes()).splitlines()) == 11


def test_the_phrase_limit_is_the_same_in_the_library_and_the_command_line():
    import inspect

    import click

    from moses_rnn.commands.score import score
    from moses_rnn.scoring.table import score_table
    from moses_rnn.scoring.window import MAX_PHRASE_WORDS, TableJob

    option = next(p for p in score.params if isinstance(p, click.Option) and p.name == "max_phrase_words")
    assert option.default == MAX_PHRASE_WORDS == TableJob("t", 4).max_words
    assert inspect.signature(score_table).parameters["max_words"].default == MAX_PHRASE_WORDS


# --workers above the core count: one line of warning
@pytest.mark.parametrize("workers, local, warned", [(1, 1, False), (2, 1, False), (64, 1, True), (2, 40, True)])
def test_workers_far_above_the_cores_are_warned_about(workers, local, warned, monkeypatch):
    from moses_rnn.scoring import table

    monkeypatch.setattr(table, "cpu_count", lambda: 4)
    w = table.workers_warning(workers, local)
    assert (w is not None) == warned
    if warned:
        assert w.startswith(f"moses-rnn: warning: --workers {workers}") and "4 cores" in w and "\n" not in w


def test_score_warns_once_about_too_many_workers(tmp_path, example_table, tiny_model):
    """The warning comes once, before any work (here an empty table, refused before a worker starts)."""
    from click.testing import CliRunner

    from moses_rnn.cli import main
    from mtcommon.runtime import cpu_count

    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    many = max(cpu_count(), 2) * 4
    r = CliRunner().invoke(main, ["score", str(empty), "-m", str(tiny_model), "-o", str(tmp_path / "out.gz"),
                                  "--workers", str(many), "--quiet"])
    assert r.exit_code == 1
    assert r.output.splitlines() == [
        f"moses-rnn: warning: --workers {many}: more scoring processes than the {cpu_count()} cores this process "
        f"may use; the extra ones add memory and start-up time, not speed",
        f"Error: {empty}: the phrase table is empty (no lines)"], r.output
    r = CliRunner().invoke(main, ["score", str(empty), "-m", str(tiny_model), "-o", str(tmp_path / "out.gz"),
                                  "--workers", "2", "--quiet"])
    assert "warning" not in r.output


# part files of failed torchrun runs
def random_table(example_table: Path, path: Path, lines: int) -> Path:
    """`lines` random phrase pairs over the example table's words: distinct phrases, so scoring takes a while."""
    import random

    rng = random.Random(1)
    pairs = [line.split(" ||| ")[:2] for line in example_table.read_text(encoding="utf-8").splitlines()]
    src = sorted({w for s, _ in pairs for w in s.split()})
    tgt = sorted({w for _, t in pairs for w in t.split()})
    rows = (f"{' '.join(rng.choices(src, k=rng.randint(1, 5)))} ||| {' '.join(rng.choices(tgt, k=rng.randint(1, 5)))}"
            f" ||| 0.5 0.5 0.5 0.5\n" for _ in range(lines))
    path.write_text("".join(rows), encoding="utf-8")
    return path


def test_a_torchrun_rank_killed_outright_leaves_no_part_file(tmp_path, example_table, tiny_model):
    """A part file left by an earlier run killed outright (its process gone) is removed when the next run
    starts; when a rank of that run is killed with SIGKILL, the run fails and the survivors remove the dead
    rank's part too: nothing is left beside the previous output, which is untouched."""
    from mtcommon.outputs import _host_tag

    table = random_table(example_table, tmp_path / "table.txt", 200_000)
    out = tmp_path / "out.gz"
    out.write_bytes(gzip.compress(b"previous\n"))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".out.gz.{_host_tag()}-{int(dead.stdout)}.part1.abcd1234.tmp"
    stale.write_bytes(b"left by a run killed outright\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "moses_rnn.cli", "score", str(table), "-m", str(tiny_model), "-o", str(out),
                          "--window", "256", "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                         start_new_session=True)
    try:
        deadline, victim = time.monotonic() + 120, None
        while victim is None and time.monotonic() < deadline and p.poll() is None:
            parts = [x.name for x in tmp_path.glob(".out.gz.*.part1.*.tmp") if x != stale]
            if parts:
                victim = int(parts[0].split(f"{_host_tag()}-")[1].split(".")[0])
            time.sleep(0.02)
        assert victim is not None, p.communicate(timeout=60)[1].decode()[-3000:]
        assert not stale.exists()  # removed as the run started
        os.kill(victim, signal.SIGKILL)
        _, err = p.communicate(timeout=180)
        assert p.returncode != 0, err.decode()[-3000:]
        assert gzip.decompress(out.read_bytes()) == b"previous\n"
        assert sorted(x.name for x in tmp_path.iterdir()) == ["out.gz", "table.txt"]
        assert_nothing_left(p.pid)
    finally:
        kill_group(p.pid)
