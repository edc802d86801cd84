"""Training speed of both networks against the machine's matrix-multiply rate.

    python benchmarks/bench_train.py [--presets small,paper] [--nets rnn,cslm,sent] [--quick] [--json OUT]

For the RNN Encoder-Decoder (pairs/s, on a slice of the shared phrase table),
the CSLM (n-grams/s, on the shared French training text) and, with `--nets
sent`, RNNsearch on sentence pairs (pairs/s, the first --sent-lines pairs of
the shared tokenized corpus, 8,000 subword units a side, as the pipeline's
`sent` network), each preset is
trained with the default (`fast`) recipe through the real training loop
(`moses_rnn.training.train.train`, `cslm.train.train`), and the rate is read from the
summary (`pairs_seen` / `ngrams_seen` over `train_seconds`, which leaves out
start-up and evaluation). Model arithmetic per second is that rate times the
floating-point operations one example costs (forward + backward = 3 x
forward, the arithmetic actually done: the sampled softmax's candidates, not
the whole shortlist), as a fraction of the float32 and bfloat16 GEMM rates
measured in the same run on the same threads.

Conditions, each measured in this run:
  1 thread and all cores, the machine otherwise idle;
  beside a busy neighbour (a process spinning on one core): 1 thread, all
  cores fixed, and the default thread policy (tuned while training).

Start-up (reading and encoding the whole 4M-line table; the CSLM's corpus
scans) is timed separately. Targets: >= 0.4 of the fp32 rate for both presets
on all cores; with a busy neighbour, the default never slower than 1 thread.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REAL_TABLE, SHARED, emit, require_shared, table_slice, workdir  # noqa: E402

from cslm.model import preset_config as cslm_preset  # noqa: E402
from moses_rnn.networks.modelbase import preset_config  # noqa: E402
from moses_rnn.networks.modelio import build_model  # noqa: E402
from mtcommon.runtime import cpu_count, cpu_has_bf16  # noqa: E402
from mtcommon.cliutil import run_script

FR_TEXT = SHARED / "en-fr-moses" / "train.tok.fr"
SENT_UNITS, SENT_MAX_LEN = 8000, 50  # the pipeline's sentence network (pipelines/Makefile, SENT_ARGS)


def gemm_rate(dtype: torch.dtype, threads: int, n: int = 1536, seconds: float = 1.5) -> float:
    """Measured GFLOP/s of an n x n x n matrix product."""
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(3):
        a @ b
    runs, t = 0, time.perf_counter()
    while time.perf_counter() - t < seconds:
        a @ b
        runs += 1
    return 2 * n**3 * runs / (time.perf_counter() - t) / 1e9


def _spin(stop) -> None:
    while not stop.is_set():
        pass


@contextlib.contextmanager
def busy_neighbour():
    """A process that keeps one core busy for the duration of the block."""
    stop = mp.Event()
    p = mp.Process(target=_spin, args=(stop,), daemon=True)
    p.start()
    try:
        time.sleep(0.3)
        yield
    finally:
        stop.set()
        p.join(5)


def rnn_flops_per_pair(preset: str, src_vocab: int, tgt_vocab: int, src_len: float, tgt_len: float,
                       candidates: int) -> float:
    """Forward + backward FLOPs of one pair with a sampled softmax over `candidates` words."""
    cfg = preset_config(preset, src_vocab, tgt_vocab)
    model = build_model(cfg)
    full = model.flops_per_pair(src_len, tgt_len)
    saved = 2.0 * tgt_len * cfg.out_rank * max(0, tgt_vocab - candidates) if candidates else 0.0
    return 3.0 * (full - saved)


def cslm_flops_per_ngram(preset: str) -> float:
    c = cslm_preset(preset)
    sizes = [c.context * c.embed, *c.hidden, c.vocab_size]
    return 3.0 * 2.0 * sum(a * b for a, b in zip(sizes[:-1], sizes[1:]))


@functools.lru_cache(maxsize=None)
def table_lengths(table: str) -> tuple[int, int, float, float]:
    """Both shortlists' sizes and the mean source and target lengths (words, no </s>) of a table's pairs:
    what one example's arithmetic depends on."""
    from moses_rnn.training.train import build_vocabularies, load_corpus

    sv, tv = build_vocabularies(table, 15000, 15000)
    corpus = load_corpus(table, sv, tv)
    return len(sv), len(tv), float(corpus.src_len.mean()), float(corpus.tgt_len.mean()) - 1


