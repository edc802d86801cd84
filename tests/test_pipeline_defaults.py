"""pipelines/Makefile's defaults: the paper's table unless told more, paths read from the caller's
folder, the project's Python or one line that says how, the CSLM feature checked before a run, and
every variable a user may set in docs/pipeline.md's table."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PIPE = ROOT / "pipelines"
sys.path.insert(0, str(PIPE))
import preflight  # noqa: E402
import systems  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")

PAPER = ["baseline", "rnn", "cslm-rnn", "cslm-rnn-wp"]


def _make(*args, cwd: Path | None = None, **vars_):
    """make -C pipelines ARGS VAR=VALUE..., started in `cwd` (PWD set as a shell sets it)."""
    cwd = cwd or ROOT
    env = {**os.environ, "PWD": str(cwd),
           "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    env.pop("MAKEFLAGS", None)
    env.pop("MOSES", None)
    env.pop("SYSTEMS", None)
    vars_.setdefault("PYTHON", sys.executable)
    cmd = ["make", "--no-print-directory", "-C", str(PIPE), *args, *(f"{k}={v}" for k, v in vars_.items())]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _reported(plan: str) -> list[str]:
    return re.search(r'--systems "([^"]*)"', plan).group(1).split()


def test_the_default_report_plans_the_papers_table(tmp_path):
    r = _make("-n", "BUDGET=1", "report", MOSES="/opt/mosesdecoder", WORK=str(tmp_path / "w"))
    assert r.returncode == 0, r.stderr
    plan = re.sub(r'--pairs "[^"]*"', "", r.stdout)  # the pairs the report tests when both are planned
    assert _reported(plan) == PAPER
    assert plan.count("mert-moses.pl") == 4 * 3  # RUNS tunings of each
    for system in PAPER:
        for k in (1, 2, 3):
            assert f"/systems/{system}/pro-bp-{k}/mert" in plan
    # no reranked system, no sentence network, no network past the paper's
    assert "rerank" not in plan and "/sent" not in plan and "rescore-nbest" not in plan
    assert "rnnsearch" not in plan and "rnn-subword" not in plan and "augment" not in plan
    assert '--networks ""' in plan
    assert plan.count("moses-rnn train") + plan.count("cslm train") == 2  # the RNN and the CSLM
    r = _make("-n", "BUDGET=1", "report", "RUNS=2", MOSES="/opt/mosesdecoder", WORK=str(tmp_path / "w"))
    assert r.returncode == 0 and r.stdout.count("mert-moses.pl") == 4 * 2


def test_systems_all_plans_the_extended_set(tmp_path):
    r = _make("-n", "BUDGET=1", "report", "SYSTEMS=all", MOSES="/opt/mosesdecoder", WORK=str(tmp_path / "w"))
    assert r.returncode == 0, r.stderr
    extended = [s for s, row in systems.SYSTEMS.items() if row["set"] in ("paper", "extended")]
    assert _reported(r.stdout) == extended + ["baseline-rerank", "cslm-rnn-rerank"]
    assert r.stdout.count("mert-moses.pl") == len(extended) * 3
    assert "rescore-nbest" in r.stdout and "--arch rnnsearch" in r.stdout and "--arch encdec" in r.stdout
    assert '--networks "sent sent-encdec"' in r.stdout


def test_an_unknown_system_is_refused_in_one_line(tmp_path):
    r = _make("-n", "report", "SYSTEMS=baseline rnn-big", MOSES="/opt/mosesdecoder", WORK=str(tmp_path / "w"))
    assert r.returncode != 0
    assert [line for line in r.stderr.splitlines() if line.strip()] == [
        "Makefile:" + r.stderr.split(":")[1] + ": *** SYSTEMS: no system named rnn-big: pipelines/systems.tsv "
        "lists them (make -C pipelines help).  Stop."]


def test_report_labels_come_from_the_systems_table():
    assert systems.label("cslm-rnn-wp") == "CSLM + RNN + WP"
    assert systems.label("cslm-rnn-rerank") == "CSLM + RNN, reranked"
    assert systems.label("something-else") == "something-else"


def test_relative_paths_are_read_from_the_callers_folder(tmp_path):
    caller = tmp_path / "me"
    caller.mkdir()
    r = _make("-n", "report", cwd=caller, DATA="../corpora", WORK="w", MOSES="mosesdecoder")
    assert r.returncode == 0, r.stderr
    plan = r.stdout
    assert f"mt.py prepare {tmp_path}/corpora/train {caller}/w/data/train " in plan
    assert f"{caller}/mosesdecoder/bin/lmplz" in plan and f"{caller}/w/systems/baseline" in plan
    assert str(PIPE / "w") not in plan and str(PIPE / "work") not in plan
    r = _make("-n", "report", cwd=caller, CORPUS="c/train", DEV="/abs/dev", TEST="t", MOSES="/opt/mosesdecoder")
    assert r.returncode == 0, r.stderr
    assert f"{caller}/c/train.en" in r.stdout and "/abs/dev.en" in r.stdout and f"{caller}/t.en" in r.stdout
    assert f"{caller / 'work' / 'data'}/" in r.stdout and str(PIPE / "work") not in r.stdout  # WORK's default: ./work
    # a missing corpus is named as the caller's path
    r = _make("prepare", cwd=caller, DATA="../nothing", WORK="w")
    assert r.returncode != 0 and f"pipelines: {tmp_path}/nothing/train.en does not exist" in r.stderr
    assert not (caller / "w").exists()


def test_a_python_without_the_project_stops_in_one_line(tmp_path):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'mtcommon'\" >&2\nexit 1\n")
    python.chmod(0o755)
    r = _make("prepare", PYTHON=str(python), WORK=str(tmp_path / "w"), DATA=str(tmp_path))
    assert r.returncode != 0
    msg = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(msg) == 1 and f"PYTHON={python} cannot import this project" in msg[0], r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "w").exists()
    assert _make("help", PYTHON=str(python)).returncode == 0  # help runs no Python


def test_help_lists_targets_systems_and_variables():
    r = _make("help")
    assert r.returncode == 0, r.stderr
    for word in ["report", "tune-SYSTEM", "eval-SYSTEM", "tuners", "cslm-rnn-aug-input", "SYSTEMS=all"]:
        assert word in r.stdout, word
    for variable in _user_variables():
        assert re.search(rf"^  {variable} ", r.stdout, re.M), variable


def _user_variables() -> list[str]:
    """Every variable a user may set: each `NAME ?=` of the Makefile."""
    text = (PIPE / "Makefile").read_text(encoding="utf-8")
    return list(dict.fromkeys(re.findall(r"^([A-Z][A-Z0-9_]*)\s*\?=", text, re.M)))


def test_every_user_variable_is_in_the_docs_table():
    doc = (ROOT / "docs" / "pipeline.md").read_text(encoding="utf-8")
    section = doc.split("\n### Variables\n", 1)[1].split("\n#", 1)[0]
    documented = set()
    for row in section.splitlines():
        if row.startswith("| `"):
            documented |= set(re.findall(r"`([A-Z][A-Z0-9_]*)`", row.split("|")[1]))
    variables = set(_user_variables())
    assert not variables - documented, f"not in docs/pipeline.md's Variables table: {sorted(variables - documented)}"
    assert not documented - variables, f"documented but not in the Makefile: {sorted(documented - variables)}"


def _fake_moses(root: Path, binary: bytes) -> Path:
    for rel in preflight.MOSES_NEEDS + preflight.TUNER_NEEDS["pro"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).touch()
    (root / "bin" / "moses").write_bytes(binary)
    return root


def test_preflight_finds_a_moses_without_the_cslm_feature(tmp_path):
    stock = _fake_moses(tmp_path / "stock", b"#!/bin/sh\n# a Moses built without the CSLM feature\nexit 1\n")
    r = _make("-q", "report", MOSES=str(stock), WORK=str(tmp_path / "w"))
    assert r.returncode == 2
    msg = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(msg) == 1 and f"the CSLM feature in {stock}/bin/moses" in msg[0], r.stderr
    assert not (tmp_path / "w").exists()  # before anything trains
    # without a CSLM system the feature is not needed
    r = _make("-q", "report", "SYSTEMS=baseline rnn", MOSES=str(stock), WORK=str(tmp_path / "w"))
    assert "CSLM feature" not in r.stderr and r.returncode == 1, r.stderr  # -q: out of date, nothing run
    built = _fake_moses(tmp_path / "built", b"\x7fELF" + b"\0" * 100 + preflight.CSLM_FEATURE_MARK + b"\0")
    r = _make("-q", "report", MOSES=str(built), WORK=str(tmp_path / "w"))
    assert "CSLM feature" not in r.stderr and r.returncode == 1, r.stderr


@pytest.mark.parametrize("at", [0, 5, 13, 20])
def test_the_cslm_features_mark_is_found_across_read_blocks(tmp_path, at):
    binary = tmp_path / "moses"
    binary.write_bytes(b"x" * at + preflight.CSLM_FEATURE_MARK + b"y" * 7)
    assert preflight.has_feature(binary, chunk=8)
    binary.write_bytes(b"x" * at + preflight.CSLM_FEATURE_MARK[:-1] + b"y" * 7)
    assert not preflight.has_feature(binary, chunk=8)
