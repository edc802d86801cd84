"""Whole-table rewrite with the smallest model against just decompressing and recompressing it.

Three timings of the same gzipped slice of the real phrase table, median of
--repeats runs each, all in one run:
  rewrite    `score_table` with the `tiny` preset (parse, validate, score, format,
             compress), with the worker processes `moses-rnn score` would use
  isal       the same decompress/recompress library the rewrite uses, lines passed through
  gzip       `gzip -dc TABLE | gzip -c` (the system tools at their default level)
Target: rewrite within 2x of decompress+recompress.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess

from common import median_time, require_shared, table_slice, untrained_model_dir, workdir
from moses_rnn.score import score_table, setup_scoring
from moses_rnn.textio import atomic_output, open_input


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=500_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    require_shared()
    tmp = workdir()
    table = table_slice(args.lines, tmp)
    model_dir = untrained_model_dir("tiny", table, tmp)
    setup = setup_scoring(model_dir, table, device="cpu")  # what `moses-rnn score --device cpu` chooses
    threads, workers = setup.threads, setup.workers
    out = os.path.join(tmp, "out.gz")

    def rewrite():
        score_table(setup.scorer, table, out, workers=workers, progress=False)

    def passthrough():
        with open_input(table) as src, atomic_output(out) as dst:
            for line in src:
                dst.write(line)

    def system_gzip():
        with open(out, "wb") as dst:
            subprocess.run(f"gzip -dc '{table}' | gzip -c", shell=True, stdout=dst, check=True)

    t_rewrite = median_time(rewrite, args.repeats)
    t_isal = median_time(passthrough, args.repeats)
    t_gzip = median_time(system_gzip, args.repeats)
    print(json.dumps({
        "lines": args.lines,
        "torch_threads": threads,
        "workers": workers,
        "rewrite_s": round(t_rewrite, 2),
        "rewrite_lines_per_s": round(args.lines / t_rewrite),
        "isal_passthrough_s": round(t_isal, 2),
        "system_gzip_s": round(t_gzip, 2),
        "rewrite_over_system_gzip": round(t_rewrite / t_gzip, 2),
        "rewrite_over_isal_passthrough": round(t_rewrite / t_isal, 2),
    }, indent=2))


if __name__ == "__main__":
    main()
