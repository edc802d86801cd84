"""pipelines/cslm_server.py (`mt.py with-cslm`): one CSLM server shared by the commands that run at once.

A fake `cslm` stands in for the real one: it listens on the port it is given, notes each start in a file
and stops on SIGTERM, so that what is tested is the sharing, not the model."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MT = ROOT / "pipelines" / "mt.py"
sys.path.insert(0, str(ROOT / "pipelines"))
import cslm_server  # noqa: E402
from cslm_server import answers  # noqa: E402

FAKE = textwrap.dedent("""\
    import os, signal, socket, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
    except OSError as e:
        sys.exit(f"Error: port {port}: {e}")
    s.listen(16)
    with open(os.environ["FAKE_STARTS"], "a") as f:
        f.write(" ".join(sys.argv[1:]) + "\\n")
    with open(os.environ["FAKE_STARTS"] + ".pids", "a") as f:
        f.write(f"{os.getpid()}\\n")
    print("serving", flush=True)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    while True:
        s.accept()[0].close()
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fake(tmp_path):
    exe = tmp_path / "cslm"
    exe.write_text(f"#!{sys.executable}\n" + FAKE)
    exe.chmod(0o755)
    (tmp_path / "model").mkdir()
    yield exe
    pids = tmp_path / "starts.pids"  # a failed test leaves no server behind
    for pid in pids.read_text().split() if pids.exists() else []:
        try:
            if str(tmp_path).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():  # that fake, not a pid reused
                os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass


def with_cslm(tmp_path, fake, port, *command, serve_args="--self-normalized", **kw):
    env = {"FAKE_STARTS": str(tmp_path / "starts"), "PATH": "/usr/bin:/bin"}
    return subprocess.Popen([sys.executable, str(MT), "with-cslm", "--cslm", str(fake), f"--serve-args={serve_args}",
                             "--wait", "30", str(tmp_path / "model"), str(port), "--", *command],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **kw)


def wait_for(path: Path, wrapper: subprocess.Popen) -> None:
    """Until `path` exists, while `wrapper` runs (30 s at most)."""
    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline and wrapper.poll() is None, wrapper.communicate()
        time.sleep(0.05)


def kill_a_wrapper(tmp_path, fake, port) -> None:
    """A wrapper killed outright (SIGKILL) while its command runs: its server outlives it."""
    running = tmp_path / "running"  # the command runs, a child of the wrapper: it stops once orphaned
    until_orphaned = (f"import os, time\nparent = os.getppid()\nopen({str(running)!r}, 'w').close()\n"
                      f"while os.getppid() == parent:\n    time.sleep(0.05)\n")
    killed = with_cslm(tmp_path, fake, port, sys.executable, "-c", until_orphaned)
    wait_for(running, killed)  # the server up, its user noted, the command started
    killed.kill()
    killed.wait()


def test_commands_at_once_share_one_server_which_stops_after_the_last(tmp_path, fake):
    """The second command joins the first one's server and still has it after the first has ended; the
    server stops with the last command and its state file goes with it."""
    port = free_port()
    probe = (f"import socket, time\nfor i in range(8):\n"
             f"    socket.create_connection(('127.0.0.1', {port}), timeout=1).close(); time.sleep(0.25)\n")
    first = with_cslm(tmp_path, fake, port, sys.executable, "-c", "import time; time.sleep(0.8)")
    wait_for(tmp_path / "model.serve.json", first)  # the first has its server
    second = with_cslm(tmp_path, fake, port, sys.executable, "-c", probe)
    assert first.wait(60) == 0, first.communicate()
    assert second.wait(60) == 0, second.communicate()  # reached the server 8 times over 2 s
    assert (tmp_path / "starts").read_text().splitlines() == [
        f"serve {tmp_path / 'model'} --port {port} --self-normalized"]  # one server, the options passed on
    assert not answers(port) and not (tmp_path / "model.serve.json").exists()
    assert (tmp_path / "model.serve.log").read_text() == "serving\n"


