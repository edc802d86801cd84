"""benchmarks/bench_server_fairness.py runs end to end on a tiny model (its figures are the benchmark's to judge)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from test_cslm import cslm_corpus, cslm_model  # noqa: F401 (fixtures)

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_server_fairness.py"


def test_the_fairness_benchmark_reports_the_wait_and_the_growth(cslm_model, tmp_path):  # noqa: F811
    out, scratch = tmp_path / "report.json", tmp_path / "tmp"
    scratch.mkdir()
    r = subprocess.run([sys.executable, str(SCRIPT), str(cslm_model), "--frames", "4", "--ngrams", "2000",
                        "--probes", "2", "--json", str(out), "--max-pending", "2"],
                       capture_output=True, text=True, timeout=240, env={**os.environ, "TMPDIR": str(scratch)})
    assert r.returncode == 0, r.stderr
    assert not list(scratch.iterdir())  # the server's port folder removed at exit (common.workdir)
    report = json.loads(out.read_text())
    assert len(report["other_client_wait_s"]["all"]) == 2 and report["other_client_wait_s"]["max"] > 0
    assert report["server_rss_peak_mib"] > 0 and report["server_rss_warm_mib"] > 0
    assert 0 < report["held_peak_mib"] <= report["per_connection_cap_mib"] + 1  # the other client's request beside
    assert report["flood_bytes_mib"] == 4 * report["frame_bytes"] / 2**20
