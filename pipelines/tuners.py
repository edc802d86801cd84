"""The tuners side by side on the same systems: BLEU, significance against the first tuner, how each
tuning went, and minutes per tuning (`make tuners`, report.tuners.md)."""

from __future__ import annotations

import statistics
from pathlib import Path

from mtcommon.errors import UserError
from mtcommon.outputs import atomic_output

from files import read_lines, read_result
from health import dev_bleu_curves, tuning_health
from plots import plot_tuners
from runs import mean_sd, step_minutes, tuning_name, tunings
from systems import label


def write_tuners_report(args) -> None:
    """The tuners side by side on the same systems (docs/pipeline.md, "Tuners compared"): per system and
    tuner, its finished tunings' (tuned.ini) test and dev BLEU (mean ± sd), test BLEU per tuning, approximate randomization over
    all tunings against the first tuner's, the tunings' verdicts (tuning_health) and minutes per tuning
    (times.tsv: tune-SYSTEM for mert with 20 restarts, tune-SYSTEM.TUNING otherwise); with --plot, every
    tuning's dev BLEU per iteration, a panel per system and a colour per tuner."""
    from significance import approximate_randomization

    work = Path(args.work)
    systems = args.systems.replace(",", " ").split()
    names = [tuning_name(t, args.restarts) for t in args.tuners.replace(",", " ").split()]
    reference = read_lines(Path(args.test_ref)) if args.test_ref else None
    dev_ref = Path(args.dev_ref) if args.dev_ref else None
    minutes = step_minutes(work / "times.tsv")
    rows, curves = [], {}
    for system in systems:
        first_out = None
        for k, name in enumerate(names):
            runs = {n: d for n, d in tunings(work, system, name).items() if (d / "tuned.ini").exists()}  # finished
            if not runs:
                continue
            test = [b["score"] for b in (read_result(d / "test.bleu.json") for d in runs.values()) if b]
            dev = [b["score"] for b in (read_result(d / "dev.bleu.json") for d in runs.values()) if b]
            outs = [read_lines(d / "test.detok") for d in runs.values() if (d / "test.detok").exists()]
            p = "–"
            if k == 0:
                first_out = outs
            elif reference is not None and outs and first_out:
                p = f"{approximate_randomization(reference, first_out, outs, samples=args.ar_samples).p_value:.4f}"
            health = []
            if dev_ref is not None:
                c = {n: v for n, v in dev_bleu_curves(work, [system], dev_ref, name).get(system, {}).items() if n in runs}
                curves.setdefault(system, {}).update(c)
                health = [tuning_health(v) for v in c.values()]
            counts: dict[str, int] = {}
            for h in health:
                counts[h["verdict"]] = counts.get(h["verdict"], 0) + 1
            verdicts = ", ".join(f"{v} ×{n}" if n > 1 else v for v, n in sorted(counts.items()))
            iters = " / ".join(str(h["iterations"]) for h in health) or "–"
            gain = " / ".join(f"{h['best'] - h['first']:+.2f}" for h in health) or "–"
            step = f"tune-{system}" + (f".{name}" if name != "mert" else "")
            mins = minutes.get(step, [])
            time_cell = f"{statistics.median(mins):.1f} ({len(mins)})" if mins else "–"
            rows.append(f"| {label(system)} | {name} | {len(runs)} | {mean_sd(dev) if dev else '–'} | "
                        f"{mean_sd(test) if test else '–'} | {' / '.join(f'{t:.2f}' for t in test) or '–'} | {p} | "
                        f"{iters} | {gain} | {verdicts or '–'} | {time_cell} |")
    if not rows:
        raise UserError(f"{work}: no tunings of {', '.join(systems)} by {', '.join(names)}")
    lines = [f"Tuners compared: {', '.join(names)} (mert-moses.pl; systems/SYSTEM/TUNER-K).", "",
             "| Models | tuner | tunings | BLEU dev | BLEU test | test per tuning | p against "
             f"{names[0]} (AR) | iterations | best − first dev | verdicts | min per tuning (runs) |",
             "|---|---|---:|---:|---:|---|---:|---|---|---|---:|", *rows, "",
             f"BLEU: mean ± sd over the tunings (seeds 1, 2, ...). p: approximate randomization over all tunings of "
             f"both tuners ({args.ar_samples:,} samples), against {names[0]}'s tunings of the same system. Dev per "
             f"iteration: the tuner's decoded 1-best, tokenized and lowercased; 'best − first' is each tuning's best "
             f"iteration above its first (tuning_health's verdicts, as the report's). Minutes: the median of "
             f"times.tsv's runs of the step (a resumed tuning adds a run for its rest)."]
    with atomic_output(args.output, compress=False) as out:
        out.write(("\n".join(lines) + "\n").encode("utf-8"))
    if args.plot and curves:
        plot_tuners(curves, names, args.plot, args.label)
