"""Whole-table rewrite with the smallest model against just decompressing and recompressing it.

Three timings of the same gzipped slice of the real phrase table, all in one
run, the three taken in turn within each of --repeats rounds (so a change of
machine load hits all of them alike), medians reported:
  rewrite    `score_table` with the `tiny` preset (parse, validate, score, format,
             compress), with the worker processes `moses-rnn score` would use
  isal       the same decompress/recompress library the rewrite uses, lines passed through
  gzip       `gzip -dc TABLE | gzip -c` (the system tools at their default level)
Target: rewrite within 1.5x of gzip -dc | gzip -c.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time

from common import emit, require_shared, table_slice, untrained_model_dir, workdir
from moses_rnn.scoring.table import score_table, setup_scoring
from mtcommon.textio import open_input
from mtcommon.outputs import atomic_output
from mtcommon.allocator import reuse_freed_memory
from mtcommon.cliutil import run_script


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, help="scoring processes [what `moses-rnn score` chooses]")
    ap.add_argument("--quick", action="store_true", help="100,000 lines, one round")
    ap.add_argument("--json", help="also write the report here")
    args = ap.parse_args()
    if args.quick:
        args.lines, args.repeats = 100_000, 1
    require_shared()
    reuse_freed_memory()  # as the command line does
    tmp = workdir()
    table = table_slice(args.lines, tmp)
    model_dir = untrained_model_dir("tiny", table, tmp)
    setup = setup_scoring(model_dir, table, device="cpu", workers=args.workers)  # what `moses-rnn score` chooses
    out = os.path.join(tmp, "out.gz")

    def rewrite():
        score_table(setup.scorer, table, out, workers=setup.workers, progress=False)

    def passthrough():
        with open_input(table) as src, atomic_output(out) as dst:
            while block := src.read(1 << 20):
                dst.write(block)

    def system_gzip():
        with open(out, "wb") as dst:
            subprocess.run(f"gzip -dc '{table}' | gzip -c", shell=True, stdout=dst, check=True)

    runs = {"rewrite": rewrite, "isal": passthrough, "gzip": system_gzip}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.repeats):
        for name, fn in runs.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    t = {k: statistics.median(v) for k, v in times.items()}
    emit({
        "lines": args.lines,
        "torch_threads": setup.threads,
        "workers": setup.workers,
        "cores": os.cpu_count(),
        "rewrite_s": round(t["rewrite"], 2),
        "rewrite_lines_per_s": round(args.lines / t["rewrite"]),
        "isal_passthrough_s": round(t["isal"], 2),
        "system_gzip_s": round(t["gzip"], 2),
        "rewrite_over_system_gzip": round(t["rewrite"] / t["gzip"], 2),
        "rewrite_over_isal_passthrough": round(t["rewrite"] / t["isal"], 2),
        "runs_s": {k: [round(x, 2) for x in v] for k, v in times.items()},
    }, args.json)


if __name__ == "__main__":
    run_script(main)
