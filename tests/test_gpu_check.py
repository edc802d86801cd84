"""benchmarks/gpu_check.py: its dry run on CPU writes a complete report; its parts record failures and go on."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check  # noqa: E402

CHECKS = ["matmul", "cslm_train", "cslm_server", "cslm_server_sn", "cslm_server_sn_torch", "cslm_decode",
          "train_paper", "train_batch", "score_fp32", "score_bf16", "score_sharded", "score_workers", "train_sent", "translate", "rescore_nbest"]


def _finite(v) -> bool:
    if isinstance(v, (bool, str)):
        return True
    return isinstance(v, (int, float)) and math.isfinite(v)


def test_dry_run_writes_every_check(tmp_path):
    """The whole check on CPU with tiny models (about a minute): every check present, none failed, figures
    finite where it ran, the Markdown beside the JSON."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    env.pop("MOSES", None)
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "-o", str(tmp_path), "--dry-run"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["device_type"] == "cpu" and report["device"].startswith("CPU: ")
    assert report["date"] and report["total_seconds"] > 0
    checks = {c["name"]: c for c in report["checks"]}
    assert list(checks) == CHECKS
    failed = {n: c["error"] for n, c in checks.items() if c["status"] == "failed"}
    assert not failed and p.returncode == 0, (failed, p.stderr[-3000:])
    for name, c in checks.items():
        assert c["status"] in ("ok", "skipped"), name
        assert c["seconds"] >= 0
        if c["status"] == "skipped":
            assert c["error"], name  # the reason
            continue
        assert c["figures"] and all(_finite(v) for v in c["figures"].values()), (name, c["figures"])
        for t in c["targets"]:
            assert t["figure"] in c["figures"], (name, t)
    assert checks["cslm_decode"]["status"] == "skipped" and "--moses" in checks["cslm_decode"]["error"]
    # the self-normalised server check asks with a decoder's request size, the exact one with the benchmark's
    assert checks["cslm_server_sn"]["figures"]["request_ngrams"] == gpu_check.DECODER_REQUEST
    assert checks["cslm_server"]["figures"]["request_ngrams"] == 256
    # the default evaluator of a CPU, then torch's, which it is measured against
    from cslm import native
    want = "native" if native.library_path() is not None else "torch"
    assert checks["cslm_server_sn"]["figures"]["evaluator"] == want
    assert checks["cslm_server_sn_torch"]["figures"]["evaluator"] == "torch"
    assert checks["cslm_server"]["figures"]["evaluator"] == "torch"
    assert checks["score_sharded"]["figures"]["identical_to_unsharded"] is True
    assert checks["score_fp32"]["figures"]["processes"] >= 1  # the default's, which score_workers compares with
    assert checks["score_workers"]["figures"]["identical_to_default"] is True
    assert checks["score_workers"]["figures"]["cpu_sizes_max_abs_delta_logp"] == 0.0  # on CPU the same sizes
    assert checks["score_sharded"]["passed"] is True
    assert checks["rescore_nbest"]["figures"]["hypotheses_with_feature"] == checks["rescore_nbest"]["figures"][
        "hypotheses"] > 0
    md = (tmp_path / "gpu_check.md").read_text()
    assert report["device"] in md and report["date"] in md
    for name in CHECKS:
        assert f"| {name} | {checks[name]['status']} |" in md


@pytest.fixture
def check(tmp_path):
    return gpu_check.GpuCheck(tmp_path, dry_run=True, budget=60, moses=None, work=str(tmp_path))


def test_a_failing_check_is_recorded_and_the_run_goes_on(check):
    def broken(c):
        c.run([sys.executable, "-c", "import sys; sys.exit('cannot open model: no such file')"])

    r = check.run_check("translate", broken, [])
    assert (r.status, r.error, r.figures, r.passed) == ("failed", "exit 1: cannot open model: no such file", {}, None)
    r = check.run_check("cslm_server", lambda c: {"server_1_client_vs_engine": 0.5},
                        [gpu_check.Target("server_1_client_vs_engine", ">=", 0.8)])
    assert (r.status, r.passed) == ("ok", False)
    assert [x.name for x in check.results] == ["translate", "cslm_server"]


def test_a_check_past_its_time_is_killed_with_its_children(check, tmp_path):
    pid_file = tmp_path / "child.pid"
    code = ("import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    t = time.monotonic()
    r = check.run_check("matmul", lambda c: c.run([sys.executable, "-c", code], timeout=3), [])
    assert r.status == "failed" and "timed out after 3 s" in r.error
    assert time.monotonic() - t < 30
    child = int(pid_file.read_text())
    for _ in range(50):  # killed, the grandchild is gone or a zombie left to init
        try:
            state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.1)
    else:
        pytest.fail("the check's grandchild outlived its timeout")


