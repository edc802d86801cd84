"""The Moses feature's backends (cslm/cpp/cslm_backend.*): in process and through a server, one
floor and one retry loop; and the model directory's JSON read as JSON (cslm/cpp/cslm_json.*)."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np

from cslm.engine import Engine

from test_cslm_local import model_dir, ngrams_of, run_local  # noqa: F401 (a fixture)
from test_cslm_server import start_server_process


def run_backend(exe, grams, *args) -> tuple[np.ndarray, np.ndarray, str]:
    r = subprocess.run([str(exe), *map(str, args)], input="".join(" ".join(g) + "\n" for g in grams),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()]
    return np.array([float(a) for a, _ in rows]), np.array([int(b) for _, b in rows]), r.stderr


def test_local_backend_scores_flags_and_floor(backend_exe, local_exe, model_dir):  # noqa: F811
    out, loaded, corpus = model_dir
    grams = ngrams_of(corpus, loaded.config.order)
    both = run_local(local_exe, out, grams)  # exact, o_w
    exact, flags, _ = run_backend(backend_exe, grams, "--self-normalized", "false", out)
    assert np.max(np.abs(exact - both[:, 0])) < 1e-5
    selfnorm, _, _ = run_backend(backend_exe, grams, out)  # auto: the model was trained with --self-norm
    assert np.max(np.abs(selfnorm - both[:, 1])) < 1e-5
    unknown = [i for i, g in enumerate(grams) if loaded.vocab.encode([g[-1]])[0] == loaded.vocab.unk_id]
    assert unknown and all(flags[i] == 1 for i in unknown) and flags.sum() == len(unknown)
    # one floor for every backend: nothing below it reaches the decoder
    floor = float(np.median(exact))
    floored, _, _ = run_backend(backend_exe, grams, "--floor", floor, "--self-normalized", "false", out)
    assert np.allclose(floored, np.maximum(exact, floor), atol=1e-5) and floored.min() >= floor - 1e-6


def test_server_backend_matches_the_engine(backend_exe, model_dir, tmp_path):  # noqa: F811
    out, loaded, corpus = model_dir
    grams = ngrams_of(corpus, loaded.config.order, 100)
    proc, port = start_server_process(out, tmp_path)
    try:
        got, flags, err = run_backend(backend_exe, grams, "--server", "127.0.0.1", port, out)
        assert "requests 1" in err
        exact, _ = Engine.load(str(out), device="cpu").score_words(grams)
        assert np.max(np.abs(got - exact)) < 1e-4
        # a model directory whose vocabulary is not the server's: refused at load, naming the file
        other = tmp_path / "other"
        shutil.copytree(out, other)
        with open(other / "cslm.vocab", "a") as f:
            f.write("extra\t1\n")
        r = subprocess.run([str(backend_exe), "--server", "127.0.0.1", str(port), str(other)], input="w1\n",
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "vocabulary differs from" in r.stderr and "cslm.vocab" in r.stderr, r.stderr
    finally:
        proc.terminate()
        proc.wait(30)


def test_server_backend_retries_then_gives_up(backend_exe, model_dir, tmp_path):  # noqa: F811
    out, loaded, corpus = model_dir
    proc, port = start_server_process(out, tmp_path)
    try:
        # the handshake succeeds; then the server goes away before the session's first request
        r = subprocess.Popen([str(backend_exe), "--retries", "2", "--server", "127.0.0.1", str(port)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready = r.stderr.readline()
        assert ready.startswith(f"model 127.0.0.1:{port}: order "), ready
        proc.terminate()
        proc.wait(30)
        stdout, stderr = r.communicate("w1 w2\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert r.returncode == 1 and stdout == "", stderr
    assert stderr.count("reconnecting (") == 2 and "reconnecting (2/2)" in stderr, stderr
    assert stderr.strip().splitlines()[-1].startswith(f"lost the CSLM server at 127.0.0.1:{port} ("), stderr
    assert stderr.strip().endswith("after 2 retries"), stderr


def test_config_is_read_as_json(local_exe, model_dir, tmp_path):  # noqa: F811
    out, loaded, corpus = model_dir
    grams = ngrams_of(corpus, loaded.config.order, 20)
    want = run_local(local_exe, out, grams)
    # an "order" elsewhere in the file (here before the model's own) is not the model's order
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    blob = json.loads((moved / "config.json").read_text())
    blob["meta"] = {"order": 3, **blob.get("meta", {})}
    (moved / "config.json").write_text(json.dumps(blob, indent=None, separators=(",", ":")))
    assert np.array_equal(run_local(local_exe, moved, grams), want)
    # malformed JSON: one line naming the file and the byte
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    (broken / "config.json").write_text('{"format": "cslm", "model": {"order": 7,}}')
    r = subprocess.run([str(local_exe), str(broken)], input="w1\n", capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "config.json: malformed JSON at byte 40" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
