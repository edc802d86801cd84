"""The report's sections after Table 1: the networks and their budgets, the tuned column weights, BLEU
on the shortlist misses, the augmented tables' generated pairs, the networks alone, BLEU by length."""

from __future__ import annotations

import json
from pathlib import Path

from files import read_json_list, read_lines
from plots import plot_lengths
from runs import mean_sd, pooled_outputs, tunings
from systems import label


def model_row(name: str, folder: Path) -> str | None:
    """One Markdown row for a trained model directory: preset, parameters, recipe, budget,
    updates, held-out perplexity (from its config.json, written by the trainer)."""
    from mtcommon import modeldir

    fmt = modeldir.kind(str(folder))
    if fmt is None:
        return None
    _, meta = modeldir.read_config(str(folder), fmt, lambda config: config)
    train = meta.get("train_config", {})
    if train.get("max_minutes"):
        budget = f"{train['max_minutes']:g} min"
    elif train.get("max_steps") and train["max_steps"] < 1_000_000:
        budget = f"{train['max_steps']:,} updates"
    else:
        budget = "until early stopping"
    ppl = meta.get("valid_ppl")
    return (f"| {name} | {train.get('preset', '–')} | {modeldir.weight_count(str(folder)) / 1e6:.1f} M "
            f"| {train.get('recipe', '–')} | {budget}, {train.get('threads') or 'all'} thread(s) "
            f"| {meta.get('step', '–')} | {f'{ppl:.2f}' if ppl else '–'} |")


def column_weights(work: Path, systems: list[str], tuner: str = "mert") -> list[str]:
    """Markdown rows: for each tuning of each system with a neural feature (a network column, the 5th score
    of TranslationModel0; the CSLM, CSLM0; the joint model, NNJM0), each one's tuned weight (the feature's
    first: its log-probability) and that weight's share of the sum of all weights' absolute values; '–'
    where the system lacks it."""
    from moses_rnn.formats.mosesini import MosesIni

    rows = []
    for system in systems:
        for name, run in tunings(work, system, tuner).items():
            if not (run / "tuned.ini").exists():
                continue
            ini = MosesIni.read(str(run / "tuned.ini"))
            weights = {n: ini.weights(n) or [] for n in ini.weight_names()}
            tm = weights.get("TranslationModel0", [])
            own = [tm[4] if len(tm) >= 5 else None] + [(weights.get(f) or [None])[0] for f in ("CSLM0", "NNJM0")]
            if all(w is None for w in own):
                continue
            total = sum(abs(w) for ws in weights.values() for w in ws)
            cells = [f"{w:.4f} ({abs(w) / total:.1%})" if w is not None else "–" for w in own]
            rows.append(f"| {label(system)} {name} | {' | '.join(cells)} |")
    return rows


def shortlist_miss_bleu(work: Path, systems: list[str], tuner: str, test_src: Path, test_ref: Path,
                        shortlist: Path) -> tuple[int, list[str]]:
    """(the test sentences with a source word outside `shortlist` (a saved vocabulary), Markdown rows:
    each system's BLEU on those sentences alone, mean ± sd over its tunings, scored as the table is)."""
    from sacrebleu.metrics import BLEU

    from mtcommon.vocab import Vocabulary

    vocab = Vocabulary.load(str(shortlist))
    chosen = [i for i, line in enumerate(read_lines(test_src)) if any(w not in vocab for w in line.split())]
    reference = read_lines(test_ref)
    refs = [[reference[i] for i in chosen]]
    rows = []
    for system in systems:
        scores = []
        for run in tunings(work, system, tuner).values():
            if (run / "test.detok").exists():
                out = read_lines(run / "test.detok")
                scores.append(BLEU(lowercase=True).corpus_score([out[i] for i in chosen], refs).score)
        if scores:
            rows.append(f"| {label(system)} | {len(scores)} | {mean_sd(scores)} |")
    return len(chosen), rows


# ---- augmented tables: the generated pairs the test 1-best used (Cho et al., Sec. 4.3) ----

