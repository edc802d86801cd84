"""Scoring speed of the `paper` preset on CPU (or --device cuda).

Prints, measured in one run:
  - pairs/s of the batched scorer against a one-pair-at-a-time loop with the
    same model (target: batched >= 20x);
  - the model's arithmetic rate (FLOP/s, the analytic count of the work the
    scorer did: encoder words, distinct sources, prefix-tree decoder nodes)
    against the machine's measured float32 matrix-multiply rate (target: > 40%).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from common import median_time, require_shared, table_slice, untrained_model_dir, workdir
from moses_rnn.phrasetable import read_phrase_table
from moses_rnn.score import PhraseScorer
from moses_rnn.runtime import configure_threads, resolve_device


def matmul_rate(device: torch.device, n: int = 2048, repeats: int = 5) -> float:
    """Measured float32 GEMM FLOP/s (median of `repeats`)."""
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    torch.mm(a, b)
    rates = []
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        for _ in range(4):
            torch.mm(a, b)
        sync(device)
        rates.append(4 * 2 * n**3 / (time.perf_counter() - t))
    return statistics.median(rates)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="paper")
    ap.add_argument("--pairs", type=int, default=8192, help="pairs scored by the batched scorer")
    ap.add_argument("--single-pairs", type=int, default=300, help="pairs scored one at a time")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int)
    args = ap.parse_args()
    require_shared()
    device = resolve_device(args.device)
    tmp = workdir()
    table = table_slice(200_000, tmp)
    model_dir = untrained_model_dir(args.preset, table, tmp)
    scorer = PhraseScorer.from_dir(model_dir, device=str(device))
    configure_threads(device, args.threads, scorer.model.config)
    # a contiguous slice from the middle of the table keeps its source grouping
    pairs = [(p.source, p.target) for p in read_phrase_table(table)][50_000 : 50_000 + args.pairs]
    single = pairs[:: max(1, len(pairs) // args.single_pairs)][: args.single_pairs]

    scorer.score(pairs[:512])  # warm-up
    t_batched = median_time(lambda: scorer.score(pairs), repeats=3)

    def one_at_a_time():
        """The straightforward loop: one teacher-forced forward pass per pair."""
        model, sv, tv, eos = scorer.model, scorer.src_vocab, scorer.tgt_vocab, scorer.eos
        with torch.inference_mode():
            for s, t in single:
                src = torch.tensor([sv.encode(s.split())], device=device)
                tgt = torch.tensor([tv.encode(t.split()) + [eos]], device=device)
                model(src, torch.ones_like(src, dtype=torch.bool), tgt, torch.ones_like(tgt, dtype=torch.bool))

    one_at_a_time()
    t_single = median_time(one_at_a_time, repeats=3)
    batched_rate = len(pairs) / t_batched
    single_rate = len(single) / t_single

    # arithmetic actually done, counted from the work the scorer reports
    # (flops_per_pair is linear in both lengths): encoder words, one summary and
    # decoder context per distinct source, one decoder step + softmax per prefix-tree node
    m = scorer.model
    scorer.encoder_tokens = scorer.decoder_nodes = scorer.distinct_sources = 0
    scorer.score(pairs)
    per_source = m.flops_per_pair(0, 0)
    per_enc_word = m.flops_per_pair(1, 0) - per_source
    per_node = m.flops_per_pair(0, 1) - per_source
    flops = scorer.encoder_tokens * per_enc_word + scorer.distinct_sources * per_source + scorer.decoder_nodes * per_node
    distinct = scorer.distinct_sources
    target_symbols = sum(len(t.split()) + 1 for _, t in pairs)
    model_rate = flops / t_batched
    peak = matmul_rate(device)
    result = {
        "preset": args.preset,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "pairs": len(pairs),
        "distinct_sources": distinct,
        "target_symbols": target_symbols,
        "decoder_nodes": scorer.decoder_nodes,
        "batched_pairs_per_s": round(batched_rate, 1),
        "one_at_a_time_pairs_per_s": round(single_rate, 1),
        "speedup": round(batched_rate / single_rate, 1),
        "model_gflops": round(model_rate / 1e9, 2),
        "matmul_gflops": round(peak / 1e9, 2),
        "fraction_of_matmul": round(model_rate / peak, 3),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
