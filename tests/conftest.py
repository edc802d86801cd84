"""Shared fixtures: the shipped example table, slices of ../shared/data, a tiny trained model."""

from __future__ import annotations

import gzip
import itertools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

# Tests check results, not speed: one intra-op thread avoids oversubscribing
# small CI machines when tests, servers and subprocesses run side by side.
torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
EXAMPLE_TABLE = ROOT / "moses_rnn" / "data" / "example.en-fr.phrase-table"
CPP = ROOT / "cslm" / "cpp"


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_inside_the_run(tmp_path_factory):
    """Temporary files of the tests, their subprocesses included (servers, torchrun's own log folders),
    go into this run's pytest folder rather than the machine's /tmp, so that a run leaves nothing there."""
    folder = tmp_path_factory.mktemp("tmp")
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"], tempfile.tempdir = str(folder), None
    yield
    if old is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = old
    tempfile.tempdir = None


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED.is_dir():
        pytest.skip("../shared/data is not beside the project")
    return SHARED


@pytest.fixture(scope="session")
def example_table() -> Path:
    return EXAMPLE_TABLE


@pytest.fixture(scope="session")
def real_table_slice(shared_data, tmp_path_factory) -> Path:
    """The first 3,000 lines of the real en-fr phrase table, gzipped."""
    out = tmp_path_factory.mktemp("slice") / "phrase-table.gz"
    with gzip.open(shared_data / "en-fr-moses" / "phrase-table.gz", "rb") as src, gzip.open(out, "wb") as dst:
        dst.writelines(itertools.islice(src, 3000))
    return out


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny encoder-decoder trained for a few steps on the example table."""
    from moses_rnn.training.train import TrainConfig, train

    model_dir = tmp_path_factory.mktemp("tiny-model")
    cfg = TrainConfig(preset="tiny", max_steps=60, eval_every=30, valid_pairs=20, device="cpu")
    train(str(EXAMPLE_TABLE), str(model_dir), cfg, progress=False)
    return model_dir


# the in-process evaluator (cslm/cpp/cslm_local.h) and what it is built of
EVALUATOR_SOURCES = ("cslm_local.cc", "cslm_kernels.cc", "cslm_modeldir.cc", "cslm_json.cc")


def compile_cpp(tmp_path_factory, name: str, sources: list[str]) -> Path:
    """cslm/cpp/`sources` compiled (-O2, every warning an error) into the program `name`, once per test process."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = tmp_path_factory.mktemp(name) / name
    subprocess.run([cxx, "-std=c++11", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(exe),
                    *(str(CPP / s) for s in sources)], check=True, timeout=300)
    return exe


@pytest.fixture(scope="session")
def local_exe(tmp_path_factory) -> Path:
    """The in-process C++ evaluator's test driver (cslm_local_test.cc)."""
    return compile_cpp(tmp_path_factory, "cslm_local_test", [*EVALUATOR_SOURCES, "cslm_local_test.cc"])


@pytest.fixture(scope="session")
def backend_exe(tmp_path_factory) -> Path:
    """The Moses feature's backends' test driver (cslm_backend_test.cc): local and server."""
    return compile_cpp(tmp_path_factory, "cslm_backend_test", ["cslm_backend.cc", "cslm_client.cc", *EVALUATOR_SOURCES,
                                                               "cslm_backend_test.cc"])
