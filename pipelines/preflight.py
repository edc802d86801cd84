"""The check before a run's first step: every program, package and Moses feature its steps will call."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

MESSAGE = "pipelines: missing before the run starts: "  # then all that is missing, in one line

# Moses's programs and scripts, by tuner and by step (bin/mert for every tuner: the reranked
# systems tune their weights with it)
MOSES_NEEDS = ["bin/moses", "bin/lmplz", "bin/build_binary", "bin/extract", "bin/score", "bin/consolidate",
               "bin/lexical-reordering-score", "bin/extractor", "bin/mert", "bin/evaluator",
               "scripts/training/train-model.perl", "scripts/training/mert-moses.pl",
               "scripts/training/filter-model-given-input.pl"]
TUNER_NEEDS = {"mert": [], "kbmira": ["bin/kbmira"], "pro": ["bin/pro"]}

# The features' class names as the C++ compiler records them for run-time type information
# (typeinfo names of Moses::CSLM and Moses::NNJM): in every Moses binary that registers the
# features (cslm/moses/add-to-moses.sh), stripped or not, and in no other.
CSLM_FEATURE_MARK = b"N5Moses4CSLME"
NNJM_FEATURE_MARK = b"N5Moses4NNJME"


def has_feature(moses_binary: Path, mark: bytes = CSLM_FEATURE_MARK, chunk: int = 1 << 22) -> bool:
    """Whether a Moses binary was built with a feature (its class's type name `mark` is in the file)."""
    overlap = len(mark) - 1
    tail = b""
    with open(moses_binary, "rb") as f:
        while block := f.read(chunk):
            window = tail + block  # a mark cut by the read is whole here
            if mark in window:
                return True
            tail = window[-overlap:]
    return False


def missing_for_run(moses: Path, tuner: str, tools: list[str], cslm_systems: bool,
                    nnjm_systems: bool = False) -> list[str]:
    """What a run would miss: Moses's programs and scripts for `tuner`, the commands in `tools` (on
    the PATH or a path), the Python packages its steps import, with `cslm_systems` the CSLM
    feature in bin/moses and the kenlm package, with `nnjm_systems` the NNJM feature; [] when all is there.

    A step hours into a run (the report's `cslm eval --kenlm`, PRO's optimiser, the first decoding
    of a CSLM system) must not be the first to find that something was never installed.
    """
    missing = []
    for rel in MOSES_NEEDS + TUNER_NEEDS[tuner]:
        if not (moses / rel).is_file():
            missing.append(f"{moses / rel}")
    for wanted, name, mark in ((cslm_systems, "CSLM", CSLM_FEATURE_MARK), (nnjm_systems, "NNJM", NNJM_FEATURE_MARK)):
        if wanted and (moses / "bin" / "moses").is_file() and not has_feature(moses / "bin" / "moses", mark):
            missing.append(f"the {name} feature in {moses / 'bin' / 'moses'} (its {name} systems would fail at their "
                           "first decoding: cslm/moses/build-moses.sh adds it, docs/moses-feature.md)")
    for tool in tools:
        if shutil.which(tool) is None and not os.access(tool, os.X_OK):
            missing.append(f"{tool} (not on PATH)")
    packages = {"sacremoses": "pipeline", "matplotlib": "pipeline"}
    if cslm_systems:
        packages["kenlm"] = "pipeline"  # the report's cslm eval --kenlm
    if tuner == "pro":
        packages["scipy"] = "pipeline"  # megam.py, PRO's optimiser
    for module, extra in packages.items():
        if importlib.util.find_spec(module) is None:
            missing.append(f"Python package {module} (pip install -e '.[{extra}]')")
    return missing

