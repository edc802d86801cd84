"""benchmarks/bench_cslm_decode.py without Moses: its table filter, moses.ini, CPU sets and refusals."""

import gzip
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from test_cslm import cslm_corpus, cslm_model  # noqa: F401 (fixtures)

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_cslm_decode.py"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        spec = importlib.util.spec_from_file_location("bench_cslm_decode", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(SCRIPT.parent))


def test_cube_rows_name_their_keys(bench):
    assert bench.cube_row("16:4") == ("predict=0 corner=16 ahead=4", "cube_16_4", "corner 16, ahead 4")
    assert bench.cube_row("predict:4") == ("predict=4", "predict_4", "predict 4")
    assert bench.cube_row("predict:1.5:rounds=3,run-ahead=estimate") == (
        "predict=1.5 rounds=3 run-ahead=estimate", "predict_1.5_rounds_3_run_ahead_estimate",
        "predict 1.5 rounds=3 run-ahead=estimate")


def test_parse_cpus(bench):
    assert bench.parse_cpus(None) is None and bench.parse_cpus("") is None
    assert bench.parse_cpus("0,1") == {0, 1}
    assert bench.parse_cpus("2-5,8") == {2, 3, 4, 5, 8}
    assert bench.pinned(None) is None


def test_filter_keeps_the_phrases_of_the_input(bench, tmp_path):
    table = tmp_path / "phrase-table.gz"
    with gzip.open(table, "wt") as f:
        f.write("the house ||| la maison ||| 1 1 1 1\nhouse ||| maison ||| 1 1 1 1\n"
                "a car ||| une voiture ||| 1 1 1 1\nthe ||| le ||| 1 1 1 1\n")
    out = tmp_path / "filtered.gz"
    assert bench.filter_table(table, ["the house is red"], out) == 3
    with gzip.open(out, "rt") as f:
        assert [line.split(" ||| ")[0] for line in f] == ["the house", "house", "the"]


def test_moses_ini_adds_the_cslm_line_and_its_weights(bench, tmp_path):
    ini = tmp_path / "moses.ini"
    bench.moses_ini(ini, tmp_path / "t.gz", tmp_path / "lm.arpa.gz", None)
    plain = ini.read_text()
    assert f"path={(tmp_path / 'lm.arpa.gz').resolve()} order=5" in plain and "CSLM" not in plain
    bench.moses_ini(ini, tmp_path / "t.gz", tmp_path / "lm.arpa.gz", "CSLM name=CSLM0 path=m port=1")
    text = ini.read_text()
    assert "\nCSLM name=CSLM0 path=m port=1\n" in text and "CSLM0= 0.1 -0.1" in text
    bench.moses_ini(ini, tmp_path / "t.gz", tmp_path / "lm.arpa.gz", ["NNJM name=NNJM0 path=j", "CSLM path=m"])
    text = ini.read_text()  # several lines: each feature and its weights, in order
    assert "\nNNJM name=NNJM0 path=j\nCSLM path=m\n" in text and "NNJM0= 0.1 -0.1\nCSLM0= 0.1 -0.1" in text


def _run(tmp_path, *args):
    env = {k: v for k, v in os.environ.items() if k != "MOSES"}
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=120, cwd=SCRIPT.parent)


def test_without_moses_the_rows_are_skipped_with_the_reason(tmp_path):
    system = tmp_path / "system"
    system.mkdir()
    r = _run(tmp_path, tmp_path / "model", "--system", system)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "MOSES is not set" in json.loads(r.stdout)["skipped"]


def test_a_missing_table_is_one_line_naming_both_files(tmp_path):
    system, model, moses = tmp_path / "system", tmp_path / "model", tmp_path / "moses"
    for d in (system, model, moses / "bin"):
        d.mkdir(parents=True)
    (system / "test.tok.en").write_text("the house\n")
    (model / "config.json").write_text(json.dumps({"meta": {}}))
    (moses / "bin" / "moses").write_text("")
    r = _run(tmp_path, model, "--system", system, "--moses", moses, "--work", tmp_path / "work", "--sentences", "1")
    assert r.returncode != 0
    assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr
    assert "phrase-table.first1.gz" in r.stderr and str(system / "phrase-table.gz") in r.stderr


def test_a_bad_cpu_list_is_a_usage_error(tmp_path):
    r = _run(tmp_path, tmp_path / "model", "--system", tmp_path, "--decoder-cpus", "0,x")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--decoder-cpus" in r.stderr.splitlines()[-1]


def test_decoding_time_is_read_from_moses_own_clock(bench):
    log = ("Loading LM0\nCreated input-output object : [3.121] seconds\nLine 0: Search took 0.037 seconds\n"
           "Name:moses\tVmPeak:347264 kB\tVmRSS:72708 kB\tRSSMax:139500 kB\tuser:2.966\tsys:0.195\tCPU:3.160\t"
           "real:3.203\n")
    load, seconds = bench.moses_times(log)
    assert load == 3.121 and abs(seconds - 0.082) < 1e-9
    assert bench.moses_times("Created input-output object : [3.1] seconds\n") is None  # killed before its end line
    assert bench.moses_times("real:3.2\n") is None


def test_a_server_row_reports_the_servers_split_of_a_request(bench, cslm_model):  # noqa: F811
    """The Server wrapper asks the server's STATS before stopping it: latency and compute, p50 and p99."""
    from cslm.client import Client

    with bench.Server(str(cslm_model), False, 1, "cpu") as server:
        with Client(port=server.port) as c:
            c.score(np.array([[1, 2, 3], [4, 5, 6]], np.int32))
    report = server.report()
    assert report["server"].startswith("server stopped after") and "1 score requests" in report["server"]
    ms = report["server_ms"]
    assert set(ms) == {"latency_ms", "compute_ms"} and all(set(v) == {"p50", "p99"} for v in ms.values())
    assert ms["latency_ms"]["p50"] >= ms["compute_ms"]["p50"] > 0