def test_gpu_only_targets_are_not_held_against_a_cpu_run(check):
    r = check.run_check("score_fp32", lambda c: {"pairs_per_s": 10.0},
                        [gpu_check.Target("pairs_per_s", ">=", 2e6, gpu_only=True)])
    assert (r.status, r.passed) == ("ok", None)
    r = check.run_check("score_bf16", lambda c: {"pairs_per_s": 10.0, "mean_abs_delta_logp": 0.5},
                        [gpu_check.Target("pairs_per_s", ">=", 2e6, gpu_only=True),
                         gpu_check.Target("mean_abs_delta_logp", "<=", 0.02)])
    assert r.passed is False
    assert "mean_abs_delta_logp <= 0.02" in gpu_check.markdown(check.report())


def test_only_runs_a_check_with_those_it_uses(check):
    order = [name for name, _, _ in check.plan()]
    assert order == CHECKS == list(gpu_check.TIMEOUTS)
    for name, needs in gpu_check.NEEDS.items():  # what a check uses has run before it
        assert all(order.index(n) < order.index(name) for n in needs), name
    assert gpu_check.with_needs(["cslm_server"]) == {"cslm_server", "cslm_train", "matmul"}
    assert gpu_check.with_needs(["score_bf16", "translate"]) == {
        "score_bf16", "score_fp32", "train_paper", "matmul", "translate", "train_sent"}


def test_pack_data_holds_what_a_run_reads(tmp_path, monkeypatch):
    """--pack-data cuts the data to the GPU run's sizes; a run pointed at the pack reads it, not the example."""
    data = tmp_path / "data"
    data.mkdir()
    lines = gpu_check.EXAMPLE_TABLE.read_bytes().splitlines(keepends=True)
    with gzip.open(data / "phrase-table.gz", "wb") as f:
        f.writelines(lines)
    for name in ("train.tok.en", "train.tok.fr", "dev.tok.en"):
        (data / name).write_text("".join(f"{name} {i}\n" for i in range(50)))
    small = dataclasses.replace(gpu_check.GPU, score_lines=300, train_lines=200, sent_lines=20, cslm_lines=30,
                                translate_lines=5, nbest_lines=7)
    monkeypatch.setattr(gpu_check, "GPU", small)
    gpu_check.main(["--pack-data", str(tmp_path / "pack"), "--data", str(data)])
    pack = tmp_path / "pack"
    assert sorted(p.name for p in pack.iterdir()) == sorted(gpu_check.DATA_FILES)
    with gzip.open(pack / "phrase-table.gz", "rb") as f:
        assert f.read() == b"".join(lines[:300])
    assert (pack / "train.tok.fr").read_text().splitlines() == [f"train.tok.fr {i}" for i in range(30)]
    assert len((pack / "dev.tok.en").read_text().splitlines()) == 7
    run = gpu_check.GpuCheck(tmp_path, dry_run=True, budget=60, moses=None, work=str(tmp_path), data=pack)
    assert run.data == pack
    assert Path(run.dev_source(3)).read_text() == "dev.tok.en 0\ndev.tok.en 1\ndev.tok.en 2\n"
    with pytest.raises(SystemExit, match="lacks one of"):
        gpu_check.GpuCheck(tmp_path, dry_run=False, budget=60, moses=None, work=str(tmp_path), data=data / "none")


ARPA = """
\\data\\
ngram 1=6
ngram 2=6

\\1-grams:
-1.0\t<unk>\t0
-99\t<s>\t-0.30
-0.7\t</s>\t0
-0.6\tle\t-0.20
-0.9\tchat\t-0.25
-1.2\tchien\t-0.10

\\2-grams:
-0.3\t<s> le
-0.4\tle chat
-0.5\tle chien
-0.2\tchat </s>
-0.3\tchien </s>
-0.8\t<s> chien

\\end\\
"""


def test_filter_arpa_keeps_every_ngram_of_the_vocabulary(tmp_path):
    """common.filter_arpa: n-grams with a word outside the vocabulary go, the counts follow, and text over
    the vocabulary scores the same under KenLM with the filtered file as with the whole one."""
    from common import filter_arpa

    src = tmp_path / "lm.arpa.gz"
    with gzip.open(src, "wt", encoding="utf-8") as f:
        f.write(ARPA)
    kept = filter_arpa(src, tmp_path / "small.arpa", {"le", "chat"})
    assert kept == {1: 5, 2: 3}
    text = (tmp_path / "small.arpa").read_text()
    assert "ngram 1=5\nngram 2=3\n" in text and "chien" not in text and text.rstrip().endswith("\\end\\")
    kenlm = pytest.importorskip("kenlm", reason="the lossless check needs the optional kenlm package")
    (tmp_path / "lm.arpa").write_text(ARPA)
    whole, small = kenlm.Model(str(tmp_path / "lm.arpa")), kenlm.Model(str(tmp_path / "small.arpa"))
    for sentence in ("le chat", "chat le", "le le chat chat", "chat"):
        assert small.score(sentence) == pytest.approx(whole.score(sentence), abs=1e-6), sentence
    with pytest.raises(SystemExit, match="not an ARPA file"):
        (tmp_path / "bad.arpa").write_text("just text\n")
        filter_arpa(tmp_path / "bad.arpa", tmp_path / "out.arpa", {"le"})