def run_rnn(table: str, preset: str, threads: int | None, steps: int, work: str) -> dict:
    from moses_rnn.training.train import TrainConfig, train

    cfg = TrainConfig(preset=preset, max_steps=2 * steps, eval_every=steps, valid_pairs=200, threads=threads,
                      device="cpu")
    with tempfile.TemporaryDirectory(dir=work) as out:
        return steady_rate(train(table, out, cfg, progress=False))


def corpus_slice(lines: int, folder: str, max_len: int) -> tuple[str, str]:
    """The first `lines` sentence pairs of the shared tokenized training corpus, copied into `folder`."""
    out = []
    for side in ("en", "fr"):
        path = os.path.join(folder, f"train.{lines}.{side}")
        with open(SHARED / "en-fr-moses" / f"train.tok.{side}", encoding="utf-8") as f, \
                open(path, "w", encoding="utf-8") as g:
            for _, line in zip(range(lines), f):
                g.write(line)
        out.append(path)
    return out[0], out[1]


def run_sent(corpus: tuple[str, str], preset: str, threads: int | None, steps: int, work: str) -> dict:
    """RNNsearch on sentence pairs, as the pipeline's `sent` network: 8,000 subword units a side, up to
    50 words, the fast recipe."""
    from moses_rnn.training.train import TrainConfig, train

    cfg = TrainConfig(preset=preset, arch="rnnsearch", corpus=corpus, max_len=SENT_MAX_LEN, subwords=SENT_UNITS,
                      max_steps=2 * steps, eval_every=steps, valid_pairs=200, threads=threads, device="cpu")
    with tempfile.TemporaryDirectory(dir=work) as out:
        return steady_rate(train(None, out, cfg, progress=False))


def sent_flops_per_pair(corpus: tuple[str, str], preset: str, candidates: int) -> float:
    """Forward + backward FLOPs of one sentence pair (mean lengths in subword units) of `corpus`."""
    from moses_rnn.training.train import build_subword_vocabularies, load_corpus, read_corpus_pairs

    pairs = read_corpus_pairs(*corpus, SENT_MAX_LEN)
    with tempfile.TemporaryDirectory() as d:
        sv, tv = build_subword_vocabularies(d, SENT_UNITS, corpus, pairs)
    units = load_corpus(corpus[0], sv, tv, pairs)
    cfg = preset_config(preset, len(sv), len(tv), arch="rnnsearch")
    model = build_model(cfg)
    src_len, tgt_len = float(units.src_len.mean()), float(units.tgt_len.mean()) - 1  # words and units, no </s>
    full = model.flops_per_pair(src_len, tgt_len)
    saved = 2.0 * tgt_len * cfg.out_rank * max(0, len(tv) - candidates)
    return 3.0 * (full - saved)


def run_cslm(text: str, preset: str, threads: int | None, steps: int, work: str) -> dict:
    from cslm.train import TrainConfig, train

    cfg = TrainConfig(preset=preset, max_epochs=2, epoch_ngrams=steps * 1024, threads=threads, device="cpu",
                      valid_fraction=0.001)
    with tempfile.TemporaryDirectory(dir=work) as out:
        return steady_rate(train(text, out, cfg, progress=False))


def steady_rate(summary: dict) -> dict:
    """Examples per training second over the second half of the run.

    The first half holds the warm-up: the CSLM's first shuffle-buffer fill
    and, with the default thread policy, the tuner's first trial (repeated
    every 2,000 steps in a real run, under 1% of its steps).
    """
    a, b = summary["valid_ppl_history"][-2:]
    rate = (b["examples_seen"] - a["examples_seen"]) / (b["train_seconds"] - a["train_seconds"])
    return {"rate": rate, "threads_end": summary["threads"], "overall": summary}


