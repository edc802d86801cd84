"""One `cslm serve` for the commands of a run that decode with a CSLM server (CSLM_MODE=server).

`with_server(model, port, command)` runs `command` with `cslm serve MODEL --port PORT` up for its
duration. Under `make -j` several such commands run at once (two tunings, a tuning and a decoding):
they share one server, the model being the same. The first starts it, the last stops it, and each
notes itself in a state file beside the model, under an exclusive lock:

    MODEL.serve.lock   flock(2) held while the state is read and written (never while a command runs)
    MODEL.serve.json   {"pid": the server's, "port": PORT, "users": [the pids of the wrappers using it],
                        "model": the model directory's files (name, size, time) when it started}
    MODEL.serve.log    the server's output

A server started per command would not work: the second one cannot bind the port, and the second
command would decode against the first one's server, which stops when the first command ends. A
port already taken by another program is refused in one line, before the command runs: a decoder
must not send its n-grams to something else. Users are counted by process id, so that a wrapper
killed outright (SIGKILL) does not keep the server up for ever: the last live one stops it, and a
server whose wrappers all died is joined by the next run, which stops it in turn, unless the model
changed since it started (trained again): then it is stopped and a new one started. A state file
whose server is gone is replaced.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from mtcommon.errors import UserError

from runs import signals_noted

# seconds a stopping server is given to answer what it has read before it is killed
STOP_SECONDS = 60.0


def answers(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:PORT."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, stopped but not yet waited for, does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True


def _is_server(pid: int) -> bool:
    """Whether process `pid` runs `serve` (not another program that was given the pid of a server that died
    with its run); True where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"serve" in f.read().split(b"\0")
    except OSError:
        return True


class SharedServer:
    """The server of one model directory and its state files (module docstring)."""

    def __init__(self, model: str, port: int, cslm: str = "cslm", serve_args: list[str] | None = None,
                 wait: float = 300.0):
        base = os.path.normpath(model)
        self.model, self.port, self.cslm, self.serve_args, self.wait = model, port, cslm, serve_args or [], wait
        self.lock_path, self.state_path, self.log_path = (Path(base + s) for s in (".serve.lock", ".serve.json",
                                                                                   ".serve.log"))

    @contextmanager
    def _locked(self):
        with open(self.lock_path, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _state(self) -> dict | None:
        """The state of a server that still runs on this port, its users those still alive; else None."""
        try:
            state = json.loads(self.state_path.read_text(encoding="utf-8"))
            pid = int(state["pid"])
            live = state["port"] == self.port and _alive(pid) and _is_server(pid)
            state["users"] = [int(u) for u in state["users"] if _alive(int(u))]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return state if live else None

    def _write(self, state: dict) -> None:
        tmp = self.state_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(state) + "\n", encoding="utf-8")
        os.replace(tmp, self.state_path)

    def _start(self) -> int:
        """Start the server and wait until it accepts connections; its pid. UserError if the port is taken, or
        if the server stops or does not listen within `wait` seconds."""
        if answers(self.port):
            raise UserError(f"port {self.port} is taken by another program, not this run's CSLM server: "
                            f"stop it, or choose another port (CSLM_PORT=...)")
        with open(self.log_path, "w") as log:
            proc = subprocess.Popen([self.cslm, "serve", self.model, "--port", str(self.port), *self.serve_args],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.wait
        while not answers(self.port):
            if proc.poll() is not None or time.monotonic() > deadline:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                    why = f"did not listen on port {self.port} within {self.wait:g} s"
                else:
                    why = f"exited with status {proc.returncode}"
                tail = self.log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:]
                raise UserError(f"cslm serve {self.model} {why}" + (f": {tail[0]}" if tail else "")
                                + f" (its log: {self.log_path})")
            time.sleep(0.2)
        return proc.pid

    def _model_files(self) -> list:
        """What the model directory holds now: [name, size, modification time] of each file ([] if it cannot be
        read: the server then says what is wrong with it)."""
        try:
            entries = sorted(os.scandir(self.model), key=lambda e: e.name)
            return [[e.name, e.stat().st_size, e.stat().st_mtime_ns] for e in entries if e.is_file()]
        except OSError:
            return []

    def acquire(self) -> None:
        """Join the running server, or start one. A server of the model as it was before it changed is stopped
        first when nobody uses it (UserError while someone does)."""
        with self._locked():
            state, model = self._state(), self._model_files()
            if state is not None and state.get("model") != model:
                if state["users"]:
                    raise UserError(f"{self.model} changed while its server (pid {state['pid']}, port {self.port}) "
                                    f"serves other commands: let them finish, then run this again")
                self._stop(int(state["pid"]))
                state = None
            if state is None:
                state = {"pid": self._start(), "port": self.port, "users": [], "model": model}
            state["users"].append(os.getpid())
            self._write(state)

    def release(self) -> None:
        """Leave the server; the last to leave stops it (SIGTERM: it answers what it has read) and waits for it."""
        with self._locked():
            state = self._state()
            if state is None:  # it stopped already (the process group's Ctrl-C reached it too)
                self.state_path.unlink(missing_ok=True)
                return
            state["users"] = [u for u in state["users"] if u != os.getpid()]
            if state["users"]:
                self._write(state)
                return
            self._stop(int(state["pid"]))
            self.state_path.unlink(missing_ok=True)

    def _stop(self, pid: int) -> None:
        """Stop the server `pid`: SIGTERM, then SIGKILL if it has not stopped within STOP_SECONDS."""
        for sig, seconds in ((signal.SIGTERM, STOP_SECONDS), (signal.SIGKILL, 10.0)):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break
            if self._stopped(pid, time.monotonic() + seconds):
                break

    @staticmethod
    def _stopped(pid: int, deadline: float) -> bool:
        """Whether process `pid` is gone by `deadline` (monotonic clock)."""
        while _alive(pid):
            if time.monotonic() > deadline:
                return False
            try:  # a server this process started is its child: wait for it, else poll
                if os.waitpid(pid, os.WNOHANG)[0]:
                    return True
            except ChildProcessError:
                pass
            time.sleep(0.1)
        return True


def with_server(model: str, port: int, command: list[str], cslm: str = "cslm", serve_args: list[str] | None = None,
                wait: float = 300.0) -> int:
    """Run `command` (stdin, stdout and stderr inherited) with the model's server up, shared with the other
    commands of the run that need it at the same time; returns the command's status. SIGTERM, SIGINT and
    SIGHUP reach the command as they reach this process (the process group's); this one waits for the
    command, then leaves the server (128 + the signal is returned)."""
    server = SharedServer(model, port, cslm, serve_args, wait)
    with signals_noted() as stopped:
        server.acquire()
        try:
            rc = subprocess.call(command) if not stopped else 0
        finally:
            server.release()
    return 128 + stopped[0] if stopped else rc