def test_pack_decode_cuts_the_system_to_the_quick_decode(tmp_path):
    """pack_decode: the test set whole, the table filtered to its first sentences under the name
    bench_cslm_decode.py looks for, the LM filtered to the words those phrases and the test set hold."""
    system = tmp_path / "system"
    system.mkdir()
    (system / "test.tok.en").write_text("the cat\nthe dog\n")
    with gzip.open(system / "phrase-table.gz", "wt", encoding="utf-8") as f:
        f.write("the ||| le ||| 1 1 1 1 ||| 0-0 ||| 1 1 1\ncat ||| chat ||| 1 1 1 1 ||| 0-0 ||| 1 1 1\n"
                "dog ||| chien ||| 1 1 1 1 ||| 0-0 ||| 1 1 1\n")
    with gzip.open(system / "lm.fr.5.arpa.gz", "wt", encoding="utf-8") as f:
        f.write(ARPA)
    out = tmp_path / "decode"
    gpu_check.pack_decode(system, out, sentences=1)
    assert sorted(p.name for p in out.iterdir()) == ["lm.fr.5.arpa.gz", "phrase-table.first1.gz", "test.tok.en"]
    with gzip.open(out / "phrase-table.first1.gz", "rt", encoding="utf-8") as f:
        assert [line.split(" ||| ")[1] for line in f] == ["le", "chat"]
    with gzip.open(out / "lm.fr.5.arpa.gz", "rt", encoding="utf-8") as f:
        lm = f.read()
    assert "ngram 1=5\n" in lm and "\tchien" not in lm and "\tle chat\n" in lm


def test_reported_commands_name_no_machine_paths(tmp_path):
    """The report shows each command without this machine's paths: WORK for the work folder, the checkout's
    files relative to it, python3 for the interpreter and the tools beside it by name."""
    run = gpu_check.GpuCheck(tmp_path, dry_run=True, budget=60, moses=None, work=str(tmp_path / "w"))
    beside = str(Path(sys.executable).parent / "torchrun")
    cmd = f"{sys.executable} {ROOT / 'benchmarks' / 'bench_cslm_decode.py'} {tmp_path / 'w'}/cslm-model"
    assert run.shown(cmd) == "python3 benchmarks/bench_cslm_decode.py WORK/cslm-model"
    assert run.shown(f"{beside} --standalone") == "torchrun --standalone"


def test_the_decode_figures_keep_every_rows_time_and_each_servers_split():
    """cslm_decode's figures from a bench_cslm_decode.py report: the best cube-pruning server row, each row's
    time and asks, and each server row's p50 from read to reply and of its scoring; no such row: failed."""
    split = {"latency_ms": {"p50": 2.3, "p99": 9.0}, "compute_ms": {"p50": 0.9, "p99": 3.0}}
    rep = {"rows": {
        "baseline": {"seconds_per_sentence": 0.02},
        "cslm_in_process": {"seconds_per_sentence": 0.06, "ratio_to_baseline": 3.0, "evaluated_per_sentence": 9.0},
        "cslm_server_buffered_predict_1.5": {"seconds_per_sentence": 0.1, "ratio_to_baseline": 5.0,
                                             "requests_per_sentence": 40.0, "server_ms": split},
        "cslm_server_buffered_predict_8": {"seconds_per_sentence": 0.08, "ratio_to_baseline": 4.0,
                                           "server_ms": None}}}
    f = gpu_check.decode_figures(rep)
    assert f["best_ratio_to_baseline"] == 4.0 and f["row"] == "cslm_server_buffered_predict_8"
    assert f["baseline_s_per_sentence"] == 0.02 and f["in_process_ratio_to_baseline"] == 3.0
    assert f["in_process_evaluated"] == 9.0 and f["server_predict_1.5_requests"] == 40.0
    assert f["server_predict_1.5_latency_ms_p50"] == 2.3 and f["server_predict_1.5_compute_ms_p50"] == 0.9
    assert not any(k.startswith("server_predict_8_") and k.endswith("ms_p50") for k in f)
    with pytest.raises(gpu_check.CheckFailed, match="no cube-pruning server row"):
        gpu_check.decode_figures({"rows": {"baseline": {"seconds_per_sentence": 0.02}}})
