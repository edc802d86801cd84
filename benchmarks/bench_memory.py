"""Peak memory of `moses-rnn score` on a 1M-line and on the full 4M-line real table.

Each run is a fresh process scoring with the `tiny` preset (untrained weights:
memory does not depend on their values) with the worker processes `moses-rnn
score` would use; the peak resident set sizes (getrusage ru_maxrss) of the main
process and of the largest worker are reported, and their total (main +
workers x worker). Target: the two totals within 10%.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from common import REAL_TABLE, require_shared, table_slice, untrained_model_dir, workdir
from mtcommon.cliutil import run_script

CHILD = """
import resource, sys
from mtcommon.allocator import reuse_freed_memory
reuse_freed_memory()  # as the command line does
from moses_rnn.scoring.scorer import PhraseScorer
from moses_rnn.scoring.table import default_workers, score_table
from mtcommon.runtime import configure_threads, resolve_device
if __name__ == "__main__":
    cpu = resolve_device("cpu")
    scorer = PhraseScorer.from_dir(sys.argv[1], device="cpu")
    configure_threads(cpu, None, scorer.model.config)
    workers = default_workers(cpu, scorer.model.config, sys.argv[2])
    stats = score_table(scorer, sys.argv[2], sys.argv[3], workers=workers, progress=False)
    print(stats.lines, workers, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
          resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def peak(model_dir: str, table: str, out: str, folder: str) -> dict:
    """Peak RSS (MiB) of the main process and of the largest worker; total = main + workers x worker."""
    script = os.path.join(folder, "child.py")
    with open(script, "w") as f:
        f.write(CHILD)
    t = time.perf_counter()
    p = subprocess.run([sys.executable, script, model_dir, table, out], capture_output=True, text=True, check=True)
    lines, workers, main_kib, child_kib = (int(x) for x in p.stdout.split())
    main_mib, child_mib = main_kib / 1024.0, (child_kib / 1024.0 if workers > 1 else 0.0)
    return {"lines": lines, "workers": workers, "main_peak_mib": round(main_mib, 1),
            "worker_peak_mib": round(child_mib, 1), "total_peak_mib": round(main_mib + workers * child_mib, 1),
            "seconds": round(time.perf_counter() - t, 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small-lines", type=int, default=1_000_000)
    args = ap.parse_args()
    require_shared()
    tmp = workdir()
    small = table_slice(args.small_lines, tmp)
    model_dir = untrained_model_dir("tiny", small, tmp)
    out = os.path.join(tmp, "out.gz")
    small_run = peak(model_dir, small, out, tmp)
    big_run = peak(model_dir, str(REAL_TABLE), out, tmp)
    print(json.dumps({
        "small": small_run,
        "big": big_run,
        "peak_ratio_big_over_small": round(big_run["total_peak_mib"] / small_run["total_peak_mib"], 3),
    }, indent=2))


if __name__ == "__main__":
    run_script(main)
