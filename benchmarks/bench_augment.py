"""Augmentation against scoring: `moses-rnn augment` and `moses-rnn score` on the same table and model.

Runs the two commands as a user runs them (one process each, default threads, CPU), in turn,
--repeats times, on the same 4-score Moses table, and reports the median seconds of each and
their ratio. The table needs its lexical tables (lex.f2e, lex.e2f, as train-model.perl writes
them), and the model is a trained one (the beam search's length depends on the weights): the
pipeline's work folder has both, for example

    python benchmarks/bench_augment.py WORK/model-devtest/phrase-table.0-0.1.1.gz WORK/rnn/model \\
        --lex-f2e WORK/train/model/lex.f2e --lex-e2f WORK/train/model/lex.e2f --input WORK/augment/input.en

--lines takes the table's first lines only (whole source groups are kept together by Moses's
sort, so a cut ends at most one group early). --args passes more options to `augment` (the
pipeline's AUGMENT_INPUT_ARGS by default, the heavier of its two tables with --input).

Target: augment <= 2x the time of score.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit, table_slice  # noqa: E402
from mtcommon.cliutil import run_script

PIPELINE_ARGS = "--few 1 --per-source 3 --max-ngram 3 --max-growth 0.2"  # pipelines/Makefile AUGMENT_INPUT_ARGS


def timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode:
        raise SystemExit(f"{shlex.join(cmd)} failed: {r.stderr.strip().splitlines()[-1] if r.stderr else r.returncode}")
    return time.perf_counter() - t


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("table", help="a Moses phrase table with 4 scores")
    p.add_argument("model", help="a trained model directory")
    p.add_argument("--lex-f2e", required=True)
    p.add_argument("--lex-e2f", required=True)
    p.add_argument("--input", help="text whose missing n-grams augment adds too (as the pipeline does)")
    p.add_argument("--lines", type=int, default=0, help="only the table's first lines [all]")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--args", default=PIPELINE_ARGS, help="more augment options [%(default)s]")
    p.add_argument("-o", "--output", help="also write the JSON report here")
    a = p.parse_args(argv)
    for path in (a.table, a.model, a.lex_f2e, a.lex_e2f, *([a.input] if a.input else [])):
        if not os.path.exists(path):
            raise SystemExit(f"{path}: no such file or directory")
    exe = os.path.join(os.path.dirname(sys.executable), "moses-rnn")
    with tempfile.TemporaryDirectory(prefix="moses-rnn-bench-augment-") as work:
        table = table_slice(a.lines, work, table=a.table) if a.lines else a.table
        out = os.path.join(work, "out.gz")
        score = [exe, "score", table, "-m", a.model, "-o", out, "--unknown", "--quiet"]
        augment = [exe, "augment", table, "-m", a.model, "-o", out, "--lex-f2e", a.lex_f2e, "--lex-e2f", a.lex_e2f,
                   "--quiet", *shlex.split(a.args), *(["--input", a.input] if a.input else [])]
        runs = {"score": [], "augment": []}
        for _ in range(a.repeats):
            runs["score"].append(timed(score))
            runs["augment"].append(timed(augment))
        with (gzip.open if table.endswith(".gz") else open)(table, "rb") as f:
            lines = sum(1 for _ in f)
    s, g = statistics.median(runs["score"]), statistics.median(runs["augment"])
    emit({
        "table": a.table, "lines": lines, "model": a.model, "augment_args": a.args, "input": a.input,
        "score_seconds": s, "augment_seconds": g, "runs": runs,
        "augment_over_score": g / s, "target_augment_over_score": 2.0,
    }, a.output)


if __name__ == "__main__":
    run_script(main)
