"""Translation speed of a sentence network: beam search over a test set, in sentences per second.

Runs exactly what `moses-rnn translate` runs (`translate_lines`) on the first --lines sentences of a
tokenized source text, once per batch size, --repeats times each, the model loaded once and warmed up
on the first batch. Speed depends on the trained weights (they decide how long each translation
runs), so it takes a trained model directory: the pipeline's `sent` network, for example.

Also reported: the arithmetic of the matrix products per sentence, counted by PyTorch's profiler
(`with_flops`: mm, addmm, bmm and linear) over one batch-size run, and the rate it implies as a
fraction of this machine's float32 product rate for a [320 x 512] x [512 x 8000] product (a beam
of 5 for 64 sources through an 8,000-unit output layer).

    python benchmarks/bench_translate.py WORK/sent/model
    python benchmarks/bench_translate.py WORK/sent/model --lines 300 --batch 64 --repeats 1 --threads 2

Target: >= 80 sentences/s, beam 5, on 2 CPU cores, for the `small` RNNsearch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from moses_rnn.generation.generate import Generator
from moses_rnn.generation.translate import translate_lines
from moses_rnn.networks.modelio import load_model
from mtcommon.allocator import reuse_freed_memory
from mtcommon.runtime import configure_threads

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import SHARED, emit, gemm_rate  # noqa: E402
from mtcommon.cliutil import run_script

DEFAULT_INPUT = SHARED / "en-fr-moses" / "test.tok.en"


def product_flops(gen: Generator, lines: list[str], beam: int, batch: int) -> float:
    """Floating-point operations of the matrix products one translation of `lines` runs."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        translate_lines(gen, lines, "/dev/null", beam=beam, batch=batch, progress=False)
    return float(sum(e.flops or 0 for e in prof.key_averages()))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a trained sentence model directory (moses-rnn train --corpus)")
    p.add_argument("--input", default=str(DEFAULT_INPUT), help="tokenized source sentences [%(default)s]")
    p.add_argument("--lines", type=int, default=1000)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--batch", default="32,64,128", help="batch sizes (sources decoded together), comma-separated")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("-o", "--output", help="also write the JSON report here")
    a = p.parse_args(argv)
    if not Path(a.input).exists():
        raise SystemExit(f"{a.input}: no such file (benchmarks read ../shared/data beside the project by default)")
    reuse_freed_memory()  # as the command line does
    configure_threads(torch.device("cpu"), a.threads)
    t = time.perf_counter()
    gen = Generator(load_model(a.model))
    load_seconds = time.perf_counter() - t
    with open(a.input, encoding="utf-8") as f:
        lines = [" ".join(line.split()) for _, line in zip(range(a.lines), f)]
    batches = [int(b) for b in a.batch.split(",")]
    per_batch = {}
    with torch.no_grad():
        translate_lines(gen, lines[: batches[0]], "/dev/null", beam=a.beam, batch=batches[0], progress=False)
        for b in batches:
            rates = []
            for _ in range(a.repeats):
                t = time.perf_counter()
                translate_lines(gen, lines, "/dev/null", beam=a.beam, batch=b, progress=False)
                rates.append(len(lines) / (time.perf_counter() - t))
            per_batch[b] = {"sentences_per_s": statistics.median(rates), "runs": rates}
        best = max(per_batch, key=lambda b: per_batch[b]["sentences_per_s"])
        sample = lines[: min(len(lines), 200)]
        flops = product_flops(gen, sample, a.beam, best) / len(sample)
    rate = per_batch[best]["sentences_per_s"]
    machine = gemm_rate(torch.device("cpu"), 320, 512, 8000)
    emit({
        "model": a.model, "lines": len(lines), "beam": a.beam, "threads": a.threads,
        "load_seconds": load_seconds,
        "per_batch": {str(b): v for b, v in per_batch.items()},
        "best_batch": best,
        "sentences_per_s": rate,
        "target_sentences_per_s": 80.0,
        "sentences_per_s_over_target": rate / 80.0,
        "product_gflop_per_sentence": flops / 1e9,
        "machine_fp32_gemm_gflops": machine / 1e9,
        "product_rate_fraction_of_gemm": flops * rate / machine,
    }, a.output)


if __name__ == "__main__":
    run_script(main)
