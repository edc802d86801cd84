"""Check the joint-model scores Moses computes against `cslm score` (not run by CI: needs a Moses).

    MOSES=/path/to/mosesdecoder python benchmarks/check_nnjm_moses.py NNJM_MODEL_DIR [--plain CSLM_DIR]
        [--sentences 30] [--repeats 3]

Decodes the first --sentences of newstest2013 with the shared system plus the NNJM feature
(cslm/moses/NNJM.h, in process: ln P and the unknown-word count), a 10-best list per sentence with
each hypothesis' phrase segmentation and word alignment, under cube pruning (the pipeline's search) and
the normal stack search. For every hypothesis, Moses's `NNJM0=` log-probability must equal what the
engine (`cslm score --source --alignment`) gives its text, its source sentence and the affiliations the
decoder uses (`cslm.data.decoder_affiliations`: the training rule inside each phrase pair), within
--tolerance, and the unknown-word count must be the number of its words outside the shortlist; so must
`cslm rescore-nbest --source` on Moses's own list (cube pruning). Then
the refusals: a plain CSLM on an NNJM line, the joint model on a CSLM line, a wrong order= or
source_window=: Moses stops at load with the feature's one-line message. Also times the decode with
and without the feature, and with --plain CSLM beside it as well (one thread, cube pruning, loading
taken out; targets 3x and 5x the baseline). Prints a JSON report; exit status 1 if any check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import finish_check  # noqa: E402
from bench_cslm_decode import NORMAL_FLAGS, PIPELINE_FLAGS, SYSTEM, moses_ini, shared_test_set  # noqa: E402

from cslm.apply import rescore_nbest  # noqa: E402
from cslm.data import affiliations, decoder_affiliations  # noqa: E402
from cslm.engine import Engine  # noqa: E402
from mtcommon import nbest as nbest_list  # noqa: E402
from mtcommon.cliutil import run_script

LM = SYSTEM / "lm.fr.5.arpa.gz"  # the shared system's n-gram LM, beside the joint model
NBEST_FLAGS = ["-include-segmentation-in-n-best", "-print-alignment-info-in-n-best"]


def hypothesis(h: nbest_list.Hypothesis, path: Path, name: str) -> dict:
    """An n-best line with -include-segmentation-in-n-best and -print-alignment-info-in-n-best: its words,
    phrase pairs (source start, end, target start, end; ends excluded), word alignment (source, target) and
    the feature's two scores."""
    segments, links = h.alignment(str(path))
    features = dict(h.features())
    return {"sentence": h.sentence, "words": h.text.split(), "segments": segments, "links": links,
            "logprob": features[f"{name}_0"], "unknown": features[f"{name}_1"]}


def decode(moses: Path, ini: Path, lines: list[str], flags: list[str], work: Path, name: str,
           threads: int = 2) -> tuple[list[dict] | None, float, str]:
    nb = work / f"{name}.nbest"
    t = time.perf_counter()
    r = subprocess.run([str(moses / "bin" / "moses"), "-f", str(ini), "-threads", str(threads), *flags,
                        "-n-best-list", str(nb), "10", "distinct", *NBEST_FLAGS],
                       input="\n".join(lines) + "\n", capture_output=True, text=True)
    seconds = time.perf_counter() - t
    if r.returncode != 0:
        return None, seconds, r.stderr[-2000:]
    return [(h, nb) for h in nbest_list.read(str(nb))], seconds, r.stderr


def check_mode(name, moses, ini, lines, flags, engine, tol, work) -> dict:
    hyps, seconds, err = decode(moses, ini, lines, flags, work, name.replace(" ", "-"))
    if hyps is None:
        return {"ok": False, "error": err}
    parsed = [hypothesis(h, path, "NNJM0") for h, path in hyps]
    sources = [lines[p["sentence"]].split() for p in parsed]
    alignments, differs = [], 0
    for p, src in zip(parsed, sources):
        affil = decoder_affiliations(p["segments"], p["links"], len(src), len(p["words"]))
        alignments.append([(int(a), j) for j, a in enumerate(affil[:-1])])  # one link a word: its affiliation
        # a word the sentence-level rule would affiliate elsewhere: the decoder's own rule is what is checked
        differs += bool((affil != affiliations(p["links"], len(src), len(p["words"]))).any())
    want = np.array([float(lp.sum(dtype=np.float64)) for lp, _ in
                     engine.score_sentences([p["words"] for p in parsed], sources, alignments)])
    got = np.array([p["logprob"] for p in parsed])
    diff = np.abs(got - want)
    unk_ok = all(int(p["unknown"]) == sum(w not in engine.vocab.index for w in p["words"]) for p in parsed)
    row = {"hypotheses": len(parsed), "max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()),
           "unknown_counts_equal": unk_ok, "hypotheses_whose_affiliation_is_phrase_local": differs,
           "decode_seconds": round(seconds, 2), "ok": bool(diff.max() <= tol and unk_ok)}
    print(f"{name}: {json.dumps(row)}", file=sys.stderr)
    return row


def rescored(nb: Path, lines: list[str], engine, work: Path, tol: float) -> dict:
    """`cslm rescore-nbest --source` on Moses's own list (its segmentation and alignment): NNJM1 = NNJM0."""
    if not nb.exists():
        return {"ok": False, "error": f"{nb} was not written"}
    source, out = work / "source.txt", work / "rescored.nbest"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    summary = rescore_nbest(engine, str(nb), str(out), feature="NNJM1", progress=False, source=str(source))
    pairs = [(f["NNJM0_0"], f["NNJM1_0"]) for f in (dict(h.features()) for h in nbest_list.read(str(out)))]
    diff = max(abs(a - b) for a, b in pairs)
    row = {"hypotheses": len(pairs), "decoder_affiliations": summary["decoder_affiliations"],
           "max_abs_diff": diff, "ok": diff <= tol and summary["decoder_affiliations"] == len(pairs)}
    print(f"rescore-nbest: {json.dumps(row)}", file=sys.stderr)
    return row


