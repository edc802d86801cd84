"""The docker image, checked without a Docker engine: its health check against a local `cslm serve`, and its
Dockerfile read as text (entry point, command, copied paths, port) against the repository and `cslm serve`."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_cslm import cslm_corpus, cslm_model  # noqa: F401 (shared session fixtures)
from test_cslm_server import start_server_process

from cslm.cli import main as cslm_main

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
HEALTHCHECK = DOCKER / "healthcheck.py"


def dockerfile(path: Path = DOCKER / "Dockerfile") -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments left out."""
    out, pending = [], ""
    for line in path.read_text(encoding="utf-8").splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        word, _, rest = pending.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    return out


def instruction(name: str) -> list[str]:
    return [rest for word, rest in dockerfile() if word == name]


def exec_form(name: str) -> list[str]:
    """The JSON (exec) form of the last ENTRYPOINT or CMD, as Docker takes it."""
    return json.loads(instruction(name)[-1])


def healthcheck(port: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(HEALTHCHECK)], env={**os.environ, "CSLM_PORT": str(port)},
                          capture_output=True, text=True, timeout=30, check=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_healthcheck_passes_while_the_server_answers_and_fails_once_it_stops(cslm_model, tmp_path):  # noqa: F811
    proc, port = start_server_process(cslm_model, tmp_path)
    try:
        ok = healthcheck(port)
        assert (ok.returncode, ok.stdout, ok.stderr) == (0, "", "")
    finally:
        proc.terminate()
        proc.wait(30)
    gone = healthcheck(port)
    assert gone.returncode == 1
    assert gone.stderr.startswith(f"cslm server on port {port}: ") and gone.stderr.count("\n") == 1, gone.stderr


def test_healthcheck_fails_with_one_line_when_nothing_listens():
    port = free_port()
    r = healthcheck(port)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith(f"cslm server on port {port}: ") and r.stderr.count("\n") == 1, r.stderr


def test_healthcheck_fails_when_the_port_does_not_speak_the_protocol():
    """A listener that is not a CSLM server (it closes at once) is not healthy."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def close_each():
            conn, _ = listener.accept()
            conn.close()

        t = threading.Thread(target=close_each, daemon=True)
        t.start()
        port = listener.getsockname()[1]
        r = healthcheck(port)
        t.join(10)
    # closed before the HELLO was sent (a reset) or after (no reply): either way one line, unhealthy
    assert r.returncode == 1 and r.stderr.startswith(f"cslm server on port {port}: "), r.stderr
    assert r.stderr.count("\n") == 1 and ("closed during handshake" in r.stderr or "reset" in r.stderr), r.stderr


def test_entrypoint_and_command_are_a_cslm_serve_that_parses(tmp_path):
    entry, cmd = exec_form("ENTRYPOINT"), exec_form("CMD")
    assert entry == ["cslm", "serve"]
    scripts = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'^cslm = "cslm\.cli:main"$', scripts, re.MULTILINE), "the image's `cslm` is not the project's"
    model_dir, options = cmd[0], cmd[1:]
    assert json.loads(instruction("VOLUME")[-1]) == [model_dir]
    # the command's options as `cslm serve` parses them: with an empty model folder the error is the model's
    # (exit 1), not a usage error (exit 2, an unknown option or a bad value)
    empty = tmp_path / "models-cslm"
    empty.mkdir()
    r = CliRunner().invoke(cslm_main, ["serve", str(empty), *options])
    assert r.exit_code == 1 and "not a model directory" in r.output, r.output
    bad = CliRunner().invoke(cslm_main, ["serve", str(empty), *options, "--no-such-option"])
    assert bad.exit_code == 2  # what a command the parser refuses would give
    # the health check asks the port the server listens on
    port = options[options.index("--port") + 1]
    assert options[options.index("--host") + 1] == "0.0.0.0"  # reachable through the published port
    assert re.search(rf"\bCSLM_PORT={port}\b", " ".join(instruction("ENV")))
    assert instruction("EXPOSE") == [port]
    health = instruction("HEALTHCHECK")[-1]
    copied = {c.split()[-1]: c.split()[:-1] for c in instruction("COPY")}
    target = json.loads(health[health.index("CMD") + 3:].strip())[-1]
    assert copied.get(target) == ["docker/healthcheck.py"], (target, copied)


def test_compose_runs_the_image_command():
    compose = (DOCKER / "compose.yaml").read_text(encoding="utf-8")
    m = re.search(r"^\s+command:\s*(\[.*\])\s*$", compose, re.MULTILINE)
    assert m and json.loads(m.group(1)) == exec_form("CMD")
    assert re.search(r"dockerfile:\s*docker/Dockerfile\s*$", compose, re.MULTILINE)


def test_every_copied_path_exists_and_passes_the_dockerignore():
    ignore = [line.strip() for line in (DOCKER / "Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines()
              if line.strip() and not line.startswith("#")]

    def included(path: str) -> bool:
        """BuildKit's rule: the last pattern that matches decides; `!` re-includes."""
        keep = True
        for pattern in ignore:
            negated = pattern.startswith("!")
            p = pattern.lstrip("!")
            if fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path, p.removesuffix("/**")):
                keep = negated
        return keep

    copies = instruction("COPY")
    assert copies
    for c in copies:
        *sources, _ = c.split()
        for src in sources:
            assert not src.startswith("--"), f"COPY {c}: options are not expected here"
            assert (ROOT / src).exists(), f"COPY {c}: {src} is not in the repository"
            assert included(src), f"COPY {c}: {src} is left out by docker/Dockerfile.dockerignore"
    assert not included("tests") and not included("benchmarks")


@pytest.mark.parametrize("base", [instruction("FROM")[0]])
def test_base_image_is_pinned(base):
    assert re.fullmatch(r"[\w./-]+:[\w.-]+", base) and not base.endswith(":latest"), base
