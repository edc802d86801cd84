"""Peak memory of `moses-rnn score` on a 1M-line and on the full 4M-line real table.

Each run is a fresh process scoring with the `tiny` preset (untrained weights:
memory does not depend on their values); its peak resident set size
(getrusage ru_maxrss) is reported. Target: the two peaks within 10%.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from common import REAL_TABLE, require_shared, table_slice, untrained_model_dir, workdir

CHILD = """
import resource, sys
from moses_rnn.score import PhraseScorer, configure_threads, score_table
from moses_rnn.train import resolve_device
scorer = PhraseScorer.from_dir(sys.argv[1], device="cpu")
configure_threads(resolve_device("cpu"), None, scorer.model.config)
stats = score_table(scorer, sys.argv[2], sys.argv[3], progress=False)
print(stats.lines, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def peak(model_dir: str, table: str, out: str) -> tuple[int, float, float]:
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CHILD, model_dir, table, out], capture_output=True, text=True, check=True)
    lines, kib = p.stdout.split()
    return int(lines), int(kib) / 1024.0, time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small-lines", type=int, default=1_000_000)
    args = ap.parse_args()
    require_shared()
    tmp = workdir()
    small = table_slice(args.small_lines, tmp)
    model_dir = untrained_model_dir("tiny", small, tmp)
    out = os.path.join(tmp, "out.gz")
    n_small, mib_small, s_small = peak(model_dir, small, out)
    n_big, mib_big, s_big = peak(model_dir, str(REAL_TABLE), out)
    print(json.dumps({
        "small_lines": n_small, "small_peak_mib": round(mib_small, 1), "small_seconds": round(s_small, 1),
        "big_lines": n_big, "big_peak_mib": round(mib_big, 1), "big_seconds": round(s_big, 1),
        "peak_ratio_big_over_small": round(mib_big / mib_small, 3),
    }, indent=2))


if __name__ == "__main__":
    main()
