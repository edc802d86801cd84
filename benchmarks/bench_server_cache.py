"""The server's n-gram cache alone: what it adds to each score request, empty and full.

    python benchmarks/bench_server_cache.py [--capacity 1000000] [--request 620] [--requests 4000]

`cslm serve`'s CachedScorer (cslm.batcher) in front of an engine that costs nothing (it returns zeros), fed
requests of `--request` random 7-grams (the size the buffer under cube pruning sends: about 620), so that
every millisecond measured is the cache's own: hashing, looking up, gathering the hits, inserting the
misses. The first quarter of the requests finds the cache filling, the last quarter (with the default
sizes) a full one that evicts. Reports the median milliseconds per request of each quarter and the largest.
Target: no more than the engine's own time for such a request on a GPU (0.46 ms for 620 self-normalised
n-grams of the paper-size CSLM on an H200; docs/moses-feature.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import emit  # noqa: E402

from cslm.batcher import CachedScorer  # noqa: E402
from cslm.stats import Stats  # noqa: E402
from mtcommon.cliutil import run_script


class FreeEngine:
    """An engine whose scores cost nothing: zeros."""

    def score_rows(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros(len(rows), np.float32), np.zeros(len(rows), np.uint8)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=int, default=1_000_000, help="`cslm serve --cache-size`")
    ap.add_argument("--request", type=int, default=620, help="n-grams per request")
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--vocab", type=int, default=10_000, help="word ids drawn from 0..VOCAB-1")
    ap.add_argument("--json", help="also write the report here")
    args = ap.parse_args()
    stats = Stats()
    scorer = CachedScorer(FreeEngine(), args.capacity, stats)
    rng = np.random.default_rng(0)
    times = []
    for _ in range(args.requests):
        rows = rng.integers(0, args.vocab, size=(args.request, 7), dtype=np.int32)
        t0 = time.perf_counter()
        scorer(rows)
        times.append(time.perf_counter() - t0)
    ms = np.array(times) * 1e3
    quarter = max(1, len(ms) // 4)
    emit({"capacity": args.capacity, "request": args.request, "requests": args.requests,
          "held_at_end": len(scorer.cache), "hit_fraction": round(stats.cache_hits / max(1, stats.cache_hits
                                                                                        + stats.cache_misses), 4),
          "ms_per_request_first_quarter": round(float(np.median(ms[:quarter])), 3),
          "ms_per_request_last_quarter": round(float(np.median(ms[-quarter:])), 3),
          "ms_per_request_max": round(float(ms.max()), 2)}, args.json)


if __name__ == "__main__":
    run_script(main)
