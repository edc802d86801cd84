"""Set-up: what `make install` runs, and what the commands need installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def make_install_dry_run(venv: Path, *args: str) -> str:
    """The commands `make install` would run (`make -n`) for the virtual environment `venv`."""
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH", "MAKEFLAGS", "MAKELEVEL")}
    r = subprocess.run(["make", "-n", "--no-print-directory", "-C", str(ROOT), f"VENV={venv}", "install", *args],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_install_torch_spec_reinstalls_torch_over_an_installed_set_up(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    stamp = venv / ".installed"  # a finished set-up, newer than pyproject.toml
    stamp.touch()
    later = max(time.time(), (ROOT / "pyproject.toml").stat().st_mtime + 1)
    os.utime(stamp, (later, later))
    assert "pip" not in make_install_dry_run(venv)  # nothing asked for: nothing to do
    out = make_install_dry_run(venv, "TORCH=torch==2.5.1+cu121")
    assert '--force-reinstall --no-deps "torch==2.5.1+cu121"' in out
    assert "import torch" not in out  # not skipped because a torch is there


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_install_keeps_an_installed_torch_by_default(tmp_path):
    out = make_install_dry_run(tmp_path / "fresh")
    assert 'python -c "import torch" 2>/dev/null ||' in out and "--force-reinstall" not in out


# The packages of the `analysis` extra, made unimportable in a child process.
WITHOUT_ANALYSIS = "import sys; sys.modules.update(matplotlib=None, sklearn=None); "


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_scoring_training_and_the_cslm_run_without_the_analysis_extra(tmp_path, example_table, tiny_model):
    r = python(WITHOUT_ANALYSIS + "import moses_rnn.cli, cslm.cli, moses_rnn.scoring.table, moses_rnn.scoring.shard, "
               "moses_rnn.training.train, moses_rnn.generation.generate, moses_rnn.analysis.analyze, "
               "moses_rnn.analysis.align, cslm.train, cslm.engine, cslm.server, cslm.apply")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "scored.gz"
    r = python(WITHOUT_ANALYSIS + "from moses_rnn.cli import main; "
               f"main(['score', {str(example_table)!r}, '-m', {str(tiny_model)!r}, '-o', {str(out)!r}, '--quiet', "
               "'--device', 'cpu'])")
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 0


@pytest.mark.parametrize("blocked, command", [
    ("matplotlib", ["analyze", "curves", "{model}", "-o", "{png}"]),
    ("sklearn", ["analyze", "words", "-m", "{model}", "-o", "{png}", "--words", "20"]),
])
def test_an_analysis_command_without_the_extra_says_which_to_install(blocked, command, tmp_path, tiny_model):
    png = tmp_path / "out.png"
    args = [a.format(model=tiny_model, png=png) for a in command]
    r = python(f"import sys; sys.modules[{blocked!r}] = None; from moses_rnn.cli import main; main({args!r})")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1, r.stderr
    assert f"{blocked} is not installed" in r.stderr and "pip install 'moses-rnn[analysis]'" in r.stderr
    assert not png.exists()
