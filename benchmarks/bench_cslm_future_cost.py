"""The CSLM in Moses's future-cost estimate: search errors, decoding time and BLEU, with and without it.

    MOSES=/path/to/mosesdecoder python benchmarks/bench_cslm_future_cost.py CSLM_MODEL_DIR [--sentences 200]
    MOSES=... python benchmarks/bench_cslm_future_cost.py --config TUNED.ini --input SRC --ref REF [--sentences 0]

The first form: the shared Moses system (bench_cslm_decode.py's: phrase table filtered to the input,
KenLM 5-gram, no lexicalized reordering) plus the CSLM feature in process, decoded with
the pipeline's flags (cube pruning, pop limit 1000) at one set of weights, twice:

  * `future-cost=true` (the default in process): each target phrase's internal n-grams
    and an estimate of its first words enter the option's future cost;
  * `future-cost=false`: the CSLM is scored when hypotheses are built, as before.

The final scores of a translation are the same either way (tests/test_cslm_local.py and
check_cslm_moses.py check them against `cslm score`), so the model score of the 1-best
is a search-quality measure: a higher one is a translation the other search missed. The
report counts the sentences where each search found the better-scoring 1-best (a search
error of the other), the mean model-score gain, each decoding's wall time (median of
--repeats runs, loading included) and the BLEU of each output on the tokenized, lowercased
references. Target: fewer search errors with the estimate, at no more than 1.2x the time.

The second form measures a tuned system at its own weights: any moses.ini with one in-process
CSLM line (the pipeline's systems/SYSTEM/TUNING-K/test.ini: tuned weights, the test set's
filtered tables), decoded twice with that line's future-cost= set to true and to false;
--input and --ref are the tokenized source and reference (0 sentences: all of them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cslm_decode import PIPELINE_FLAGS, SYSTEM, filter_table  # noqa: E402
from common import emit, require_shared  # noqa: E402

from moses_rnn.formats.mosesini import MosesIni  # noqa: E402
from mtcommon import nbest as nbest_list  # noqa: E402
from mtcommon.errors import UserError  # noqa: E402
from mtcommon.cliutil import run_script


def ini(path: Path, table: Path, model: str, future_cost: bool, cslm_weight: float, lm_weight: float) -> None:
    features = ["UnknownWordPenalty", "WordPenalty", "PhrasePenalty",
                f"PhraseDictionaryMemory name=TranslationModel0 num-features=4 path={table} input-factor=0 output-factor=0",
                "Distortion", f"KENLM name=LM0 factor=0 path={SYSTEM / 'lm.fr.5.arpa.gz'} order=5",
                f"CSLM name=CSLM0 path={model} num-features=1 future-cost={'true' if future_cost else 'false'}"]
    weights = ["UnknownWordPenalty0= 1", "WordPenalty0= -1", "PhrasePenalty0= 0.2",
               "TranslationModel0= 0.2 0.2 0.2 0.2", "Distortion0= 0.3", f"LM0= {lm_weight}", f"CSLM0= {cslm_weight}"]
    path.write_text("[input-factors]\n0\n\n[mapping]\n0 T 0\n\n[distortion-limit]\n6\n\n[feature]\n"
                    + "\n".join(features) + "\n\n[weight]\n" + "\n".join(weights) + "\n")


def toggled(config: Path, out: Path, future_cost: bool) -> None:
    """`config` with its one CSLM line's future-cost= set, written to `out` (every other line kept)."""
    ini = MosesIni.read(str(config))
    cslm = [f for f in ini.features if f.type == "CSLM"]
    if len(cslm) != 1:
        raise SystemExit(f"{config}: needs exactly one CSLM feature line, found {len(cslm)}")
    if cslm[0].get("host") is not None or cslm[0].get("port") is not None:
        raise SystemExit(f"{config}: {cslm[0].name} uses a server; the estimate exists in process only")
    ini.set_param(cslm[0].name, "future-cost", "true" if future_cost else "false")
    ini.write(str(out))