def startup_rnn(table: str) -> float:
    """Seconds to read the table's unique pairs, build both shortlists and encode the corpus."""
    from moses_rnn.training.train import build_vocabularies, load_corpus, read_unique_pairs

    t = time.perf_counter()
    pairs = read_unique_pairs(table)
    sv, tv = build_vocabularies(table, 15000, 15000, pairs)
    load_corpus(table, sv, tv, pairs)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="small,paper")
    ap.add_argument("--nets", default="rnn,cslm",
                    help="which networks, comma-separated: rnn (phrase pairs), cslm, sent (RNNsearch on sentence pairs)")
    ap.add_argument("--sent-lines", type=int, default=20000, help="sentence pairs the `sent` network trains on")
    ap.add_argument("--steps", type=int, default=0, help="training steps per measurement [by preset]")
    ap.add_argument("--lines", type=int, default=200000, help="phrase-table lines the RNN trains on")
    ap.add_argument("--quick", action="store_true", help="small preset, few steps, no start-up timing")
    ap.add_argument("--json", help="also write the report here")
    a = ap.parse_args()
    require_shared()
    presets = ["small"] if a.quick else a.presets.split(",")
    cores = cpu_count()
    work = workdir("moses-rnn-bench-train-")
    table = table_slice(a.lines if not a.quick else 20000, work)
    report: dict = {"cores": cores, "cpu_bf16": cpu_has_bf16(), "recipe": "fast", "gemm_gflops": {}, "runs": []}
    for threads in sorted({1, cores}):
        report["gemm_gflops"][f"fp32_{threads}t"] = round(gemm_rate(torch.float32, threads), 1)
        if cpu_has_bf16():
            report["gemm_gflops"][f"bf16_{threads}t"] = round(gemm_rate(torch.bfloat16, threads), 1)
    conditions = [("idle", 1), ("idle", cores), ("busy", 1), ("busy", cores), ("busy", None)] if cores > 1 else \
        [("idle", 1)]
    nets = a.nets.split(",")
    for net in nets:
        for preset in presets:
            if net == "sent":
                corpus = corpus_slice(a.sent_lines if not a.quick else 4000, work, SENT_MAX_LEN)
                flops = sent_flops_per_pair(corpus, preset, 2048)
                steps = a.steps or (12 if a.quick else {"small": 60, "paper": 15}.get(preset, 15))
                fn = lambda th, st=steps, p=preset, c=corpus: run_sent(c, p, th, st, work)  # noqa: E731
            elif net == "rnn":
                flops = rnn_flops_per_pair(preset, *table_lengths(table), 2048)
                steps = a.steps or (12 if a.quick else {"small": 150, "paper": 30}.get(preset, 30))
                fn = lambda th, st=steps, p=preset: run_rnn(table, p, th, st, work)  # noqa: E731
            else:
                flops = cslm_flops_per_ngram(preset)
                steps = a.steps or (12 if a.quick else {"small": 120, "paper": 30}.get(preset, 40))
                fn = lambda th, st=steps, p=preset: run_cslm(str(FR_TEXT), p, th, st, work)  # noqa: E731
            for load, threads in conditions:
                ctx = busy_neighbour() if load == "busy" else contextlib.nullcontext()
                with ctx:
                    r = fn(threads)
                th = threads or cores
                row = {"net": net, "preset": preset, "load": load, "threads": threads or "auto",
                       "rate": round(r["rate"], 1), "unit": "ngrams/s" if net == "cslm" else "pairs/s",
                       "dtype": r["overall"]["dtype"],  # what --dtype auto chose
                       "gflops": round(r["rate"] * flops / 1e9, 1),
                       "fraction_of_fp32": round(r["rate"] * flops / 1e9 / report["gemm_gflops"][f"fp32_{th}t"], 3)}
                if cpu_has_bf16():
                    row["fraction_of_bf16"] = round(r["rate"] * flops / 1e9 / report["gemm_gflops"][f"bf16_{th}t"], 3)
                if threads is None:
                    row["threads_chosen"] = r["threads_end"]
                report["runs"].append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    summary = {}
    for net in nets:
        for preset in presets:
            rows = {(r["load"], r["threads"]): r for r in report["runs"] if r["net"] == net and r["preset"] == preset}
            key = f"{net}_{preset}"
            if ("idle", cores) in rows:
                summary[f"{key}_fraction_of_fp32_all_cores"] = rows[("idle", cores)]["fraction_of_fp32"]
                summary[f"{key}_all_cores_vs_1_thread_idle"] = round(
                    rows[("idle", cores)]["rate"] / rows[("idle", 1)]["rate"], 3)
            if ("busy", "auto") in rows:
                summary[f"{key}_default_vs_1_thread_busy"] = round(
                    rows[("busy", "auto")]["rate"] / rows[("busy", 1)]["rate"], 3)
                summary[f"{key}_fixed_all_cores_vs_1_thread_busy"] = round(
                    rows[("busy", cores)]["rate"] / rows[("busy", 1)]["rate"], 3)
    report["summary"] = summary
    report["targets"] = {"fraction_of_fp32_all_cores": ">= 0.4", "default_vs_1_thread_busy": ">= 1.0"}
    if not a.quick and "rnn" in nets and REAL_TABLE.exists():
        torch.set_num_threads(cores)
        report["startup_seconds_whole_table"] = round(startup_rnn(str(REAL_TABLE)), 1)
    emit(report, a.json)


if __name__ == "__main__":
    run_script(main)
