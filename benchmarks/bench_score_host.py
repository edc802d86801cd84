"""The host's work per line of `moses-rnn score`, stage by stage, and the rate it allows one process.

On a GPU the network's kernels run while the host prepares the next ones, so a lone scoring process goes no
faster than its own host work: reading, parsing, planning (distinct phrases, ids, the prefix tree), sending the
plan's indices, formatting and writing. This measures each stage on windows of the shared table (one thread,
medians over windows), and the `run` of the plans on this CPU with a model of `--preset` for comparison:

  - one process alone:   lines/s = 1 / (read + parse + plan + format + write per line), a GPU's ceiling;
  - with planning workers (`--workers K` on a GPU): the process that holds the GPU reads, unpickles the planned
    windows, formats and writes; parsing and planning go to the workers.
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import time

import numpy as np
import torch

from common import emit, require_shared, table_slice, untrained_model_dir, workdir
from moses_rnn.formats.phrasetable import format_columns, insert_columns
from moses_rnn.scoring.scorer import PhraseScorer
from moses_rnn.scoring.window import first_window, parse_checked, plan_window
from mtcommon.outputs import atomic_output
from mtcommon.runtime import configure_threads
from mtcommon.textio import iter_line_blocks


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=200_000, help="lines of the shared table")
    ap.add_argument("--window", type=int, default=8192)
    ap.add_argument("--preset", default="tiny", help="the model whose plans are run on this CPU")
    ap.add_argument("--json")
    args = ap.parse_args()
    require_shared()
    configure_threads(torch.device("cpu"), 1)
    tmp = workdir()
    table = table_slice(args.lines, tmp)
    scorer = PhraseScorer.from_dir(untrained_model_dir(args.preset, table, tmp), device="cpu")

    t = time.perf_counter()
    blocks = list(iter_line_blocks(table, args.window))
    read = time.perf_counter() - t
    job, _ = first_window(table, blocks[0], unknown=True)
    stages: dict[str, list[float]] = {k: [] for k in ("parse", "plan", "pickle", "unpickle", "run", "format")}
    texts, lines = [], 0

    def timed(stage, f, *a):
        t = time.perf_counter()
        out = f(*a)
        stages[stage].append(time.perf_counter() - t)
        return out

    for first, data in blocks:
        window = timed("parse", parse_checked, job, first, data)
        planned = timed("plan", plan_window, scorer.planner, window)
        sent = timed("pickle", pickle.dumps, planned, pickle.HIGHEST_PROTOCOL)
        planned = timed("unpickle", pickle.loads, sent)
        log_p = timed("run", scorer.run, planned.plan)
        values = np.stack([log_p, planned.plan.unknown], axis=1)
        texts.append(timed("format", lambda: insert_columns(planned.data, planned.insert_at, format_columns(values))))
        lines += len(window)
    t = time.perf_counter()
    with atomic_output(f"{tmp}/out.gz") as out:  # as `score_table` writes: gzip in a thread of its own
        for text in texts:
            out.write(text)
    write = time.perf_counter() - t

    per_line = {k: statistics.median(v) / args.window * 1e6 for k, v in stages.items()}
    per_line["read"], per_line["write"] = read / lines * 1e6, write / lines * 1e6
    alone = sum(per_line[k] for k in ("read", "parse", "plan", "format", "write"))
    beside = sum(per_line[k] for k in ("read", "unpickle", "format", "write"))
    emit({
        "lines": lines, "window": args.window, "preset": args.preset, "threads": 1,
        "us_per_line": {k: round(v, 3) for k, v in per_line.items()},
        "one_process_host_lines_per_s": round(1e6 / alone),
        "with_planning_workers_host_lines_per_s": round(1e6 / beside),
        "planning_worker_lines_per_s": round(1e6 / (per_line["parse"] + per_line["plan"] + per_line["pickle"])),
        "cpu_run_lines_per_s": round(1e6 / per_line["run"]),
    }, args.json)


if __name__ == "__main__":
    main()