def decode(moses: Path, config: Path, text: str, nbest: Path) -> tuple[float, list[str], list[float]]:
    t = time.perf_counter()
    r = subprocess.run([str(moses / "bin" / "moses"), "-f", str(config), "-threads", "2", *PIPELINE_FLAGS,
                        "-n-best-list", str(nbest), "1"], input=text, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"moses failed on {config}:\n{r.stderr[-3000:]}")
    totals = {}
    for h in nbest_list.read(str(nbest)):
        totals.setdefault(h.sentence, float(h.fields[3]))
    return wall, r.stdout.splitlines(), totals  # sentence id -> the 1-best's model score (none: no translation)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    form = ap.add_mutually_exclusive_group(required=True)  # one of the two forms above
    form.add_argument("model", nargs="?", help="a CSLM model directory (the shared system's form)")
    form.add_argument("--config", type=Path, help="a tuned moses.ini with an in-process CSLM line (instead of MODEL)")
    ap.add_argument("--input", type=Path, help="with --config: the tokenized source sentences")
    ap.add_argument("--ref", type=Path, help="with --config: their tokenized references")
    ap.add_argument("--sentences", type=int, default=200, help="the first N sentences (0: all)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cslm-weight", type=float, default=0.1)
    ap.add_argument("--lm-weight", type=float, default=0.4)
    args = ap.parse_args()
    if args.config is not None and (args.input is None or args.ref is None):
        ap.error("--config needs --input and --ref")
    moses = Path(os.environ.get("MOSES", ""))
    if not (moses / "bin" / "moses").exists():
        raise SystemExit("set MOSES=/path/to/mosesdecoder (a Moses built with cslm/moses/add-to-moses.sh)")
    from sacrebleu.metrics import BLEU

    if args.config is None:
        require_shared()
        src, ref = SYSTEM / "test.tok.en", SYSTEM / "test.tok.fr"
    else:
        src, ref = args.input, args.ref
    try:
        lines = src.read_text(encoding="utf-8").splitlines()
        refs = ref.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise SystemExit(f"cannot read {e.filename or src}: {e.strerror or e}") from None
    if len(lines) != len(refs):
        raise SystemExit(f"{src} has {len(lines)} lines but {ref} has {len(refs)}")
    if args.sentences > 0:
        lines, refs = lines[: args.sentences], refs[: args.sentences]
    with tempfile.TemporaryDirectory(prefix="cslm-fc-") as tmp:
        work = Path(tmp)
        if args.config is None:
            table = work / "table.gz"
            filter_table(SYSTEM / "phrase-table.gz", lines, table)
        runs = {}
        for name, on in (("with_estimate", True), ("without_estimate", False)):
            config = work / f"{name}.ini"
            if args.config is None:
                ini(config, table, args.model, on, args.cslm_weight, args.lm_weight)
            else:
                try:
                    toggled(args.config, config, on)
                except UserError as e:
                    raise SystemExit(f"{args.config}: {e}") from None
                except OSError as e:
                    raise SystemExit(f"cannot read {args.config}: {e.strerror}") from None
            walls = []
            for _ in range(args.repeats):
                wall, out, totals = decode(moses, config, "\n".join(lines) + "\n", work / f"{name}.nbest")
                walls.append(wall)
            bleu = BLEU(lowercase=True, tokenize="none").corpus_score(out, [refs]).score
            runs[name] = {"seconds": round(statistics.median(walls), 2), "bleu": round(bleu, 2), "totals": totals}
        ids = sorted(set(runs["with_estimate"]["totals"]) & set(runs["without_estimate"]["totals"]))
        a = [runs["with_estimate"]["totals"][i] for i in ids]
        b = [runs["without_estimate"]["totals"][i] for i in ids]
        eps = 1e-4
        weights = ({"cslm_weight": args.cslm_weight, "lm_weight": args.lm_weight} if args.config is None
                   else {"config": str(args.config)})
        report = {
            "sentences": len(lines), **weights,
            "flags": " ".join(PIPELINE_FLAGS), "machine_cores": os.cpu_count(),
            "with_estimate_better": sum(x > y + eps for x, y in zip(a, b)),
            "without_estimate_better": sum(y > x + eps for x, y in zip(a, b)),
            "same_score": sum(abs(x - y) <= eps for x, y in zip(a, b)),
            "mean_model_score_gain": round(statistics.fmean(x - y for x, y in zip(a, b)), 4),
            **{f"{name}_{key}": run[key] for name, run in runs.items() for key in ("seconds", "bleu")},
            "time_ratio": round(runs["with_estimate"]["seconds"] / runs["without_estimate"]["seconds"], 3),
        }
    emit(report)


if __name__ == "__main__":
    run_script(main)
