"""Device operations per line of `moses-rnn score`, by the scorer's sizes.

On a GPU every operation of `PhraseScorer.run` (a kernel, or a view that still passes through torch's
dispatcher) is issued by the one Python thread that holds the GPU, so their number per line bounds the rate as
surely as the host's other work (benchmarks/bench_score_host.py). This counts, for each of the scorer's sizes
(`scorer.device_sizes`: a GPU's for 8, 16, 40 and 80 GB cards, and a 16 and an 80 GB card's with a CPU's
window and token budget, as `score --window 8192 --token-budget 16384` runs), the operations one run of a window's plan
dispatches (torch's dispatch mode) on windows of the shared table, with the `--preset`'s
architecture and shortlists. The counts depend on the words, the shortlists and the sizes, not on the layers'
widths or the weights, so the network runs at small widths on this CPU; the counts are exact, not timings.
"""

from __future__ import annotations

import argparse
import dataclasses

from torch.utils._python_dispatch import TorchDispatchMode

from common import emit, one_thread_slice, untrained_model_dir
from moses_rnn.scoring.scorer import CPU_SIZES, PhraseScorer, gpu_sizes
from moses_rnn.scoring.window import first_window, parse_checked, plan_window
from mtcommon.textio import iter_line_blocks
from mtcommon.cliutil import run_script

GIB = 1 << 30
# what torch reports for cards sold as 8, 16, 40 and 80 GB
SIZES = {f"gpu-{gb}GB": gpu_sizes(int(gib * GIB)) for gb, gib in ((8, 7.8), (16, 15.8), (40, 39.4), (80, 79.1))}
for gb in (16, 80):  # with `--window 8192 --token-budget 16384`
    SIZES[f"gpu-{gb}GB-cpu-window"] = dataclasses.replace(SIZES[f"gpu-{gb}GB"], window=CPU_SIZES.window,
                                                          token_budget=CPU_SIZES.token_budget)


class _Count(TorchDispatchMode):
    """Counts the aten operations dispatched while it is active."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=262_144, help="lines of the shared table")
    ap.add_argument("--preset", default="paper")
    ap.add_argument("--json")
    args = ap.parse_args()
    tmp, table = one_thread_slice(args.lines)
    model_dir = untrained_model_dir(args.preset, table, tmp, width=8)
    rows, vocab = {}, None
    for name, sizes in SIZES.items():
        scorer = PhraseScorer.from_dir(model_dir, device="cpu", sizes=sizes)  # a GPU's sizes, run on this CPU
        vocab, chunk = len(scorer.tgt_vocab), scorer.node_chunk
        blocks = list(iter_line_blocks(table, sizes.window))
        job, _ = first_window(table, blocks[0])
        ops = lines = windows = batches = chunks = 0
        for first, data in blocks:
            plan = plan_window(scorer.planner, parse_checked(job, first, data)).plan
            with _Count() as count:
                scorer.run(plan)
            ops, lines, windows = ops + count.ops, lines + plan.pairs, windows + 1
            batches += len(plan.encoder)
            chunks += sum(len(level.bounds) - 1 for level in plan.levels)
        rows[name] = {"window": sizes.window, "token_budget": sizes.token_budget, "node_chunk": chunk,
                      "windows": windows, "lines": lines, "operations_per_line": round(ops / max(lines, 1), 4),
                      "operations_per_window": round(ops / max(windows, 1)),
                      "encoder_batches_per_window": round(batches / max(windows, 1), 1),
                      "decoder_chunks_per_window": round(chunks / max(windows, 1), 1)}
        print(f"{name:10s} window {sizes.window:6d} tokens {sizes.token_budget:6d} chunk {chunk:5d}: "
              f"{rows[name]['operations_per_line']:.4f} operations a line ({windows} windows)", flush=True)
    emit({"preset": args.preset, "shortlist": vocab, "sizes": rows}, args.json)


if __name__ == "__main__":
    run_script(main)
