"""Set-up: what `make install` runs."""

from __future__ import annotations

import os
import shutil
import subprocess
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
