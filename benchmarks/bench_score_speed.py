"""Scoring speed of the `paper` preset on CPU (or --device cuda).

Prints, measured in one run (batched runs taken in turn within each of
--repeats rounds, medians reported):
  - pairs/s of the batched scorer against a one-pair-at-a-time loop with the
    same model (target: batched >= 20x; the aim 30x);
  - the model's arithmetic rate (FLOP/s, the analytic count of the work the
    scorer did: encoder words, distinct sources, prefix-tree decoder nodes)
    against the machine's measured float32 matrix-multiply rate (target: > 40%;
    the aim 80%);
  - the same two figures for the bfloat16 scorer (`--dtype bf16`) where the
    hardware has native bfloat16, its arithmetic rate also against the
    measured bfloat16 matrix-multiply rate.
The one-pair loop is plain: for each pair, one teacher-forced forward pass of
the float32 model on that pair alone.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from common import emit, gemm_rate, require_shared, sync, table_slice, untrained_model_dir, workdir
from moses_rnn.formats.phrasetable import read_phrase_table
from moses_rnn.scoring.scorer import PhraseScorer
from mtcommon.runtime import configure_threads, native_bf16, resolve_device
from mtcommon.cliutil import run_script


def matmul_rate(device: torch.device, n: int = 2048, dtype: torch.dtype = torch.float32) -> float:
    """Measured FLOP/s of an n x n GEMM in `dtype`."""
    return gemm_rate(device, n, n, n, dtype)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="paper")
    ap.add_argument("--pairs", type=int, default=8192, help="pairs scored by the batched scorer")
    ap.add_argument("--single-pairs", type=int, default=300, help="pairs scored one at a time")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--no-bf16", action="store_true", help="float32 only")
    ap.add_argument("--quick", action="store_true", help="1,024 pairs, 50 one at a time, one round")
    ap.add_argument("--json", help="also write the report here")
    args = ap.parse_args()
    if args.quick:
        args.pairs, args.single_pairs, args.repeats = 1024, 50, 1
    require_shared()
    device = resolve_device(args.device)
    tmp = workdir()
    table = table_slice(200_000, tmp)
    model_dir = untrained_model_dir(args.preset, table, tmp)
    scorers = {"fp32": PhraseScorer.from_dir(model_dir, device=str(device))}
    native = native_bf16(device)
    if native and not args.no_bf16:
        scorers["bf16"] = PhraseScorer.from_dir(model_dir, device=str(device), dtype="bf16")
    scorer = scorers["fp32"]
    configure_threads(device, args.threads, scorer.model.config)
    # a contiguous slice from the middle of the table keeps its source grouping
    pairs = [(p.source, p.target) for p in read_phrase_table(table)][50_000 : 50_000 + args.pairs]
    single = pairs[:: max(1, len(pairs) // args.single_pairs)][: args.single_pairs]

    def one_at_a_time():
        """The straightforward loop: one teacher-forced forward pass per pair."""
        model, sv, tv, eos = scorer.model, scorer.src_vocab, scorer.tgt_vocab, scorer.eos
        with torch.inference_mode():
            for s, t in single:
                src = torch.tensor([sv.encode(s.split())], device=device)
                tgt = torch.tensor([tv.encode(t.split()) + [eos]], device=device)
                model(src, torch.ones_like(src, dtype=torch.bool), tgt, torch.ones_like(tgt, dtype=torch.bool))

    for s in scorers.values():
        s.score(pairs[:512])  # warm-up
    one_at_a_time()
    times: dict[str, list[float]] = {k: [] for k in [*scorers, "single"]}
    for _ in range(args.repeats):
        for name, s in scorers.items():
            sync(device)
            t = time.perf_counter()
            s.score(pairs)
            sync(device)
            times[name].append(time.perf_counter() - t)
        t = time.perf_counter()
        one_at_a_time()
        sync(device)
        times["single"].append(time.perf_counter() - t)
    t_single = statistics.median(times["single"])
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
    peak = matmul_rate(device)
    result = {
        "preset": args.preset,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "pairs": len(pairs),
        "distinct_sources": scorer.distinct_sources,
        "target_symbols": sum(len(t.split()) + 1 for _, t in pairs),
        "decoder_nodes": scorer.decoder_nodes,
        "node_chunk": scorer.node_chunk,
        "one_at_a_time_pairs_per_s": round(single_rate, 1),
        "matmul_gflops": round(peak / 1e9, 2),
    }
    for name in scorers:
        t_batched = statistics.median(times[name])
        rate = len(pairs) / t_batched
        prefix = "" if name == "fp32" else "bf16_"
        result[f"{prefix}batched_pairs_per_s"] = round(rate, 1)
        result[f"{prefix}speedup"] = round(rate / single_rate, 1)
        result[f"{prefix}model_gflops"] = round(flops / t_batched / 1e9, 2)
        result[f"{prefix}fraction_of_matmul"] = round(flops / t_batched / peak, 3)
        if name == "bf16":
            peak16 = matmul_rate(device, dtype=torch.bfloat16)
            result["bf16_matmul_gflops"] = round(peak16 / 1e9, 2)
            result["bf16_fraction_of_bf16_matmul"] = round(flops / t_batched / peak16, 3)
    result["runs_s"] = {k: [round(x, 3) for x in v] for k, v in times.items()}
    emit(result, args.json)


if __name__ == "__main__":
    run_script(main)