def test_many_commands_in_turn_and_at_once_leave_nothing_running(tmp_path, fake):
    port = free_port()
    runs = []

    def run(k):
        p = with_cslm(tmp_path, fake, port, sys.executable, "-c", f"import time; time.sleep({0.1 * (k % 3)})")
        runs.append(p.wait(60))

    threads = [threading.Thread(target=run, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join(90)
    assert runs == [0] * 6
    assert not answers(port) and not (tmp_path / "model.serve.json").exists()


def test_a_port_taken_by_another_program_is_refused_before_the_command(tmp_path, fake):
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen(1)
        port = other.getsockname()[1]
        p = with_cslm(tmp_path, fake, port, sys.executable, "-c", "open('ran', 'w')", cwd=tmp_path)
        out, err = p.communicate(timeout=60)
    assert p.returncode == 1 and not (tmp_path / "ran").exists() and not (tmp_path / "starts").exists()
    assert err.strip().splitlines() == [f"mt.py with-cslm: port {port} is taken by another program, not this run's "
                                         f"CSLM server: stop it, or choose another port (CSLM_PORT=...)"]


def test_a_server_that_cannot_start_is_one_line_with_its_last_words(tmp_path, fake):
    fake.write_text(f"#!{sys.executable}\nimport sys\nsys.exit('Error: the model is damaged')\n")
    p = with_cslm(tmp_path, fake, free_port(), sys.executable, "-c", "open('ran', 'w')", cwd=tmp_path)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 1 and not (tmp_path / "ran").exists()
    assert err.strip().splitlines() == [f"mt.py with-cslm: cslm serve {tmp_path / 'model'} exited with status 1: "
                                         f"Error: the model is damaged (its log: {tmp_path / 'model.serve.log'})"]


def test_a_server_whose_wrappers_were_killed_is_joined_and_stopped(tmp_path, fake):
    """SIGKILL leaves no chance to leave the server: the next command joins it (its users, by pid, are
    gone) and, being its only live user, stops it."""
    port = free_port()
    kill_a_wrapper(tmp_path, fake, port)
    assert answers(port)  # the server outlived its wrapper
    p = with_cslm(tmp_path, fake, port, sys.executable, "-c", f"import socket; socket.create_connection(('127.0.0.1', {port}))")
    assert p.wait(60) == 0, p.communicate()
    assert len((tmp_path / "starts").read_text().splitlines()) == 1  # joined, not started again
    assert not answers(port) and not (tmp_path / "model.serve.json").exists()


def test_the_state_of_a_killed_run_is_replaced(tmp_path, fake):
    """A state file naming a server that is gone (its run was killed) does not count: a new server starts."""
    port = free_port()
    (tmp_path / "model.serve.json").write_text(json.dumps({"pid": 2 ** 22 + 7, "port": port, "users": [1]}))
    p = with_cslm(tmp_path, fake, port, sys.executable, "-c", f"import socket; socket.create_connection(('127.0.0.1', {port}))")
    assert p.wait(60) == 0, p.communicate()
    assert len((tmp_path / "starts").read_text().splitlines()) == 1
    assert not answers(port) and not (tmp_path / "model.serve.json").exists()


def test_the_commands_status_is_returned(tmp_path, fake):
    p = with_cslm(tmp_path, fake, free_port(), sys.executable, "-c", "raise SystemExit(3)")
    assert p.wait(60) == 3


def test_a_server_deaf_to_sigterm_is_killed(tmp_path, fake, monkeypatch):
    fake.write_text(f"#!{sys.executable}\nimport signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + FAKE
                    .replace('signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))', ''))
    monkeypatch.setenv("FAKE_STARTS", str(tmp_path / "starts"))
    monkeypatch.setattr(cslm_server, "STOP_SECONDS", 0.5)
    port = free_port()
    server = cslm_server.SharedServer(str(tmp_path / "model"), port, str(fake), wait=30)
    server.acquire()
    pid = json.loads((tmp_path / "model.serve.json").read_text())["pid"]
    server.release()
    assert not cslm_server._alive(pid) and not answers(port) and not (tmp_path / "model.serve.json").exists()


def test_a_leftover_server_of_a_model_trained_again_is_replaced(tmp_path, fake):
    """A server whose wrappers were killed is joined only if its model is as it was when it started: after
    the model changed (trained again), it is stopped and a new one started."""
    port = free_port()
    kill_a_wrapper(tmp_path, fake, port)
    old_pid = json.loads((tmp_path / "model.serve.json").read_text())["pid"]
    (tmp_path / "model" / "model.safetensors").write_bytes(b"new weights")
    p = with_cslm(tmp_path, fake, port, sys.executable, "-c", "pass")
    assert p.wait(60) == 0, p.communicate()
    assert len((tmp_path / "starts").read_text().splitlines()) == 2 and not cslm_server._alive(old_pid)
    assert not answers(port) and not (tmp_path / "model.serve.json").exists()


def test_a_model_changed_under_a_server_in_use_is_refused(tmp_path, fake):
    port = free_port()
    go = tmp_path / "go"
    first = with_cslm(tmp_path, fake, port, sys.executable, "-c",
                      f"import os, time\nwhile not os.path.exists({str(go)!r}):\n    time.sleep(0.05)\n")
    try:
        wait_for(tmp_path / "model.serve.json", first)
        (tmp_path / "model" / "model.safetensors").write_bytes(b"new weights")
        second = with_cslm(tmp_path, fake, port, sys.executable, "-c", "open('ran', 'w')", cwd=tmp_path)
        out, err = second.communicate(timeout=60)
    finally:
        go.touch()  # the first command ends whatever happened
    assert first.wait(60) == 0 and second.returncode == 1 and not (tmp_path / "ran").exists()
    assert "changed while its server" in err and "let them finish, then run this again" in err
    assert not answers(port)