def augmentation_rows(work: Path, systems: list[str], tuner: str, test_ref: Path, examples: int = 12) -> list[str]:
    """For each augmented system (SYSTEM-aug or SYSTEM-aug-input, beside SYSTEM) with usage.json in its
    tunings (`moses-rnn analyze augmented`): the lines added, per tuning the generated pairs its test 1-best used and the BLEU
    of the sentences that used one against SYSTEM's tuning of the same seed on the same sentences; and the
    most used pairs of the first tuning, each with its sentence's BLEU in both systems."""
    from sacrebleu.metrics import BLEU

    reference = read_lines(test_ref)
    lines = []
    for system in systems:
        base = system[: system.index("-aug")] if "-aug" in system else None  # SYSTEM-aug, SYSTEM-aug-input
        runs = tunings(work, system, tuner)
        found = {k: json.loads((d / "usage.json").read_text(encoding="utf-8"))
                 for k, d in runs.items() if (d / "usage.json").exists()}
        if not base or not found:
            continue
        base_runs = tunings(work, base, tuner)
        first = found[next(iter(found))]
        lines += ["", f"{label(system)}: {first['generated_lines']:,} generated lines added to the table's "
                  f"{first['table_lines'] - first['generated_lines']:,} (+{100 * first['growth']:.1f}%). The test "
                  f"1-best of each tuning (decoded again with Moses's -t), against {label(base)}'s tuning of the "
                  "same seed on the sentences that used a generated pair:", "",
                  "| Tuning | phrases used | generated (distinct) | sentences using one | BLEU there | "
                  f"{label(base)} there |", "|---|---:|---:|---:|---:|---:|"]
        for k, u in found.items():
            ids = u["sentence_ids"]
            ours = subset_bleu([read_lines(runs[k] / "test.detok")], reference, ids)
            theirs = subset_bleu([read_lines(base_runs[k] / "test.detok")], reference, ids) \
                if k in base_runs and (base_runs[k] / "test.detok").exists() else []
            cells = f"{ours[0]:.2f} | {theirs[0]:.2f}" if ours and theirs else "– | –"
            lines.append(f"| {k} | {u['phrases']:,} | {u['generated_phrases_used']:,} "
                         f"({u['distinct_generated_pairs_used']:,}) | {len(ids):,} | {cells} |")
        k = next(iter(found))
        if first["examples"] and k in base_runs and (base_runs[k] / "test.detok").exists():
            ours, theirs = read_lines(runs[k] / "test.detok"), read_lines(base_runs[k] / "test.detok")
            bleu = BLEU(lowercase=True, effective_order=True)
            lines += ["", f"The most used generated pairs of tuning {k}, each with the first test sentence that "
                      f"used it: sentence BLEU (smoothed) of {label(system)} and of {label(base)} there:", "",
                      "| source phrase | generated target | uses | sentence | BLEU | "
                      f"{label(base)} | helped |", "|---|---|---:|---:|---:|---:|---|"]
            for e in first["examples"][:examples]:
                i = e["sentence"] - 1
                a = bleu.sentence_score(ours[i], [reference[i]]).score
                b = bleu.sentence_score(theirs[i], [reference[i]]).score
                verdict = "yes" if a > b else "no" if a < b else "same"
                lines.append(f"| {e['source']} | {e['target']} | {e['uses']} | {e['sentence']} | {a:.1f} | "
                             f"{b:.1f} | {verdict} |")
    return lines


def subset_bleu(outputs: list[list[str]], reference: list[str], chosen: list[int]) -> list[float]:
    from sacrebleu.metrics import BLEU

    if not chosen:
        return []
    refs = [[reference[i] for i in chosen]]
    return [BLEU(lowercase=True).corpus_score([out[i] for i in chosen], refs).score for out in outputs]