def refusal(moses: Path, ini: Path, line: str, expect: str) -> dict:
    r = subprocess.run([str(moses / "bin" / "moses"), "-f", str(ini)], input=line + "\n", capture_output=True,
                       text=True, timeout=600)
    message = next((ln.strip() for ln in r.stderr.splitlines() if expect in ln), None)
    return {"exit": r.returncode, "message": message, "ok": r.returncode != 0 and message is not None}


def timing(moses, inis: dict[str, Path], lines, repeats) -> dict:
    """One thread, cube pruning: seconds per sentence of each moses.ini in `inis` (the first the
    baseline), loading (an empty input's run) taken out, runs alternated, medians; each against the first."""
    def run(ini, text):
        t = time.perf_counter()
        r = subprocess.run([str(moses / "bin" / "moses"), "-f", str(ini), "-threads", "1", *PIPELINE_FLAGS],
                           input=text, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-2000:])
        return time.perf_counter() - t

    text = "\n".join(lines) + "\n"
    times: dict = {name: [] for name in inis}
    loads: dict = {name: [] for name in inis}
    try:
        for _ in range(repeats):
            for name, ini in inis.items():
                loads[name].append(run(ini, ""))
                times[name].append(run(ini, text))
    except RuntimeError as e:
        return {"ok": False, "error": str(e)}
    per = {name: (float(np.median(times[name])) - float(np.median(loads[name]))) / len(lines) for name in inis}
    first = next(iter(inis))
    return {"sentences": len(lines), "repeats": repeats,
            "s_per_sentence": {name: round(v, 4) for name, v in per.items()},
            "ratio": {name: round(v / per[first], 2) for name, v in per.items() if name != first},
            "load_s": {name: round(float(np.median(v)), 2) for name, v in loads.items()}, "ok": True}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="a joint model (`cslm train TARGET --source SOURCE --alignment ALIGN`)")
    ap.add_argument("--plain", help="a target-only CSLM, for the refusal checks and the decoding time with both "
                    "models (skipped without one)")
    ap.add_argument("--moses", default=os.environ.get("MOSES"))
    ap.add_argument("--sentences", type=int, default=30)
    ap.add_argument("--tolerance", type=float, default=1e-3)
    ap.add_argument("--repeats", type=int, default=3, help="alternated timing runs (0: no timing)")
    ap.add_argument("--work", help="keep the filtered table, moses.ini files and n-best lists here "
                    "(reused when present) [a temporary folder, removed at exit]")
    args = ap.parse_args()
    moses, work, lines, table = shared_test_set(args.moses, args.work, args.sentences, "check-nnjm-moses-")
    config = json.loads((Path(args.model) / "config.json").read_text())
    meta, order, window = config.get("meta", {}), config["model"]["order"], config["model"]["source_window"]
    self_norm = float(meta.get("train_config", {}).get("self_norm") or 0) > 0
    engine = Engine.load(args.model, device="cpu", normalized=not self_norm)
    model = os.path.abspath(args.model)
    report: dict = {"self_normalized": self_norm, "order": order, "source_window": window,
                    "sentences": len(lines), "tolerance": args.tolerance}
    line = f"NNJM name=NNJM0 path={model} order={order} source_window={window}"
    ini = work / "nnjm.ini"
    moses_ini(ini, table, LM, line)
    report["cube_pruning"] = check_mode("cube pruning", moses, ini, lines, PIPELINE_FLAGS, engine, args.tolerance,
                                        work)
    report["rescore_nbest"] = rescored(work / "cube-pruning.nbest", lines, engine, work, args.tolerance)
    report["normal_search"] = check_mode("normal search", moses, ini, lines, NORMAL_FLAGS, engine, args.tolerance,
                                         work)
    nofuture = work / "nnjm-no-future-cost.ini"
    moses_ini(nofuture, table, LM, line + " future-cost=false")
    report["without_future_cost"] = check_mode("without future cost", moses, nofuture, lines, PIPELINE_FLAGS, engine,
                                               args.tolerance, work)

    bad = work / "bad.ini"
    moses_ini(bad, table, LM, f"NNJM name=NNJM0 path={model} order={order + 1}")
    report["wrong_order"] = refusal(moses, bad, lines[0], f"moses.ini says order={order + 1}")
    moses_ini(bad, table, LM, f"NNJM name=NNJM0 path={model} source_window={window + 2}")
    report["wrong_window"] = refusal(moses, bad, lines[0], f"moses.ini says source_window={window + 2}")
    moses_ini(bad, table, LM, f"CSLM name=CSLM0 path={model}")
    report["joint_on_a_cslm_line"] = refusal(moses, bad, lines[0], "load it with an NNJM line")
    if args.plain:
        moses_ini(bad, table, LM, f"NNJM name=NNJM0 path={os.path.abspath(args.plain)}")
        report["plain_on_an_nnjm_line"] = refusal(moses, bad, lines[0], "load it with a CSLM line")
    if args.repeats:
        base = work / "baseline.ini"
        moses_ini(base, table, LM, None)
        inis = {"baseline": base, "nnjm": ini}
        if args.plain:  # the joint model and the CSLM together, both in process
            both = work / "nnjm-cslm.ini"
            moses_ini(both, table, LM, [line, f"CSLM name=CSLM0 path={os.path.abspath(args.plain)}"])
            inis["nnjm_and_cslm"] = both
        report["decode_time"] = timing(moses, inis, lines, args.repeats)

    finish_check(report)


if __name__ == "__main__":
    run_script(main)
