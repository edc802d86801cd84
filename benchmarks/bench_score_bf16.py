"""bfloat16 against float32 scoring: speed and how far the scores move, in one run.

The same 8,192 consecutive pairs of the real table (a slice from its middle,
so its source groups are whole) are scored by `PhraseScorer(dtype="fp32")`
and `PhraseScorer(dtype="bf16")` (weights of the recurrent and readout maps
cast to bfloat16 once; output layer and softmax normaliser in float32), the
two timed in turn within each of --repeats rounds, medians reported. Printed:
  - pairs/s of each and their ratio (target: bf16 >= 1.5x fp32);
  - the largest and the mean |log p_bf16 - log p_fp32| over the pairs
    (target: mean <= 0.02);
  - how many source phrases have two targets whose order by log p differs
    between the two, counting only pairs of targets whose float32 scores
    differ by more than a tie tolerance (0, 0.01, 0.05, 0.1) (target: none
    beyond ties);
  - float32 and bfloat16 matrix-product rates at the model's decoder shapes.

--model scores a trained model directory (score differences only mean
something for a trained model); without it the model is an untrained one of
--preset's sizes (speed only: its near-uniform distributions barely move).
Needs a CPU with AVX-512 BF16 or AMX, or a GPU (--device cuda).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import numpy as np
import torch

from common import emit, gemm_rate, require_shared, sync, table_slice, untrained_model_dir, workdir
from moses_rnn.formats.phrasetable import read_phrase_table
from moses_rnn.scoring.scorer import PhraseScorer
from mtcommon.runtime import configure_threads, resolve_device
from mtcommon.cliutil import run_script

TIES = (0.0, 0.01, 0.05, 0.1)


def gemm_gflops(device: torch.device, m: int, k: int, n: int, dtype: torch.dtype) -> float:
    return round(gemm_rate(device, m, k, n, dtype) / 1e9, 1)


def reordered_sources(pairs, lp32: np.ndarray, lp16: np.ndarray) -> dict[str, int]:
    """Sources with two targets ranked differently by the two runs, their float32 gap above each tie tolerance."""
    groups: dict[str, list[int]] = {}
    for i, (s, _) in enumerate(pairs):
        groups.setdefault(s, []).append(i)
    counts = {str(tie): 0 for tie in TIES}
    for members in groups.values():
        if len(members) < 2:
            continue
        a, b = lp32[members], lp16[members]
        gap32 = a[:, None] - a[None, :]
        swapped = np.sign(gap32) * np.sign(b[:, None] - b[None, :]) < 0
        for tie in TIES:
            if np.any(swapped & (np.abs(gap32) > tie)):
                counts[str(tie)] += 1
    return counts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a trained model directory [an untrained model of --preset]")
    ap.add_argument("--preset", default="paper")
    ap.add_argument("--pairs", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, help="CPU threads [what `moses-rnn score` uses for the model]")
    ap.add_argument("--token-budget", type=int, default=16384)
    ap.add_argument("--quick", action="store_true", help="1,024 pairs, one round")
    ap.add_argument("--json", help="also write the report here")
    args = ap.parse_args()
    if args.quick:
        args.pairs, args.repeats = 1024, 1
    require_shared()
    device = resolve_device(args.device)
    tmp = workdir()
    table = table_slice(200_000, tmp)
    model_dir = args.model or untrained_model_dir(args.preset, table, tmp)
    fp32 = PhraseScorer.from_dir(model_dir, device=str(device), dtype="fp32", token_budget=args.token_budget)
    bf16 = PhraseScorer.from_dir(model_dir, device=str(device), dtype="bf16", token_budget=args.token_budget)
    threads = configure_threads(device, args.threads, fp32.model.config)
    pairs = [(p.source, p.target) for p in itertools.islice(read_phrase_table(table), 50_000, 50_000 + args.pairs)]

    runs = {"fp32": fp32, "bf16": bf16}
    for scorer in runs.values():
        scorer.score(pairs[:512])  # warm-up
    times: dict[str, list[float]] = {k: [] for k in runs}
    scores: dict[str, np.ndarray] = {}
    for _ in range(args.repeats):
        for name, scorer in runs.items():
            sync(device)
            t = time.perf_counter()
            scores[name] = scorer.score(pairs)
            sync(device)
            times[name].append(time.perf_counter() - t)
    rate = {k: len(pairs) / statistics.median(v) for k, v in times.items()}
    delta = np.abs(scores["bf16"] - scores["fp32"])
    cfg = fp32.model.config
    H, M, V = cfg.hidden, cfg.maxout, cfg.tgt_vocab
    rows = fp32.node_chunk
    shapes = {"U' h' (recurrent)": (rows, H, 3 * H), "O_h h' (readout)": (rows, H, 2 * M),
              "G_l (output layer, kept fp32)": (rows, cfg.out_rank, V)}
    report = {
        "model": args.model or f"untrained {args.preset} preset",
        "trained": bool(args.model),
        "device": str(device),
        "threads": threads,
        "pairs": len(pairs),
        "fp32_pairs_per_s": round(rate["fp32"], 1),
        "bf16_pairs_per_s": round(rate["bf16"], 1),
        "bf16_speedup": round(rate["bf16"] / rate["fp32"], 2),
        "max_abs_delta_logp": round(float(delta.max()), 5),
        "mean_abs_delta_logp": round(float(delta.mean()), 5),
        "sources_with_2_targets": sum(1 for _, g in itertools.groupby(s for s, _ in pairs) if len(list(g)) > 1),
        "reordered_sources_by_tie_tolerance": reordered_sources(pairs, scores["fp32"], scores["bf16"]),
        "gemm_gflops_fp32_vs_bf16": {name: [gemm_gflops(device, *shape, torch.float32),
                                            gemm_gflops(device, *shape, torch.bfloat16)]
                                     for name, shape in shapes.items()},
        "runs_s": {k: [round(x, 3) for x in v] for k, v in times.items()},
    }
    emit(report, args.json)


if __name__ == "__main__":
    run_script(main)
