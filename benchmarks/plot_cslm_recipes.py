"""Plot the reports of benchmarks/cslm_recipes.py: held-out curves and dev / test perplexity per recipe.

    python benchmarks/plot_cslm_recipes.py REPORT.json [REPORT.json ...] -o docs/cslm-recipes.png
        [--kenlm-dev PPL] [--kenlm-test PPL] [--curves NAME ...]

Reports are merged (a recipe named twice keeps its last row). Left: held-out perplexity against
updates for the --curves recipes (default: all). Right: each recipe's dev and test perplexity over
shortlist tokens, sorted by dev perplexity (the choosing measure; recipes without it after, by test), with the KenLM model's on the
same tokens as vertical lines where given.
"""

from __future__ import annotations

import argparse
import json

from mtcommon.cliutil import run_script


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--kenlm-dev", type=float, help="KenLM's dev perplexity over the same shortlist tokens")
    ap.add_argument("--kenlm-test", type=float, help="KenLM's test perplexity over the same shortlist tokens")
    ap.add_argument("--curves", action="append", default=[], help="recipes whose held-out curve is drawn")
    a = ap.parse_args()

    rows: dict[str, dict] = {}
    updates = device = None
    for path in a.reports:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
        updates, device = report["updates"], report["device"]
        for r in report["recipes"]:
            if "error" not in r:
                rows[r["recipe"]] = r
    if not rows:
        ap.error("no recipe finished in these reports")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.5), dpi=110, gridspec_kw={"width_ratios": [1, 1.2]})
    for name in a.curves or list(rows):
        if name not in rows:
            ap.error(f"--curves {name}: no such recipe in the reports")
        steps, ppl = zip(*rows[name]["heldout_curve"])
        left.plot(steps, ppl, marker="o", ms=3, label=name)
    left.set_xlabel("updates (1,024 n-grams each)")
    left.set_ylabel("held-out perplexity (1% of the training sentences)")
    left.set_ylim(top=min(80, left.get_ylim()[1]))
    left.set_title("Held-out perplexity while training")
    left.grid(alpha=0.3)
    left.legend(fontsize=8)

    # recipes measured on dev first, by dev perplexity; the others after, by test perplexity
    order = sorted(rows.values(), key=lambda r: ("dev_ppl_in_shortlist" not in r,
                                                 r.get("dev_ppl_in_shortlist", r["test_ppl_in_shortlist"])))
    y = range(len(order))
    h = 0.38
    dev = [(i, r["dev_ppl_in_shortlist"]) for i, r in enumerate(order) if "dev_ppl_in_shortlist" in r]
    if dev:
        right.barh([i - h / 2 for i, _ in dev], [v for _, v in dev], h, label="dev")
    right.barh([i + h / 2 for i in y], [r["test_ppl_in_shortlist"] for r in order], h, label="test")
    for value, label, style in ((a.kenlm_dev, "KenLM 5-gram, dev", "--"), (a.kenlm_test, "KenLM 5-gram, test", ":")):
        if value:
            right.axvline(value, color="black", ls=style, lw=1.2, label=f"{label} ({value:.1f})")
    if a.kenlm_test:
        right.axvline(0.8 * a.kenlm_test, color="red", ls=":", lw=1.2, label=f"0.8 x KenLM, test ({0.8 * a.kenlm_test:.1f})")
    right.set_yticks(list(y))
    right.set_yticklabels([r["recipe"] for r in order], fontsize=8)
    right.invert_yaxis()
    right.set_xlabel("perplexity over shortlist tokens")
    right.set_xlim(left=80)
    right.set_title("Dev and test perplexity (sorted by dev)")
    right.grid(axis="x", alpha=0.3)
    right.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"CSLM `small` recipes at {updates:,} updates (the pipeline's 35 CPU minutes), trained on {device}")
    fig.tight_layout()
    fig.savefig(a.output)
    print(a.output)


if __name__ == "__main__":
    run_script(main)
