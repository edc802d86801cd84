"""Scoring speed of RNNsearch against the RNN Encoder-Decoder, in phrase pairs per second.

Both models are built at the same preset with the same shortlists (taken
from the slice), their weights initialised as for training (speed does not
depend on the weights' values), and each scores the same slice of a phrase
table through `score_table`, exactly what `moses-rnn score` runs.

    python benchmarks/bench_rnnsearch.py                       # ../shared/data table, small preset
    python benchmarks/bench_rnnsearch.py --preset paper --device cuda --lines 200000
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import tempfile
import time
from pathlib import Path

import torch

from moses_rnn.formats.phrasetable import read_phrase_table
from moses_rnn.networks import PRESET_NAMES
from moses_rnn.networks.modelbase import preset_config, preset_vocab
from moses_rnn.networks.modelio import LoadedModel, build_model
from moses_rnn.scoring.scorer import PhraseScorer
from moses_rnn.scoring.table import score_table
from moses_rnn.training.train import build_vocabularies
from mtcommon.modeldir import parameter_count
from mtcommon.runtime import configure_threads, resolve_device
from mtcommon.cliutil import run_script

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TABLE = ROOT.parent / "shared" / "data" / "en-fr-moses" / "phrase-table.gz"


def write_slice(table: str, skip: int, lines: int, out: str) -> None:
    with gzip.open(table, "rb") as src, open(out, "wb") as dst:
        dst.writelines(itertools.islice(src, skip, skip + lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", default=str(DEFAULT_TABLE), help="gzip Moses phrase table")
    ap.add_argument("--skip", type=int, default=1_000_000, help="lines skipped before the slice")
    ap.add_argument("--lines", type=int, default=20_000, help="lines in the slice")
    ap.add_argument("--preset", default="small", choices=PRESET_NAMES)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, help="CPU threads [all cores]")
    ap.add_argument("--repeats", type=int, default=2, help="timed runs per model; the best is kept")
    args = ap.parse_args()

    device = resolve_device(args.device)
    configure_threads(device, args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        sliced = os.path.join(tmp, "slice.phrase-table")
        write_slice(args.table, args.skip, args.lines, sliced)
        size = preset_vocab(args.preset)
        src_vocab, tgt_vocab = build_vocabularies(sliced, size, size)
        warmup = [(p.source, p.target) for p in itertools.islice(read_phrase_table(sliced), 500)]
        results = {}
        for arch in ("encdec", "rnnsearch"):
            torch.manual_seed(1)
            cfg = preset_config(args.preset, len(src_vocab), len(tgt_vocab), arch)
            model = build_model(cfg)
            model.init_weights()
            model.to(device).eval()
            scorer = PhraseScorer(LoadedModel(model, src_vocab, tgt_vocab, cfg, {}))
            out = os.path.join(tmp, f"{arch}.out")
            scorer.score(warmup)  # first calls pay for allocation and kernel selection
            best = 0.0
            for _ in range(args.repeats):
                start = time.perf_counter()
                stats = score_table(scorer, sliced, out, progress=False)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                best = max(best, stats.lines / (time.perf_counter() - start))
            results[arch] = {"pairs_per_second": round(best, 1), "parameters": parameter_count(model),
                             "lines": stats.lines}
    report = {"preset": args.preset, "device": str(device), "threads": torch.get_num_threads(),
              "slice": f"lines {args.skip + 1}-{args.skip + args.lines} of {args.table}", "results": results,
              "rnnsearch_over_encdec": round(results["rnnsearch"]["pairs_per_second"]
                                             / results["encdec"]["pairs_per_second"], 3)}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    run_script(main)
