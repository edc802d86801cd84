"""The C++ evaluator's layers after the first in 8 bits (`precision=int8`) against float32.

    python benchmarks/bench_cslm_precision.py MODEL_DIR [--text TEXT] [--sentences 1500] [--seconds 1]
        [--repeats 5] [--json OUT]

For a self-normalised model directory (`cslm train --self-norm`), the n-grams of
the first --sentences sentences of TEXT (test.tok.fr of ../shared/data by
default: every word and </s>, in text order) scored by the evaluator of Moses's
in-process mode and `cslm serve` (cslm/native.py) with `precision=fp32` and
`precision=int8` (cslm/cpp/cslm_local.h, "Precision": the first layer's tables
in bfloat16, the layers after it in 8 bits):

* accuracy: |int8 - fp32| of the self-normalised scores o_w (mean, median, 99th
  percentile, largest), and the perplexity of the exact scores o_w - ln Z
  each way;
* speed: n-grams per second on one thread with no history cache, so that every
  history's hidden layers are computed (consecutive n-grams of one history
  share them, as in a decoder's requests); the two precisions take turns of
  --seconds, medians of --repeats;
* memory: how much each model's loading grew the process's resident memory
  (`resident_mib`, Linux): the premultiplied first-layer tables for the most
  part, in bfloat16 with int8 (half float32's size).

Target: int8's perplexity within 0.1% of float32's (`ppl_ratio_int8_over_fp32`),
and int8 faster on a CPU with AVX-512 VNNI or AMX (`speedup_int8_over_fp32` > 1).
`kernels` names the vector instructions the evaluator used (CSLM_KERNELS caps
them). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from common import SHARED, emit
from cslm.engine import Engine
from cslm.native import NativeModel
from mtcommon.textio import iter_lines
from mtcommon.cliutil import run_script

TEST_TEXT = SHARED / "en-fr-moses" / "test.tok.fr"


def rows_of(model_dir: str, text: str, sentences: int) -> np.ndarray:
    """The padded n-gram rows of the first `sentences` lines of `text`, as the engine builds them."""
    engine = Engine.load(model_dir, device="cpu", normalized=False)
    lines = []
    for _, line in iter_lines(text):
        lines.append(line.split())
        if len(lines) == sentences:
            break
    return np.concatenate([engine.sentence_ngrams(s) for s in lines]).astype(np.uint32)


def rate(model: NativeModel, rows: np.ndarray, seconds: float) -> float:
    """N-grams per second of self-normalised scoring for about `seconds`."""
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        model.score(rows, normalized=False)
        done += len(rows)
    return done / (time.perf_counter() - start)


def resident_mib() -> float | None:
    """This process's resident memory in MiB (Linux's /proc/self/statm), or None elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
    except (OSError, ValueError, IndexError):
        return None


def load(model_dir: str, precision: str) -> tuple[NativeModel, float | None]:
    """The evaluator of `model_dir` on one thread without a history cache, and the MiB its loading added."""
    before = resident_mib()
    model = NativeModel(model_dir, 0, 1, precision)
    after = resident_mib()
    return model, None if before is None or after is None else after - before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--text", default=str(TEST_TEXT))
    ap.add_argument("--sentences", type=int, default=1500)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", help="also write the report here")
    args = ap.parse_args()
    rows = rows_of(args.model, args.text, args.sentences)
    loaded = {p: load(args.model, p) for p in ("fp32", "int8")}
    models = {p: m for p, (m, _) in loaded.items()}
    report: dict = {"model": args.model, "ngrams": len(rows), "kernels": models["int8"].kernels,
                    "resident_mib": {p: mib for p, (_, mib) in loaded.items()}}
    sn = {p: m.score(rows, normalized=False) for p, m in models.items()}
    exact = {p: m.score(rows, normalized=True) for p, m in models.items()}
    d = np.abs(sn["int8"] - sn["fp32"]).astype(np.float64)
    report["abs_diff_selfnorm"] = {"mean": float(d.mean()), "median": float(np.median(d)),
                                   "p99": float(np.percentile(d, 99)), "max": float(d.max())}
    ppl = {p: float(np.exp(-exact[p].astype(np.float64).mean())) for p in exact}
    report["perplexity"] = ppl
    report["ppl_ratio_int8_over_fp32"] = ppl["int8"] / ppl["fp32"]
    rates: dict[str, list[float]] = {p: [] for p in models}
    for _ in range(args.repeats):  # the two take turns, so that both see the machine's same moods
        for p, m in models.items():
            rates[p].append(rate(m, rows, args.seconds))
    report["ngrams_per_s"] = {p: statistics.median(r) for p, r in rates.items()}
    report["speedup_int8_over_fp32"] = statistics.median(i / f for i, f in zip(rates["int8"], rates["fp32"]))
    emit(report, args.json)


if __name__ == "__main__":
    run_script(main)
