"""The run's report: Table 1 (BLEU per system over its tunings, with significance tests against the
baseline and against the system each one extends), then the sections that explain it."""

from __future__ import annotations

import json
from pathlib import Path

from files import read_lines, read_result, write_lines
from health import DIP_DROP, FAIL_GAIN, dev_bleu_curves, health_rows, tuning_health
from plots import plot_dev_curves, plot_training
from runs import PHRASE_NETWORKS, TUNER_FLAGS, mean_sd, step_time_rows, tuning_name, tunings, wall_seconds
from sections import (augmentation_rows, column_weights, learning_rows, length_bleu, model_row, network_rows,
                      shortlist_miss_bleu)
from systems import label


def paired_bootstrap(reference: list[str], baseline: list[str], system: list[str], samples: int = 1000):
    """sacrebleu's paired bootstrap resampling (`sacrebleu --paired-bs`, Koehn 2004) of `system`
    against `baseline`, lowercased BLEU: (p-value, the test's signature)."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    if not len(reference) == len(baseline) == len(system):
        raise ValueError(f"paired test needs as many lines in each output as in the reference "
                         f"({len(reference)}, {len(baseline)}, {len(system)})")
    signatures, results = PairedTest([("baseline", baseline), ("system", system)], {"BLEU": BLEU(lowercase=True)},
                                     [reference], test_type="bs", n_samples=samples)()
    return results["BLEU"][1].p_value, str(signatures["BLEU"])


def compare(work: Path, system: str, base: str, tuner: str, reference: list[str] | None, samples: int,
            ar_samples: int) -> dict:
    """`system` against `base` on test: the gain of each tuning over the base's tuning of the same seed,
    its paired bootstrap p-value, and approximate randomization and a bootstrap over all tunings of both
    together (significance.py). Empty cells ('–') where results or outputs are missing."""
    from significance import approximate_randomization, bootstrap

    base_runs, runs = tunings(work, base, tuner), tunings(work, system, tuner)
    base_test = {name: read_result(d / "test.bleu.json") for name, d in base_runs.items()}
    test = {name: b for name, b in ((name, read_result(d / "test.bleu.json")) for name, d in runs.items()) if b}
    gains = [b["score"] - base_test[name]["score"] for name, b in test.items() if base_test.get(name)]
    p_values, p_all, signature, descriptions = [], ["–", "–"], None, []
    if reference is not None:
        for name in test:
            if name in base_runs and (base_runs[name] / "test.detok").exists() and (runs[name] / "test.detok").exists():
                p, signature = paired_bootstrap(reference, read_lines(base_runs[name] / "test.detok"),
                                                read_lines(runs[name] / "test.detok"), samples)
                p_values.append(f"{p:.3f}")
        base_out = [read_lines(d / "test.detok") for d in base_runs.values() if (d / "test.detok").exists()]
        mine_out = [read_lines(d / "test.detok") for d in runs.values() if (d / "test.detok").exists()]
        if base_out and mine_out:
            over_all = [method(reference, base_out, mine_out, samples=ar_samples)
                        for method in (approximate_randomization, bootstrap)]
            p_all = [f"{r.p_value:.4f}" for r in over_all]
            descriptions = [r.description for r in over_all]
    gain_cell = (" / ".join(f"{g:+.2f}" for g in gains) + (f" (min {min(gains):+.2f})" if len(gains) > 1 else "")
                 if gains else "–")
    return {"gain": gain_cell, "p": " / ".join(p_values) if p_values else "–", "p_all": p_all,
            "signature": signature, "descriptions": descriptions}


def write_report(args) -> None:
    """Table 1: per system, dev and test BLEU as mean ± sd over its tunings (runs); the test gain over
    the baseline per tuning (run K against the baseline's run K) with the paired bootstrap p-value of
    each, and approximate randomization and a bootstrap over all tunings of both systems together
    (significance.py); with --pairs, the same against the system each one extends or is compared with;
    the health of every tuning; the networks, perplexities and step times."""
    work = Path(args.work)
    tuning = args.tuning or tuning_name(args.tuner, args.restarts, args.tuner_args)
    systems = args.systems.replace(",", " ").split()
    reference = read_lines(Path(args.test_ref)) if args.test_ref else None
    rows, signature, test_signature, all_descriptions = [], None, None, []
    for system in systems:
        runs = tunings(work, system, tuning)
        dev = [b for b in (read_result(d / "dev.bleu.json") for d in runs.values()) if b]
        test = [b for b in (read_result(d / "test.bleu.json") for d in runs.values()) if b]
        if not dev and not test:
            continue
        signature = signature or (test or dev)[0].get("signature")
        cells = [mean_sd([b["score"] for b in part]) if part else "–" for part in (dev, test)]
        c = {"gain": "–", "p": "–", "p_all": ["–", "–"]}
        if system != systems[0]:
            c = compare(work, system, systems[0], tuning, reference, args.samples, args.ar_samples)
            test_signature = c["signature"] or test_signature
            all_descriptions = c["descriptions"] or all_descriptions
        rows.append(f"| {label(system)} | {len(test)} | {cells[0]} | {cells[1]} | {c['gain']} | {c['p']} | "
                    f"{c['p_all'][0]} | {c['p_all'][1]} |")
    extended = []
    for pair in args.pairs.split():
        system, _, base = pair.partition(":")
        if system in systems and base in systems and tunings(work, system, tuning) and tunings(work, base, tuning):
            c = compare(work, system, base, tuning, reference, args.samples, args.ar_samples)
            extended.append(f"| {label(system)} | {label(base)} | {c['gain']} | {c['p']} | {c['p_all'][0]} | "
                            f"{c['p_all'][1]} |")
    lines = [f"**{args.label}**", ""] if args.label else []
    restarts = f", --random-restarts {args.restarts}" if args.tuner == "mert" else ""
    restarts += f"; {args.tuner} {args.tuner_args.strip()}" if args.tuner_args.strip() else ""
    lines += [f"Tuner: {args.tuner} (mert-moses.pl{TUNER_FLAGS.get(args.tuner, '')}{restarts}); tunings "
              f"systems/SYSTEM/{tuning}-K.", "",
              "| Models | tunings | BLEU dev | BLEU test | test gain per tuning | p per tuning | p all tunings (AR) "
              "| p all tunings (bootstrap) |",
              "|---|---:|---:|---:|---|---|---:|---:|", *rows]
    lines += ["", f"BLEU: mean ± sample standard deviation over the tunings (seeds 1, 2, ...; Clark et al. 2011). "
              "Gain and p per tuning: each tuning's test output against the baseline's tuning of the same seed "
              f"(`sacrebleu --paired-bs`, {args.samples:,} samples). The seeds of two systems are unrelated draws, so "
              "the last two columns test all tunings of both systems together, on BLEU pooled over each system's "
              "tunings: approximate randomization with each sentence's hypotheses of all tunings re-divided "
              "between the systems (MultEval, Clark et al. 2011), and a bootstrap over both sentences and tunings, "
              "which also counts a whole tuning's luck as chance (the stricter of the two). "
              "p < 0.05: the difference is significant."]
    if extended:
        lines += ["", "Against the system each one extends, or the one it is compared with (the same tests):", "",
                  "| Models | against | test gain per tuning | p per tuning | p all tunings (AR) "
                  "| p all tunings (bootstrap) |", "|---|---|---|---|---:|---:|", *extended]
    if signature:
        lines += ["", f"sacrebleu signature: `{signature}`"]
    if test_signature:
        lines += ["", f"paired bootstrap signature: `{test_signature}`"]
    for description in all_descriptions:
        lines += ["", f"over all tunings: `{description}`"]
    models = [row for row in (*(model_row(name, work / folder / "model") for folder, name in PHRASE_NETWORKS.items()),
                              model_row("CSLM", work / "cslm" / "model"), model_row("NNJM", work / "nnjm" / "model"))
              if row]
    if models:
        lines += ["", "| Network | preset | parameters | recipe | training budget | updates | held-out ppl |",
                  "|---|---|---:|---|---|---:|---:|", *models]
    ppl = work / "cslm" / "ppl.json"
    if ppl.exists():
        r = json.loads(ppl.read_text(encoding="utf-8"))
        lines += ["", f"Perplexity on the test set's target side ({r['tokens']:,} tokens): CSLM {r['cslm_ppl']:.1f}, "
                  f"KenLM {r['kenlm_order']}-gram {r['kenlm_ppl']:.1f}; on the {r['tokens'] - r['unknown']:,} tokens in "
                  f"the CSLM's shortlist: CSLM {r['cslm_ppl_in_shortlist']:.1f}, KenLM {r['kenlm_ppl_in_shortlist']:.1f}."
                  + (f" The two interpolated (weight {r['mix_weight']:.2f} on the CSLM, estimated on the dev set): "
                     f"{r['mix_ppl_in_shortlist']:.1f} on the shortlist's tokens "
                     f"({r['mix_ppl_in_shortlist'] / r['kenlm_ppl_in_shortlist']:.2f}x KenLM), {r['mix_ppl']:.1f} on all."
                     if "mix_ppl" in r else "")
                  + (f" Self-normalisation: ln Z mean {r['log_z']['mean']:.2f}, sd {r['log_z']['sd']:.2f}."
                     if "log_z" in r else "")]
    if (work / "times.tsv").exists():
        lines += ["", "| Step | runs | median min | total min |", "|---|---:|---:|---:|", *step_time_rows(work / "times.tsv")]
        wall = wall_seconds(work / "times.tsv")
        if wall:
            lines += ["", f"Wall time: {wall[0] / 3600:.2f} h in which at least one of the {wall[2]} logged steps ran "
                      f"(their times summed: {wall[1] / 3600:.2f} h; `make -j` runs steps side by side). Time in which "
                      f"no step ran, between sittings, is not counted"
                      + (f"; {wall[3]} steps were interrupted and their time counted, so work they repeated is in it twice."
                         if wall[3] else ".")]
    if args.dev_ref:
        curves = dev_bleu_curves(work, systems, Path(args.dev_ref), tuning)
        if curves:
            health = [tuning_health(scores)["verdict"] for runs in curves.values() for scores in runs.values()]
            bad = sum(v in ("failed", "collapsed") for v in health)
            lines += ["", f"Tunings: dev BLEU (tokenized, lowercased) of each iteration's decoded 1-best. 'failed': the "
                      f"best iteration is the first (the tuning kept its starting weights); 'collapsed': an iteration "
                      f"fell below half of the first; 'dipped': more than {DIP_DROP:.1f} below the first; 'weak': the "
                      f"best is less than {FAIL_GAIN:.1f} above the first. {bad} of {len(health)} tunings failed or "
                      f"collapsed, {health.count('dipped')} dipped.", "",
                      "| Tuning | iterations | dev BLEU, iteration 1 | best (iteration) | lowest after 1 | verdict |",
                      "|---|---:|---:|---:|---:|---|", *health_rows(curves)]
            if args.plot:
                plot_dev_curves(curves, args.plot, args.label or f"dev BLEU of each {args.tuner} iteration's 1-best output",
                          args.tuner)
                lines += ["", f"Dev BLEU per {args.tuner} iteration: `{Path(args.plot).name}`"]
    weights = column_weights(work, systems, tuning)
    if weights:
        lines += ["", "Tuned weights of the neural features (and their share of the sum of all weights' absolute "
                  "values):", "", "| Tuning | network column (share) | CSLM (share) | NNJM (share) |", "|---|---:|---:|---:|",
                  *weights]
    if args.shortlist and Path(args.shortlist).exists() and args.test_src and args.test_ref:
        count, rows = shortlist_miss_bleu(work, systems, tuning, Path(args.test_src), Path(args.test_ref),
                                          Path(args.shortlist))
        if rows:
            lines += ["", f"BLEU on the {count:,} test sentences with a source word outside the word-level RNN's "
                      f"shortlist (`{Path(args.shortlist).name}`), scored as above:", "",
                      "| Models | tunings | BLEU test, those sentences |", "|---|---:|---:|", *rows]
    if args.test_ref:
        lines += augmentation_rows(work, systems, tuning, Path(args.test_ref))
    networks = args.networks.split() if args.networks else []
    if networks and args.test_src and args.test_trg and args.test_ref:
        lines += ["", *network_rows(work, networks, systems, tuning, Path(args.test_src), Path(args.test_trg),
                                    Path(args.test_ref))]
    lines += learning_rows(work, networks)
    drawn = [name for name in networks if (work / name / "alignments.png").exists()]
    if drawn:
        lines += ["", "Soft alignments of the first 4 test sentences of 10-20 words with their references "
                  "(Bahdanau et al., Figure 3): " + ", ".join(f"`{name}/alignments.png`" for name in drawn)]
    if args.length_plot and args.test_src and args.test_ref:
        table = length_bleu(work, [*systems, *networks], tuning, Path(args.test_src), Path(args.test_ref),
                            args.length_plot)
        lines += ["", f"Test BLEU by source length, tunings pooled (`{Path(args.length_plot).name}`):", "", *table]
    if args.training_plot and plot_training(work, args.training_plot):
        lines += ["", f"Held-out perplexity of each phrase network while training: `{Path(args.training_plot).name}`"]
    notes = work / "NOTES.md"
    if notes.exists():
        lines += ["", notes.read_text().strip()]
    write_lines(args.output, lines)
    print("\n".join(lines))
