"""CSLM training recipes side by side at the same number of updates, chosen by dev or held-out perplexity.

    python benchmarks/cslm_recipes.py CORPUS TEST -o OUT [--updates 7000] [--jobs 4] [--device cuda]
        [--dev DEV] [--kenlm LM] [--recipe NAME='--lr 2e-3 --lr-schedule linear' ...] [--only NAME ...]

Each recipe is a set of `cslm train` options added to the pipeline's (`--self-norm 0.1
--valid-fraction 0.01`, the `small` preset). Every recipe trains for exactly `--updates` updates
(epochs of `--eval-every` updates, so held-out perplexity is measured as often for each; a decaying
schedule reaches 0 at the last update), so a recipe whose updates cost what the default's do
(schedules, dropout, the learning rate) compares as it would inside the pipeline's time budget:
the pipeline's 35 CPU minutes give the `small` softmax about 7,000 updates (docs/cslm.md). Then
`cslm eval` on TEST: perplexity over every token and over the tokens in the shortlist, and with
`--kenlm` the n-gram model's on the same tokens and the ratio. Recipes run `--jobs` at a time
(on a GPU several small models share the device). Prints a JSON report (and --markdown a table);
OUT/NAME keeps each model. The recipe chosen is the one with the lowest perplexity on --dev (text
of the test's domain, the tuning set) or, without it, on the held-out training sentences; the
test column is reported, not used to choose.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from common import emit
from mtcommon.cliutil import run_script

BASE_ARGS = ["--self-norm", "0.1", "--valid-fraction", "0.01"]  # the pipeline's CSLM_TRAIN_ARGS, less the budget
RECIPES: dict[str, str] = {
    "default": "",  # the pipeline's: Adam 1e-3, constant
    "linear-1e-3": "--lr-schedule linear",
    "linear-2e-3": "--lr 2e-3 --lr-schedule linear",
    "cosine-2e-3": "--lr 2e-3 --lr-schedule cosine",
    "linear-3e-3": "--lr 3e-3 --lr-schedule linear",
    "dropout-0.1": "--dropout 0.1",
    "linear-2e-3-dropout-0.1": "--lr 2e-3 --lr-schedule linear --dropout 0.1",
    "linear-2e-3-dropout-0.2": "--lr 2e-3 --lr-schedule linear --dropout 0.2",
    "linear-2e-3-dropout-0.3": "--lr 2e-3 --lr-schedule linear --dropout 0.3",
    "linear-3e-3-dropout-0.1": "--lr 3e-3 --lr-schedule linear --dropout 0.1",
    "linear-3e-3-dropout-0.2": "--lr 3e-3 --lr-schedule linear --dropout 0.2",
    "cosine-2e-3-dropout-0.1": "--lr 2e-3 --lr-schedule cosine --dropout 0.1",
    "cosine-3e-3-dropout-0.2": "--lr 3e-3 --lr-schedule cosine --dropout 0.2",
}


class _Failed(Exception):
    """A `cslm` command of a recipe failed; its last stderr line."""


def _cslm(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "cslm.cli", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise _Failed(done.stderr.strip().splitlines()[-1:])
    return done


def run_recipe(name: str, extra: str, a) -> dict:
    """Train and evaluate one recipe; the row of the report."""
    out = os.path.join(a.output, name)
    epochs = -(-a.updates // a.eval_every)
    opts = ["--device", a.device, "--threads", str(a.threads), "--quiet"]
    t0 = time.perf_counter()
    try:
        done = _cslm("train", a.corpus, "-o", out, "--preset", a.preset, *BASE_ARGS,
                     "--epoch-ngrams", str(a.eval_every * a.batch_size), "--batch-size", str(a.batch_size),
                     "--max-epochs", str(epochs), "--patience", str(epochs + 1), "--seed", str(a.seed), "--overwrite", *opts,
                     *shlex.split(extra))
        summary = json.loads(done.stderr[done.stderr.index("{"):])
        seconds = time.perf_counter() - t0
        res = json.loads(_cslm("eval", out, a.test, *opts, *(["--kenlm", a.kenlm] if a.kenlm else [])).stdout)
        dev = json.loads(_cslm("eval", out, a.dev, *opts).stdout) if a.dev else None
    except _Failed as e:
        return {"recipe": name, "args": extra, "error": e.args[0]}
    history = summary["valid_ppl_history"]
    row = {"recipe": name, "args": extra, "updates": summary["steps"], "wall_seconds": round(seconds, 1),
           "train_seconds": summary["train_seconds"], "best_heldout_ppl": round(summary["best_valid_ppl"], 2),
           "final_heldout_ppl": round(history[-1]["valid_ppl"], 2) if history else None,
           "heldout_curve": [[e["step"], round(e["valid_ppl"], 2)] for e in history],
           "test_ppl": round(res["cslm_ppl"], 2), "test_ppl_in_shortlist": round(res["cslm_ppl_in_shortlist"], 2)}
    if dev is not None:
        row["dev_ppl_in_shortlist"] = round(dev["cslm_ppl_in_shortlist"], 2)
    if a.kenlm:
        row["kenlm_ppl_in_shortlist"] = round(res["kenlm_ppl_in_shortlist"], 2)
        row["ratio_to_kenlm"] = round(res["cslm_ppl_in_shortlist"] / res["kenlm_ppl_in_shortlist"], 3)
    return row


def markdown(rows: list[dict]) -> str:
    lines = ["| recipe | options | updates | best held-out ppl | dev ppl | test ppl | test x KenLM |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['recipe']} | `{r['args']}` | failed: {' '.join(r['error'])} | | | | |")
            continue
        ratio = f"{r['ratio_to_kenlm']:.3f}" if "ratio_to_kenlm" in r else ""
        dev = f"{r['dev_ppl_in_shortlist']:.2f}" if "dev_ppl_in_shortlist" in r else ""
        lines.append(f"| {r['recipe']} | `{r['args'] or '(pipeline default)'}` | {r['updates']:,} | "
                     f"{r['best_heldout_ppl']:.2f} | {dev} | {r['test_ppl_in_shortlist']:.2f} | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus", help="tokenized training text (the pipeline's data/train.TRG)")
    ap.add_argument("test", help="tokenized test text (data/test.TRG)")
    ap.add_argument("-o", "--output", required=True, help="folder for the models, one per recipe")
    ap.add_argument("--updates", type=int, default=7000)
    ap.add_argument("--eval-every", type=int, default=500, help="updates between held-out evaluations")
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--recipe", action="append", default=[], metavar="NAME=OPTIONS",
                    help="a recipe of your own (cslm train options); replaces the built-in list")
    ap.add_argument("--only", action="append", default=[], help="only these built-in recipes")
    ap.add_argument("--jobs", type=int, default=1, help="recipes trained at once")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads per recipe")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dev", help="tokenized text of the test's domain (the pipeline's data/dev.TRG): when given, "
                                  "the recipe is chosen by its perplexity there rather than on the held-out sentences")
    ap.add_argument("--kenlm", help="the n-gram model to compare with on the same tokens")
    ap.add_argument("--json", help="also write the report here")
    ap.add_argument("--markdown", action="store_true", help="also print a markdown table to stderr")
    a = ap.parse_args()
    if a.updates < 1 or a.eval_every < 1 or a.jobs < 1:
        ap.error("--updates, --eval-every and --jobs must be at least 1")
    if a.recipe:
        recipes = {}
        for item in a.recipe:
            name, sep, opts = item.partition("=")
            if not sep or not name:
                ap.error(f"--recipe takes NAME=OPTIONS, not {item!r}")
            recipes[name] = opts
    else:
        unknown = [n for n in a.only if n not in RECIPES]
        if unknown:
            ap.error(f"unknown recipe(s) {', '.join(unknown)}; built in: {', '.join(RECIPES)}")
        recipes = {n: o for n, o in RECIPES.items() if not a.only or n in a.only}
    os.makedirs(a.output, exist_ok=True)
    with ThreadPoolExecutor(a.jobs) as pool:
        rows = list(pool.map(lambda item: run_recipe(*item, a), recipes.items()))
    ok = [r for r in rows if "error" not in r]
    report = {"corpus": a.corpus, "test": a.test, "preset": a.preset, "updates": a.updates,
              "batch_size": a.batch_size, "device": a.device, "jobs": a.jobs, "base_args": " ".join(BASE_ARGS),
              "recipes": rows,
              "chosen_by_heldout": min(ok, key=lambda r: r["best_heldout_ppl"])["recipe"] if ok else None}
    if a.dev:
        report["chosen_by_dev"] = min(ok, key=lambda r: r["dev_ppl_in_shortlist"])["recipe"] if ok else None
    if a.markdown:
        print(markdown(rows), file=sys.stderr)
    emit(report, a.json)
    if len(ok) < len(rows):
        sys.exit(1)


if __name__ == "__main__":
    run_script(main)
