"""Scoring speed of an open-vocabulary (subword) phrase model against word-level ones, in phrase pairs per second.

Target: a subword model scores within 1.5x of the word-level model of the same size
(subword_over_words_same_size >= 0.67).

Three models of one preset and architecture, their weights initialised as for training
(speed does not depend on the weights' values), each score the same slice of the shared
phrase table through `score_table`, exactly what `moses-rnn score` runs:

- `subwords`: sentencepiece BPE units (`--subwords N`), learned on the shared training text;
- `words_same_size`: word shortlists of N words, the same output and embedding sizes;
- `words_preset`: the preset's own shortlists (15,000 words), what the pipeline's RNN column uses.

A subword phrase is longer (units per word, reported), which the recurrences pay for; its
output layer is as large as the same-size word model's. The report also times the
segmentation alone (sentencepiece's encoding of the slice's distinct phrases).

    python benchmarks/bench_subword.py                                   # small preset, 20,000 lines, CPU
    python benchmarks/bench_subword.py --arch rnnsearch --lines 100000 --device cuda
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import os
import statistics
import time
from collections import Counter

import torch

from common import REAL_TABLE, SHARED, emit, require_shared, workdir
from moses_rnn.formats.phrasetable import read_phrase_table
from moses_rnn.networks import ARCHS, PRESET_NAMES
from moses_rnn.networks.modelbase import preset_config, preset_vocab
from moses_rnn.networks.modelio import LoadedModel, build_model
from moses_rnn.scoring.scorer import PhraseScorer
from moses_rnn.scoring.table import score_table
from mtcommon.modeldir import parameter_count
from mtcommon.runtime import configure_threads, resolve_device
from mtcommon.subword import SubwordVocabulary
from mtcommon.textio import iter_lines
from mtcommon.vocab import Vocabulary
from mtcommon.cliutil import run_script

TRAIN_TEXT = SHARED / "en-fr-moses"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=50_000, help="lines of the table scored (from --skip on)")
    ap.add_argument("--skip", type=int, default=1_000_000, help="lines skipped before the slice")
    ap.add_argument("--subwords", type=int, default=8000, help="subword units per side (and the same-size shortlists)")
    ap.add_argument("--preset", default="small", choices=PRESET_NAMES)
    ap.add_argument("--arch", default="encdec", choices=ARCHS)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, help="CPU threads [all cores]")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per model; the median is reported")
    args = ap.parse_args()
    require_shared()

    device = resolve_device(args.device)
    configure_threads(device, args.threads)
    tmp = workdir()
    sliced = os.path.join(tmp, "slice.phrase-table")
    with open(sliced, "wb") as out, gzip.open(REAL_TABLE, "rb") as src:
        out.writelines(itertools.islice(src, args.skip, args.skip + args.lines))

    text = [[line for _, line in iter_lines(str(TRAIN_TEXT / f"train.tok.{lang}"))] for lang in ("en", "fr")]
    t = time.perf_counter()
    units = [SubwordVocabulary.train(lines, args.subwords) for lines in text]
    learn_seconds = time.perf_counter() - t
    # word shortlists from the same text: the most frequent words of each side
    counts = [Counter(itertools.chain.from_iterable(line.split() for line in lines)) for lines in text]
    preset_size = preset_vocab(args.preset, args.arch)
    vocabularies = {"subwords": units,
                    "words_same_size": [Vocabulary.build(c, len(u)) for c, u in zip(counts, units)],
                    "words_preset": [Vocabulary.build(c, preset_size) for c in counts]}

    pairs = [(p.source, p.target) for p in read_phrase_table(sliced)]
    sources, targets = sorted(set(s for s, _ in pairs)), sorted(set(t for _, t in pairs))
    words = sum(len(p.split()) for p in sources + targets)
    segment = [statistics.median(_timed(lambda: vocab.encode_phrases(side)) for _ in range(3))
               for vocab, side in zip(units, (sources, targets))]
    unit_count = sum(int(vocab.encode_phrases(side)[1].sum()) for vocab, side in zip(units, (sources, targets)))

    results = {}
    for name, (src_vocab, tgt_vocab) in vocabularies.items():
        torch.manual_seed(1)
        cfg = preset_config(args.preset, len(src_vocab), len(tgt_vocab), args.arch)
        model = build_model(cfg)
        model.init_weights()
        model.to(device).eval()
        scorer = PhraseScorer(LoadedModel(model, src_vocab, tgt_vocab, cfg, {}))
        scorer.score(pairs[:500])  # first calls pay for allocation and kernel selection
        out = os.path.join(tmp, f"{name}.out")
        rates = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            stats = score_table(scorer, sliced, out, progress=False)
            if device.type == "cuda":
                torch.cuda.synchronize()
            rates.append(stats.lines / (time.perf_counter() - start))
        results[name] = {"pairs_per_second": round(statistics.median(rates), 1), "parameters": parameter_count(model),
                         "vocabularies": [len(src_vocab), len(tgt_vocab)]}
    speed = {name: r["pairs_per_second"] for name, r in results.items()}
    emit({"preset": args.preset, "arch": args.arch, "device": str(device), "threads": torch.get_num_threads(),
          "slice": f"lines {args.skip + 1}-{args.skip + args.lines} of {REAL_TABLE.name}",
          "units_per_word": round(unit_count / words, 3),
          "subword_learning_seconds": round(learn_seconds, 2),
          "segmentation_phrases_per_second": round((len(sources) + len(targets)) / sum(segment)),
          "results": results,
          "subword_over_words_same_size": round(speed["subwords"] / speed["words_same_size"], 3),
          "subword_over_words_preset": round(speed["subwords"] / speed["words_preset"], 3),
          "target_same_size_ratio": 1 / 1.5})


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


if __name__ == "__main__":
    run_script(main)