def network_rows(work: Path, names: list[str], systems: list[str], tuner: str, test_src: Path, test_trg: Path,
                 test_ref: Path) -> list[str]:
    """Markdown rows: BLEU of each Moses system (mean ± sd over its tunings) and of each network alone, on all
    test sentences and on those whose source and tokenized reference have no word outside every network's
    vocabularies (subword units have none outside)."""
    from moses_rnn.networks import modelio

    sources, targets, reference = read_lines(test_src), read_lines(test_trg), read_lines(test_ref)
    known = []
    for name in names:
        if (work / name / "model" / "config.json").exists():
            cfg, _ = modelio.read_config(str(work / name / "model"))
            known.append(modelio.load_vocabularies(str(work / name / "model"), cfg))
    clean = [i for i in range(len(sources))
             if all(not (v.encode_phrases([side])[0] == v.unk_id).any()
                    for src, tgt in known for v, side in ((src, sources[i]), (tgt, targets[i])))]
    rows = []
    for system in [*systems, *names]:
        outputs = pooled_outputs(work, system, tuner)
        if not outputs:
            continue
        every, no_unk = (subset_bleu(outputs, reference, chosen) for chosen in (list(range(len(reference))), clean))
        name = label(system) if system in systems else f"{system} (network alone, beam 5)"
        rows.append(f"| {name} | {len(outputs)} | {mean_sd(every) if every else '–'} | "
                    f"{mean_sd(no_unk) if no_unk else '–'} |")
    return [f"BLEU on all {len(reference):,} test sentences, and on the {len(clean):,} whose source and reference "
            "have no word outside the networks' vocabularies (Bahdanau et al., Table 1):", "",
            "| Models | tunings | BLEU test, all | BLEU test, no unknown word |", "|---|---:|---:|---:|", *rows]


LENGTH_BUCKETS = [(0, 10), (10, 20), (20, 30), (30, 40), (40, 50), (50, 10**9)]


def length_bleu(work: Path, systems: list[str], tuner: str, test_src: Path, test_ref: Path, output: str) -> list[str]:
    """BLEU by source length (words, buckets of 10) of each system, its tunings pooled (Bahdanau et al.,
    Figure 2), drawn to `output` (PNG); returns a Markdown table of the same numbers."""
    from sacrebleu.metrics import BLEU

    lengths, reference = [len(line.split()) for line in read_lines(test_src)], read_lines(test_ref)
    buckets = [[i for i, n in enumerate(lengths) if lo <= n < hi] for lo, hi in LENGTH_BUCKETS]
    names = [f"{lo}-{hi - 1}" if hi < 10**9 else f"{lo}+" for lo, hi in LENGTH_BUCKETS]
    rows, series = [], []
    for system in systems:
        outputs = pooled_outputs(work, system, tuner)
        if not outputs:
            continue
        scores = []
        for chosen in buckets:
            hyps = [out[i] for out in outputs for i in chosen]
            refs = [[reference[i] for _ in outputs for i in chosen]]
            scores.append(BLEU(lowercase=True).corpus_score(hyps, refs).score if chosen else float("nan"))
        name = label(system) if (work / "systems" / system).exists() else f"{system} (network alone)"
        series.append((name, scores))
        rows.append(f"| {name} | " + " | ".join(f"{v:.2f}" for v in scores) + " |")
    plot_lengths([f"{n}\n({len(b):,})" for n, b in zip(names, buckets)], series, output)
    return ["| Models | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names), *rows]


def learning_rows(work: Path, networks: list[str]) -> list[str]:
    """The sentence networks' learning statistics (WORK/NAME/learning.json, `moses-rnn analyze learning`;
    Bahdanau et al., Table 2), each named with its architecture; [] when none has them."""
    from moses_rnn.networks import ARCH_TITLES

    learned = [(f"{name} ({ARCH_TITLES.get(r['arch'], r['arch'])})", r) for name in networks
               for r in read_json_list(work / name / "learning.json")]
    if not learned:
        return []
    from moses_rnn.analysis.learning import markdown

    return ["", "Learning statistics of the sentence networks (Bahdanau et al., Table 2): the saved model's "
            "updates, passes over the training pairs and hours in training steps; NLL per sentence pair "
            "(natural log) on 1,000 training pairs, on the pairs held out from training, and on the dev set:",
            "", markdown(learned).rstrip("\n")]
