"""The host's work per line of `moses-rnn score`, stage by stage, and the rate it allows one process.

On a GPU the network's kernels run while the host prepares the next ones, so a lone scoring process goes no
faster than its own host work: reading, parsing, planning (distinct phrases, ids, the prefix tree), sending the
plan's indices, formatting and writing. This measures each stage on windows of the shared table (one thread,
medians over windows), and the `run` of the plans on this CPU with a model of `--preset` for comparison:

  - one process alone: lines/s = 1 / (read + parse + plan + format + write per line), a GPU's ceiling;
  - a planning worker (`--workers K` on a GPU): lines/s = 1 / (parse + plan + pickle + format per line).

Then whole rewrites of the table (`score_table`, gzip in and out) with a device that costs nothing (the plans'
`run` replaced by zeros), alone and with `--workers K` planning workers, medians of `--repeats`: the rate the
host alone allows, its processes and pipes included, and the CPU time the main thread spends per line (with
enough cores for the workers, the ceiling of the process that holds a GPU).
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import time

import numpy as np

from common import emit, one_thread_slice, untrained_model_dir
from moses_rnn.formats.phrasetable import format_columns, insert_columns
from moses_rnn.scoring import pool
from moses_rnn.scoring.scorer import PhraseScorer
from moses_rnn.scoring.table import score_table
from moses_rnn.scoring.window import first_window, parse_checked, plan_window
from mtcommon.outputs import atomic_output
from mtcommon.textio import iter_line_blocks
from mtcommon.cliutil import run_script


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=200_000, help="lines of the shared table")
    ap.add_argument("--window", type=int, default=8192)
    ap.add_argument("--preset", default="tiny", help="the model whose plans are run on this CPU")
    ap.add_argument("--workers", type=int, nargs="+", default=[2], help="--workers of the whole rewrites")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--in-hand", type=int, default=8,
                    help="windows a worker may hold in the whole rewrites (the command's 2 lets this process score "
                         "windows itself when the workers fall behind, as they do on few cores; more measures what "
                         "this process spends on the windows the workers do)")
    ap.add_argument("--json")
    args = ap.parse_args()
    tmp, table = one_thread_slice(args.lines)
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
    free = {}
    scorer.run = lambda plan: np.zeros(plan.pairs)  # a device that costs nothing: what the host allows
    pool.WINDOWS_PER_WORKER = args.in_hand
    own = [0]  # windows this process rewrote itself, the workers having their share in hand
    in_this_process = pool.WindowPool._in_this_process

    def counted(self, first, data):
        own[0] += 1
        return in_this_process(self, first, data)

    pool.WindowPool._in_this_process = counted
    for k in [1, *args.workers]:
        rates, main_cpu, overhead = [], [], []
        for _ in range(args.repeats):
            own[0] = 0
            cpu = time.thread_time()  # this thread's CPU time: what the process holding a GPU spends per line
            stats = score_table(scorer, table, f"{tmp}/free.gz", unknown=True, window=args.window, workers=k,
                                progress=False, planning=True)
            main_cpu.append((time.thread_time() - cpu) / stats.lines * 1e6)
            rates.append(stats.pairs_per_second)
            if k > 1:  # this thread's time on the windows the workers planned and formatted, per line
                solo = free["workers_1"]["main_thread_us_per_line"]
                done_here = min(stats.lines, (1 + own[0]) * args.window)  # the first window is always done here
                overhead.append((main_cpu[-1] * stats.lines - solo * done_here) / (stats.lines - done_here))
        free[f"workers_{k}"] = {"lines_per_s": round(statistics.median(rates)),
                                "main_thread_us_per_line": round(statistics.median(main_cpu), 3)}
        if overhead:
            free[f"workers_{k}"]["main_thread_us_per_worker_line"] = round(statistics.median(overhead), 3)
    emit({
        "lines": lines, "window": args.window, "preset": args.preset, "threads": 1,
        "us_per_line": {k: round(v, 3) for k, v in per_line.items()},
        "one_process_host_lines_per_s": round(1e6 / alone),
        "planning_worker_lines_per_s": round(1e6 / sum(per_line[k] for k in ("parse", "plan", "pickle", "format"))),
        "cpu_run_lines_per_s": round(1e6 / per_line["run"]),
        "rewrite_free_device": free, "windows_in_hand": args.in_hand,
    }, args.json)


if __name__ == "__main__":
    run_script(main)
