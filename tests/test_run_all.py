"""benchmarks/run_all.py: discovery, what a script needs, JSON parsing, the summary table (no benchmark is run)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import run_all as R  # noqa: E402

FAKE = '''"""A fake benchmark. Target: fast >= 2x."""
import argparse, json
ap = argparse.ArgumentParser()
ap.add_argument("--lines", type=int, default=1000000)
ap.add_argument("--device", default="cpu")
a = ap.parse_args()
print("warming up {")
print(json.dumps({"lines": a.lines, "nested": {"speedup": 2.5, "other": 7}, "name": "x", "ok": True,
                  "fast_over_slow": 3.0}, indent=2))
'''


def test_last_json_object_takes_the_final_object_only():
    text = 'log line {not json}\n{"a": 1}\nmore\n{\n  "b": {"c": [1, {"d": 2}]},\n  "e": 0.5\n}\n\n'
    assert R.last_json_object(text) == {"b": {"c": [1, {"d": 2}]}, "e": 0.5}
    assert R.last_json_object('{"a": 1}\ntrailing words\n') is None
    assert R.last_json_object("no json at all") is None
    assert R.last_json_object("[1, 2]") is None


def test_figures_are_top_level_numbers_and_named_ratios_at_any_depth():
    report = {"lines": 20000, "device": "cpu", "flag": True, "rewrite_over_system_gzip": 3.1,
              "results": {"encdec": {"pairs_per_second": 1.0, "speedup": 16.4}},
              "small": {"total_peak_mib": 890.7}, "peak_ratio_big_over_small": 1.002,
              "fraction_of_matmul": 0.72, "target": ">= 20x", "nested": {"target_ratio": 2}}
    assert R.figures(report) == [("lines", 20000), ("rewrite_over_system_gzip", 3.1),
                                 ("results.encdec.speedup", 16.4), ("peak_ratio_big_over_small", 1.002),
                                 ("fraction_of_matmul", 0.72), ("target", ">= 20x"), ("nested.target_ratio", 2)]


def test_inspect_reads_options_positionals_data_and_targets(tmp_path):
    p = tmp_path / "bench_x.py"
    p.write_text('"""X (target: batched >= 20x); more. Target: within 10%."""\n'
                 "from common import require_shared\n"
                 'ap.add_argument("model_dir")\nap.add_argument("text", nargs="?")\n'
                 'ap.add_argument("--lines", type=int)\nap.add_argument("--repeats", default=3)\n')
    s = R.inspect_script(p)
    assert (s.name, s.options, s.positionals, s.needs_shared) == ("bench_x", ["--lines", "--repeats"], ["model_dir"], True)
    assert s.targets == ["batched >= 20x", "within 10%"]
    assert R.quick_args(s, []) == ["--lines", "20000", "--repeats", "1"]
    assert R.quick_args(s, ["--lines", "5"]) == ["--repeats", "1"]  # the user's value wins
    s.options.append("--quick")
    assert R.quick_args(s, []) == ["--quick"]  # a script's own quick mode knows its sizes best


def test_the_real_scripts_are_understood():
    scripts = {s.name: s for s in map(R.inspect_script, R.discover())}
    assert {"bench_rewrite", "bench_memory", "bench_score_speed", "bench_cslm_ppl"} <= set(scripts)
    assert scripts["bench_cslm_ppl"].positionals == ["model_dir", "text", "kenlm"]
    assert scripts["bench_rewrite"].needs_shared and "--lines" in scripts["bench_rewrite"].options
    assert scripts["bench_score_speed"].targets == ["batched >= 20x", "> 40%"]


def test_run_script_quick_skip_and_failure(tmp_path):
    fake = tmp_path / "bench_fake.py"
    fake.write_text(FAKE)
    s = R.inspect_script(fake)
    r = R.run_script(s, [], quick=True, timeout=60, shared=tmp_path)
    assert r.status == "ok" and r.args == ["--lines", "20000"] and r.targets == ["fast >= 2x"]
    assert R.figures(r.report) == [("lines", 20000), ("nested.speedup", 2.5), ("fast_over_slow", 3.0)]
    # needs ../shared/data, which is missing: skipped without running
    s.needs_shared = True
    r = R.run_script(s, [], quick=False, timeout=60, shared=tmp_path / "absent")
    assert r.status == "skipped" and "../shared/data" in r.reason and r.seconds == 0
    s.needs_shared, s.positionals = False, ["model_dir"]
    r = R.run_script(s, [], quick=False, timeout=60, shared=tmp_path)
    assert r.status == "skipped" and r.reason.startswith("needs arguments MODEL_DIR")
    broken = tmp_path / "bench_broken.py"
    broken.write_text("raise SystemExit('it broke')\n")
    r = R.run_script(R.inspect_script(broken), [], quick=False, timeout=60, shared=tmp_path)
    assert (r.status, r.reason) == ("failed", "exit 1: it broke")
    silent = tmp_path / "bench_silent.py"
    silent.write_text("print('done')\n")
    r = R.run_script(R.inspect_script(silent), [], quick=False, timeout=60, shared=tmp_path)
    assert r.status == "failed" and "no JSON" in r.reason
    own = tmp_path / "bench_own.py"
    own.write_text('import json; print(json.dumps({"model": "m", "skipped": "MOSES is not set"}))\n')
    r = R.run_script(R.inspect_script(own), [], quick=False, timeout=60, shared=tmp_path)
    assert (r.status, r.reason) == ("skipped", "MOSES is not set")  # the script's own verdict


@pytest.mark.parametrize("stderr, status, reason", [
    ("usage: x\nx: error: the following arguments are required: model_dir, text\n", "skipped",
     "needs arguments: model_dir, text"),
    ("usage: x\nx: error: one of the arguments model --config is required\n", "skipped",
     "needs arguments: MODEL or --config"),
    ("set MOSES=/path/to/mosesdecoder (a Moses built with cslm/moses/add-to-moses.sh)\n", "skipped",
     "needs MOSES, a mosesdecoder built with the CSLM feature (cslm/moses/build-moses.sh)"),
    ("SystemExit: benchmarks need ../shared/data beside the project (/x/shared/data/t.gz is missing)\n", "skipped",
     "needs ../shared/data beside the project (not found)"),
    ("Traceback ...\nZeroDivisionError: division by zero\n", "failed", "exit 1: ZeroDivisionError: division by zero"),
])
def test_classify_failure(stderr, status, reason):
    assert R.classify_failure(1, stderr) == (status, reason)


def test_a_script_of_two_forms_given_neither_is_skipped():
    """bench_cslm_future_cost.py takes a model directory or --config: `make bench` without either lists it as
    skipped, not failed."""
    script = R.inspect_script(ROOT / "benchmarks" / "bench_cslm_future_cost.py")
    r = R.run_script(script, [], quick=True, timeout=120, shared=ROOT)  # whether or not ../shared is here
    assert (r.status, r.reason) == ("skipped", "needs arguments: MODEL or --config")


def test_format_table_lists_figures_targets_and_reasons():
    results = [
        R.Result("bench_a", "ok", seconds=12.4, report={"lines": 20000, "a_over_b": 3.14159, "s": "x"},
                 targets=["a within 2x of b"]),
        R.Result("bench_b", "skipped", reason="needs ../shared/data beside the project (not found)"),
        R.Result("bench_c", "failed", reason="exit 1: boom", seconds=2.0, targets=["c > 1"]),
    ]
    lines = R.format_table(results).splitlines()
    assert lines[0].split() == ["benchmark", "status", "time", "figure", "value", "target"]
    assert set(lines[1]) <= {"-", " "}
    assert lines[2].split() == ["bench_a", "ok", "12", "s", "lines", "20,000", "a", "within", "2x", "of", "b"]
    assert lines[3].split() == ["a_over_b", "3.142"]
    assert lines[4].split()[:2] == ["bench_b", "skipped"] and lines[4].endswith("(not found)")
    assert lines[5].split()[:4] == ["bench_c", "failed", "2", "s"] and lines[5].endswith("exit 1: boom  (target: c > 1)")
    assert len(lines) == 6


def test_main_only_and_unknown_names(capsys):
    with pytest.raises(SystemExit, match="no such benchmark: bench_nope"):
        R.main(["--only", "nope"])
    with pytest.raises(SystemExit, match="NAME='ARGS'"):
        R.main(["--args", "rewrite"])


def test_every_script_reports_a_user_error_in_one_line(tmp_path):
    """Each script's main runs through cliutil.run_script: a missing or damaged file is one line naming it,
    exit status 1, not a traceback (read in every script's text, and run in one)."""
    scripts = [p for p in sorted((ROOT / "benchmarks").glob("*.py")) if '__name__ == "__main__"' in p.read_text()]
    assert len(scripts) > 20
    assert [p.name for p in scripts if "run_script(main)" not in p.read_text()] == []
    missing = tmp_path / "no-model"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_cslm_precision.py"), str(missing)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines() == [f"bench_cslm_precision.py: error: {missing}: not a model directory (no config.json)"]
