"""Small text steps of the Moses pipeline (pipelines/Makefile): no Moses needed.

    python mt.py prepare --src en --trg fr IN_PREFIX OUT_PREFIX [--lines N] [--max-len 80] [--max-ratio 9]
    python mt.py symmetrize FWD REV OUT          # grow-diag-final-and, Pharaoh "i-j" links
    python mt.py detok --lang fr IN OUT
    python mt.py report WORK_DIR OUT.md --systems baseline,rnn,... [--tuner mert] [--test-ref REF] [--dev-ref REF --plot PNG]
    python mt.py reweight FILTERED.ini TUNED.ini -o OUT.ini   # TUNED's weights in the filtered model
    python mt.py table-path MOSES.ini [--table NAME]          # the file of a phrase table (the first)
    python mt.py best-iteration MERT.log                      # the iteration --return-best-dev kept
    python mt.py positive MOSES.ini FEATURE...                # mert's -P list: every score of each FEATURE
    python mt.py timed TIMES.tsv STEP -- COMMAND...           # run COMMAND, log its wall time
    python mt.py preflight --moses DIR [--tuner T] [--cslm-systems]  # every tool a run needs, checked first

Every output is written atomically (a temporary file renamed on success), so
make never sees a half-written file.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from mtcommon.errors import UserError
from mtcommon.textio import atomic_output, iter_lines

# the report's names of the systems of pipelines/Makefile (SYSTEMS there); another name is shown as it is
LABELS = {"baseline": "Baseline", "rnn": "RNN", "cslm-rnn": "CSLM + RNN", "cslm-rnn-wp": "CSLM + RNN + WP",
          "rnn-subword": "RNN, subword units", "rnnsearch": "RNNsearch", "cslm-rnnsearch": "CSLM + RNNsearch",
          "cslm-rnn-subword": "CSLM + RNN, subword units", "cslm-rnn-aug": "CSLM + RNN, augmented table",
          "cslm-rnn-aug-input": "CSLM + RNN, augmented with input n-grams",
          "cslm-rnn-nofc": "CSLM + RNN, CSLM not in the future cost"}


def label(system: str) -> str:
    """A system's name in the report (S-rerank: S's, reranked)."""
    if system.endswith("-rerank") and system not in LABELS:
        return f"{label(system[: -len('-rerank')])}, reranked"
    return LABELS.get(system, system)


def _write_lines(path: str, lines) -> int:
    """Write `lines` to `path` atomically; a file that already holds them is left as it is.

    Leaving an identical file untouched keeps its time stamp, so a corpus that
    was copied again (a new time stamp, the same text) re-runs `prepare` but
    nothing after it: make compares the times again after each recipe.
    """
    data = b"".join(line.encode("utf-8") + b"\n" for line in lines)
    target = Path(path)
    if target.is_file() and target.stat().st_size == len(data) and target.read_bytes() == data:
        return data.count(b"\n")
    with atomic_output(path, compress=False) as out:
        out.write(data)
    return data.count(b"\n")


def prepare(args) -> None:
    """Tokenize (Moses escaping), lowercase, and for training data filter by length.

    Writes OUT.SRC, OUT.TRG (tokenized) and OUT.ref.TRG (the raw target side of
    the kept lines, the reference that detokenized output is scored against).
    """
    from sacremoses import MosesTokenizer

    tok = {lang: MosesTokenizer(lang=lang) for lang in (args.src, args.trg)}
    src_path, trg_path = f"{args.input}.{args.src}", f"{args.input}.{args.trg}"
    kept, seen, dropped = [], 0, 0
    for pair in itertools.zip_longest(iter_lines(src_path), iter_lines(trg_path)):
        if args.lines and seen >= args.lines:
            break
        if None in pair:
            raise SystemExit(f"{src_path} and {trg_path} have different line counts")
        (ln, s), (_, t) = pair
        if args.stride > 1 and (ln - 1) % args.stride:
            continue
        seen += 1  # lines sampled; --lines counts these
        ts = tok[args.src].tokenize(s.strip(), escape=True, return_str=True, aggressive_dash_splits=True)
        tt = tok[args.trg].tokenize(t.strip(), escape=True, return_str=True, aggressive_dash_splits=True)
        if args.lowercase:
            ts, tt = ts.lower(), tt.lower()
        if args.max_len:
            ns, nt = len(ts.split()), len(tt.split())
            if not ns or not nt or ns > args.max_len or nt > args.max_len or max(ns, nt) > args.max_ratio * min(ns, nt):
                dropped += 1
                continue
        kept.append((ts, tt, t.strip()))
    _write_lines(f"{args.output}.ref.{args.trg}", (r for _, _, r in kept))
    _write_lines(f"{args.output}.{args.trg}", (t for _, t, _ in kept))
    _write_lines(f"{args.output}.{args.src}", (s for s, _, _ in kept))
    print(f"{args.output}: {len(kept)} pairs kept, {dropped} dropped by length", file=sys.stderr)


def _links(line: str) -> set[tuple[int, int]]:
    out = set()
    for tok in line.split():
        i, _, j = tok.partition("-")
        out.add((int(i), int(j)))
    return out


def grow_diag_final_and(fwd: set, rev: set) -> set:
    """Koehn et al.'s grow-diag-final-and symmetrisation of two directional alignments (i = source)."""
    union, align = fwd | rev, set(fwd & rev)
    neighbours = [(-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1)]

    def src_aligned(i):
        return any(a == i for a, _ in align)

    def trg_aligned(j):
        return any(b == j for _, b in align)

    added = True
    while added:
        added = False
        for i, j in sorted(align):
            for di, dj in neighbours:
                p = (i + di, j + dj)
                if p in union and p not in align and (not src_aligned(p[0]) or not trg_aligned(p[1])):
                    align.add(p)
                    added = True
    for direction in (fwd, rev):  # final-and: both words still unaligned
        for i, j in sorted(direction):
            if not src_aligned(i) and not trg_aligned(j):
                align.add((i, j))
    return align


def symmetrize(args) -> None:
    fwd, rev = iter_lines(args.forward), iter_lines(args.reverse)

    def gen():
        for (ln, f), (_, r) in zip(fwd, rev, strict=True):
            links = grow_diag_final_and(_links(f), _links(r))
            yield " ".join(f"{i}-{j}" for i, j in sorted(links))

    n = _write_lines(args.output, gen())
    print(f"{args.output}: {n} sentence alignments", file=sys.stderr)


def detok(args) -> None:
    from sacremoses import MosesDetokenizer

    md = MosesDetokenizer(lang=args.lang)
    _write_lines(args.output, (md.detokenize(line.split(), unescape=True) for _, line in iter_lines(args.input)))


def _bleu(path: Path) -> dict | None:
    if not path.exists():
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _json_list(path: Path) -> list[dict]:
    """The list of objects in a JSON file (`moses-rnn analyze learning`'s); [] if there is no file."""
    if not path.exists():
        return []
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise UserError(f"{path}: not JSON ({e})") from None
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise UserError(f"{path}: expected a list of objects")
    return value


def _runs(work: Path, system: str, tuner: str = "mert") -> dict[str, Path]:
    """The tunings of a system by a tuner: run name -> folder (systems/SYSTEM/TUNER-K, in the order
    of K; a folder with its own bleu.json, the layout of a single tuning, counts as one run named '')."""
    folder = work / "systems" / system
    prefix = f"{tuner}-"
    folders = [d for d in folder.glob(prefix + "*") if d.is_dir() and d.name[len(prefix):].isdigit()]
    runs = {d.name: d for d in sorted(folders, key=lambda d: int(d.name[len(prefix):]))}
    if not runs and (folder / "test.bleu.json").exists():
        runs[""] = folder
    return runs


def _mean_sd(values: list[float]) -> str:
    """`mean ± sd` (sample standard deviation) of one or more scores; one score alone."""
    if len(values) == 1:
        return f"{values[0]:.2f}"
    mean = sum(values) / len(values)
    sd = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
    return f"{mean:.2f} ± {sd:.2f}"


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


def _lines(path: Path) -> list[str]:
    return [line for _, line in iter_lines(str(path))]


# ---- moses.ini: the tuned weights in a filtered model ------------------------------

def reweight(args) -> None:
    """FILTERED's moses.ini (the tables filtered to one set's sentences) with TUNED's [weight]
    section: both must weight the same features, else the filtered model is of another system."""
    from moses_rnn.formats.mosesini import MosesIni

    filtered = MosesIni.read(args.filtered)
    filtered.copy_weights(MosesIni.read(args.tuned))
    _write_lines(args.output, filtered.lines)


# ---- step times ------------------------------------------------------------------------

def timed(args) -> None:
    """Run COMMAND (stdin, stdout and stderr inherited); when it succeeds, append
    "STEP<TAB>seconds" to TIMES. Exits with the command's status."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise SystemExit("mt.py timed: no command")
    start = time.monotonic()
    rc = subprocess.call(command)
    if rc == 0:
        with open(args.times, "a", encoding="utf-8") as f:  # one short line: an atomic append
            f.write(f"{args.step}\t{time.monotonic() - start:.1f}\n")
    sys.exit(rc)


def _step_times(path: Path) -> list[str]:
    """Markdown rows: per step, how many times it ran, its median and total minutes."""
    return [f"| {step} | {len(v)} | {statistics.median(v):.1f} | {sum(v):.1f} |" for step, v in step_minutes(path).items()]


# ---- the networks' sizes and budgets ----------------------------------------------------

def _model_row(name: str, folder: Path) -> str | None:
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


# ---- dev BLEU per MERT iteration -------------------------------------------------------

def mert_curves(work: Path, systems: list[str], dev_ref: Path, tuner: str = "mert") -> dict[str, dict[str, list[float]]]:
    """BLEU of each tuning iteration's decoded 1-best dev output (mert/runN.out, tokenized and
    lowercased like the reference dev.TRG, so BLEU on these tokens as the tuner sees them):
    system -> run -> [BLEU of iteration 1, 2, ...]."""
    from sacrebleu.metrics import BLEU

    reference = _lines(dev_ref)
    bleu = BLEU(tokenize="none", force=True)
    curves: dict[str, dict[str, list[float]]] = {}
    for system in systems:
        for name, folder in _runs(work, system, tuner).items():
            scores, n = [], 1
            while (folder / "mert" / f"run{n}.out").exists():
                hyp = _lines(folder / "mert" / f"run{n}.out")
                if len(hyp) == len(reference):
                    scores.append(bleu.corpus_score(hyp, [reference]).score)
                n += 1
            if scores:
                curves.setdefault(system, {})[name] = scores
    return curves


# A tuning whose decoded dev BLEU never rises FAIL_GAIN above its first iteration's did little;
# one that falls DIP_DROP below it at some iteration dipped there (the weights the optimiser
# proposed decode worse than where it started), and one that falls below half of it collapsed.
FAIL_GAIN, DIP_DROP = 1.0, 1.0


def tuning_health(scores: list[float]) -> dict:
    """What a tuning's dev BLEU per iteration says: the first, the best and its iteration (1-based),
    the lowest after the first, and a verdict: 'failed' (the best is the first iteration),
    'collapsed' (it fell below half of the first), 'dipped' (more than DIP_DROP below the first),
    'weak' (the best is less than FAIL_GAIN above the first), else 'ok'."""
    first, best = scores[0], max(scores)
    best_at = scores.index(best) + 1
    lowest = min(scores[1:]) if len(scores) > 1 else first
    if best_at == 1:
        verdict = "failed"
    elif lowest < first / 2:
        verdict = "collapsed"
    elif lowest < first - DIP_DROP:
        verdict = "dipped"
    elif best < first + FAIL_GAIN:
        verdict = "weak"
    else:
        verdict = "ok"
    return {"iterations": len(scores), "first": first, "best": best, "best_at": best_at, "lowest": lowest,
            "verdict": verdict}


def _health_rows(curves: dict[str, dict[str, list[float]]]) -> list[str]:
    rows = []
    for system, runs in curves.items():
        for name, scores in runs.items():
            h = tuning_health(scores)
            rows.append(f"| {label(system)} {name} | {h['iterations']} | {h['first']:.2f} | "
                        f"{h['best']:.2f} ({h['best_at']}) | {h['lowest']:.2f} | {h['verdict']} |")
    return rows


def _save_png(fig, output: str) -> None:
    """Write a matplotlib figure to `output` atomically, cropped to what it draws (a legend below the
    axes included), and close it."""
    import matplotlib.pyplot as plt

    tmp = output + ".tmp.png"
    fig.savefig(tmp, bbox_inches="tight")
    plt.close(fig)
    Path(tmp).replace(output)


def plot_mert(curves: dict[str, dict[str, list[float]]], output: str, title: str, tuner: str = "mert") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = sum(len(runs) for runs in curves.values())
    fig, ax = plt.subplots(figsize=(7, 4.2 + 0.12 * ((n + 1) // 2)), dpi=120)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (system, runs) in enumerate(curves.items()):
        for j, (name, scores) in enumerate(runs.items()):
            ax.plot(range(1, len(scores) + 1), scores, marker="o", markersize=3, color=colours[i % len(colours)],
                    linestyle=["-", "--", ":", "-."][j % 4], label=f"{label(system)} {name}".strip())
    ax.set_xlabel(f"{tuner} iteration (1: the starting weights)")
    ax.set_ylabel("dev BLEU (tokenized, lowercased)")
    ax.set_title(textwrap.fill(title, 110), fontsize=8)  # a long label (BUDGET=1) on several lines
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.16))  # below: no curve hidden
    fig.tight_layout()
    _save_png(fig, output)


def step_minutes(times: Path) -> dict[str, list[float]]:
    """times.tsv's minutes per step: STEP -> [minutes of each run of it], in the file's order."""
    steps: dict[str, list[float]] = {}
    if times.exists():
        for _, line in iter_lines(str(times)):
            step, _, seconds = line.partition("\t")
            try:
                steps.setdefault(step, []).append(float(seconds) / 60)
            except ValueError:
                raise ValueError(f"{times}: not STEP<TAB>seconds: {line!r}") from None
    return steps


def tuners(args) -> None:
    """The tuners side by side on the same systems (docs/pipeline.md, "Tuners compared"): per system and
    tuner, its finished tunings' (tuned.ini) test and dev BLEU (mean ± sd), test BLEU per tuning, approximate randomization over
    all tunings against the first tuner's, the tunings' verdicts (tuning_health) and minutes per tuning
    (times.tsv: tune-SYSTEM for mert with 20 restarts, tune-SYSTEM.TUNING otherwise); with --plot, every
    tuning's dev BLEU per iteration, a panel per system and a colour per tuner."""
    from significance import approximate_randomization

    work = Path(args.work)
    systems = args.systems.replace(",", " ").split()
    names = [tuning_name(t, args.restarts) for t in args.tuners.replace(",", " ").split()]
    reference = _lines(Path(args.test_ref)) if args.test_ref else None
    dev_ref = Path(args.dev_ref) if args.dev_ref else None
    minutes = step_minutes(work / "times.tsv")
    rows, curves = [], {}
    for system in systems:
        first_out = None
        for k, name in enumerate(names):
            runs = {n: d for n, d in _runs(work, system, name).items() if (d / "tuned.ini").exists()}  # finished
            if not runs:
                continue
            test = [b["score"] for b in (_bleu(d / "test.bleu.json") for d in runs.values()) if b]
            dev = [b["score"] for b in (_bleu(d / "dev.bleu.json") for d in runs.values()) if b]
            outs = [_lines(d / "test.detok") for d in runs.values() if (d / "test.detok").exists()]
            p = "–"
            if k == 0:
                first_out = outs
            elif reference is not None and outs and first_out:
                p = f"{approximate_randomization(reference, first_out, outs, samples=args.ar_samples).p_value:.4f}"
            health = []
            if dev_ref is not None:
                c = {n: v for n, v in mert_curves(work, [system], dev_ref, name).get(system, {}).items() if n in runs}
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
            rows.append(f"| {label(system)} | {name} | {len(runs)} | {_mean_sd(dev) if dev else '–'} | "
                        f"{_mean_sd(test) if test else '–'} | {' / '.join(f'{t:.2f}' for t in test) or '–'} | {p} | "
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


def plot_tuners(curves: dict[str, dict[str, list[float]]], tuners: list[str], output: str, title: str = "") -> None:
    """Dev BLEU per iteration of every tuning: a panel per system, a colour per tuner, a line style per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(1, len(curves), figsize=(5.2 * len(curves), 4.4), dpi=120, squeeze=False, sharey=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (system, runs) in zip(axes[0], curves.items()):
        for run, scores in runs.items():
            tuner, _, seed = run.rpartition("-")
            ax.plot(range(1, len(scores) + 1), scores, marker="o", markersize=3,
                    color=colours[tuners.index(tuner) % len(colours)] if tuner in tuners else "grey",
                    linestyle=["-", "--", ":", "-."][(int(seed) - 1) % 4 if seed.isdigit() else 0],
                    label=f"{tuner}, seed {seed}")
        ax.set_title(label(system), fontsize=9)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_xlabel("tuning iteration (1: the starting weights)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=len(tuners), loc="upper center", bbox_to_anchor=(0.5, -0.2))
    axes[0][0].set_ylabel("dev BLEU (tokenized, lowercased)")
    fig.suptitle(textwrap.fill(title or "dev BLEU of each tuning iteration's 1-best output, by tuner", 120), fontsize=9)
    fig.tight_layout()
    _save_png(fig, output)


# the phrase networks the pipeline trains: model folder under WORK -> name in the report
NETWORK_ARCHS = {"rnnsearch": "RNNsearch", "encdec": "RNNencdec"}

NETWORKS = {"rnn": "RNN Encoder–Decoder", "rnn-subword": "RNN Encoder–Decoder, subword units", "rnnsearch": "RNNsearch"}


def plot_training(work: Path, output: str) -> bool:
    """The held-out perplexity (per target word and </s>) of each phrase network trained under `work`
    against its updates, from the checkpoints (`moses-rnn analyze curves --x updates`); False if none."""
    from moses_rnn.analysis.analyze import training_curves, training_history

    runs = [(name, training_history(str(work / folder / "model"))) for folder, name in NETWORKS.items()
            if (work / folder / "model" / "checkpoint.pt").exists()]
    if runs:
        training_curves(runs, output, "Phrase networks: held-out perplexity per target word\n"
                                      "(a word model's [UNK] is one easy word: its figure reads low)", x="updates")
    return bool(runs)


def column_weights(work: Path, systems: list[str], tuner: str = "mert") -> list[str]:
    """Markdown rows: for each tuning of each system with a network column (the 5th score of
    TranslationModel0), its tuned weight and that weight's share of the sum of all weights'
    absolute values, and the CSLM's weight where the system has one."""
    from moses_rnn.formats.mosesini import MosesIni

    rows = []
    for system in systems:
        for name, run in _runs(work, system, tuner).items():
            if not (run / "tuned.ini").exists():
                continue
            ini = MosesIni.read(str(run / "tuned.ini"))
            weights = {n: ini.weights(n) or [] for n in ini.weight_names()}
            tm = weights.get("TranslationModel0", [])
            if len(tm) < 5:
                continue
            total = sum(abs(w) for ws in weights.values() for w in ws)
            cslm = weights.get("CSLM0")
            rows.append(f"| {label(system)} {name} | {tm[4]:.4f} | {abs(tm[4]) / total:.1%} | "
                        f"{f'{cslm[0]:.4f} ({abs(cslm[0]) / total:.1%})' if cslm else '–'} |")
    return rows


def shortlist_miss_bleu(work: Path, systems: list[str], tuner: str, test_src: Path, test_ref: Path,
                        shortlist: Path) -> tuple[int, list[str]]:
    """(the test sentences with a source word outside `shortlist` (a saved vocabulary), Markdown rows:
    each system's BLEU on those sentences alone, mean ± sd over its tunings, scored as the table is)."""
    from sacrebleu.metrics import BLEU

    from mtcommon.vocab import Vocabulary

    vocab = Vocabulary.load(str(shortlist))
    chosen = [i for i, line in enumerate(_lines(test_src)) if any(w not in vocab for w in line.split())]
    reference = _lines(test_ref)
    refs = [[reference[i] for i in chosen]]
    rows = []
    for system in systems:
        scores = []
        for run in _runs(work, system, tuner).values():
            if (run / "test.detok").exists():
                out = _lines(run / "test.detok")
                scores.append(BLEU(lowercase=True).corpus_score([out[i] for i in chosen], refs).score)
        if scores:
            rows.append(f"| {label(system)} | {len(scores)} | {_mean_sd(scores)} |")
    return len(chosen), rows


# ---- augmented tables: the generated pairs the test 1-best used (Cho et al., Sec. 4.3) ----

def augmentation_rows(work: Path, systems: list[str], tuner: str, test_ref: Path, examples: int = 12) -> list[str]:
    """For each augmented system (SYSTEM-aug or SYSTEM-aug-input, beside SYSTEM) with usage.json in its
    tunings (`moses-rnn analyze augmented`): the lines added, per tuning the generated pairs its test 1-best used and the BLEU
    of the sentences that used one against SYSTEM's tuning of the same seed on the same sentences; and the
    most used pairs of the first tuning, each with its sentence's BLEU in both systems."""
    from sacrebleu.metrics import BLEU

    reference = _lines(test_ref)
    lines = []
    for system in systems:
        base = system[: system.index("-aug")] if "-aug" in system else None  # SYSTEM-aug, SYSTEM-aug-input
        runs = _runs(work, system, tuner)
        found = {k: json.loads((d / "usage.json").read_text(encoding="utf-8"))
                 for k, d in runs.items() if (d / "usage.json").exists()}
        if not base or not found:
            continue
        base_runs = _runs(work, base, tuner)
        first = found[next(iter(found))]
        lines += ["", f"{label(system)}: {first['generated_lines']:,} generated lines added to the table's "
                  f"{first['table_lines'] - first['generated_lines']:,} (+{100 * first['growth']:.1f}%). The test "
                  f"1-best of each tuning (decoded again with Moses's -t), against {label(base)}'s tuning of the "
                  "same seed on the sentences that used a generated pair:", "",
                  "| Tuning | phrases used | generated (distinct) | sentences using one | BLEU there | "
                  f"{label(base)} there |", "|---|---:|---:|---:|---:|---:|"]
        for k, u in found.items():
            ids = u["sentence_ids"]
            ours = _subset_bleu([_lines(runs[k] / "test.detok")], reference, ids)
            theirs = _subset_bleu([_lines(base_runs[k] / "test.detok")], reference, ids) \
                if k in base_runs and (base_runs[k] / "test.detok").exists() else []
            cells = f"{ours[0]:.2f} | {theirs[0]:.2f}" if ours and theirs else "– | –"
            lines.append(f"| {k} | {u['phrases']:,} | {u['generated_phrases_used']:,} "
                         f"({u['distinct_generated_pairs_used']:,}) | {len(ids):,} | {cells} |")
        k = next(iter(found))
        if first["examples"] and k in base_runs and (base_runs[k] / "test.detok").exists():
            ours, theirs = _lines(runs[k] / "test.detok"), _lines(base_runs[k] / "test.detok")
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


# ---- the networks alone, and BLEU by sentence length (Bahdanau et al., Table 1 and Figure 2) ----

def _pooled(work: Path, system: str, tuner: str) -> list[list[str]]:
    """The test outputs (detokenized) of a system's tunings, or of a network alone (WORK/NAME/test.detok)."""
    runs = [d / "test.detok" for d in _runs(work, system, tuner).values()] or [work / system / "test.detok"]
    return [_lines(p) for p in runs if p.exists()]


def _subset_bleu(outputs: list[list[str]], reference: list[str], chosen: list[int]) -> list[float]:
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

    sources, targets, reference = _lines(test_src), _lines(test_trg), _lines(test_ref)
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
        outputs = _pooled(work, system, tuner)
        if not outputs:
            continue
        every, no_unk = (_subset_bleu(outputs, reference, chosen) for chosen in (list(range(len(reference))), clean))
        name = label(system) if system in systems else f"{system} (network alone, beam 5)"
        rows.append(f"| {name} | {len(outputs)} | {_mean_sd(every) if every else '–'} | "
                    f"{_mean_sd(no_unk) if no_unk else '–'} |")
    return [f"BLEU on all {len(reference):,} test sentences, and on the {len(clean):,} whose source and reference "
            "have no word outside the networks' vocabularies (Bahdanau et al., Table 1):", "",
            "| Models | tunings | BLEU test, all | BLEU test, no unknown word |", "|---|---:|---:|---:|", *rows]


LENGTH_BUCKETS = [(0, 10), (10, 20), (20, 30), (30, 40), (40, 50), (50, 10**9)]


def plot_lengths(work: Path, systems: list[str], tuner: str, test_src: Path, test_ref: Path, output: str) -> list[str]:
    """BLEU by source length (words, buckets of 10) of each system, its tunings pooled (Bahdanau et al.,
    Figure 2), as a PNG; returns a Markdown table of the same numbers."""
    from sacrebleu.metrics import BLEU
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths, reference = [len(line.split()) for line in _lines(test_src)], _lines(test_ref)
    buckets = [[i for i, n in enumerate(lengths) if lo <= n < hi] for lo, hi in LENGTH_BUCKETS]
    names = [f"{lo}-{hi - 1}" if hi < 10**9 else f"{lo}+" for lo, hi in LENGTH_BUCKETS]
    rows, fig = [], plt.figure(figsize=(7, 4.2), dpi=120)
    ax = fig.add_subplot()
    for system in systems:
        outputs = _pooled(work, system, tuner)
        if not outputs:
            continue
        scores = []
        for chosen in buckets:
            hyps = [out[i] for out in outputs for i in chosen]
            refs = [[reference[i] for _ in outputs for i in chosen]]
            scores.append(BLEU(lowercase=True).corpus_score(hyps, refs).score if chosen else float("nan"))
        name = label(system) if (work / "systems" / system).exists() else f"{system} (network alone)"
        ax.plot(range(len(buckets)), scores, marker="o", label=name)
        rows.append(f"| {name} | " + " | ".join(f"{v:.2f}" for v in scores) + " |")
    ax.set_xticks(range(len(buckets)), [f"{n}\n({len(b):,})" for n, b in zip(names, buckets)])
    ax.set_xlabel("source sentence length in words (sentences)")
    ax.set_ylabel("BLEU (lowercased)")
    ax.set_title("Test BLEU by source length (tunings pooled)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    tmp = output + ".tmp.png"
    fig.savefig(tmp)
    plt.close(fig)
    Path(tmp).replace(output)
    return ["| Models | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names), *rows]


def compare(work: Path, system: str, base: str, tuner: str, reference: list[str] | None, samples: int,
            ar_samples: int) -> dict:
    """`system` against `base` on test: the gain of each tuning over the base's tuning of the same seed,
    its paired bootstrap p-value, and approximate randomization and a bootstrap over all tunings of both
    together (significance.py). Empty cells ('–') where results or outputs are missing."""
    from significance import approximate_randomization, bootstrap

    base_runs, runs = _runs(work, base, tuner), _runs(work, system, tuner)
    base_test = {name: _bleu(d / "test.bleu.json") for name, d in base_runs.items()}
    test = {name: b for name, b in ((name, _bleu(d / "test.bleu.json")) for name, d in runs.items()) if b}
    gains = [b["score"] - base_test[name]["score"] for name, b in test.items() if base_test.get(name)]
    p_values, p_all, signature, descriptions = [], ["–", "–"], None, []
    if reference is not None:
        for name in test:
            if name in base_runs and (base_runs[name] / "test.detok").exists() and (runs[name] / "test.detok").exists():
                p, signature = paired_bootstrap(reference, _lines(base_runs[name] / "test.detok"),
                                                _lines(runs[name] / "test.detok"), samples)
                p_values.append(f"{p:.3f}")
        base_out = [_lines(d / "test.detok") for d in base_runs.values() if (d / "test.detok").exists()]
        mine_out = [_lines(d / "test.detok") for d in runs.values() if (d / "test.detok").exists()]
        if base_out and mine_out:
            over_all = [method(reference, base_out, mine_out, samples=ar_samples)
                        for method in (approximate_randomization, bootstrap)]
            p_all = [f"{r.p_value:.4f}" for r in over_all]
            descriptions = [r.description for r in over_all]
    gain_cell = (" / ".join(f"{g:+.2f}" for g in gains) + (f" (min {min(gains):+.2f})" if len(gains) > 1 else "")
                 if gains else "–")
    return {"gain": gain_cell, "p": " / ".join(p_values) if p_values else "–", "p_all": p_all,
            "signature": signature, "descriptions": descriptions}


def report(args) -> None:
    """Table 1: per system, dev and test BLEU as mean ± sd over its tunings (runs); the test gain over
    the baseline per tuning (run K against the baseline's run K) with the paired bootstrap p-value of
    each, and approximate randomization and a bootstrap over all tunings of both systems together
    (significance.py); with --pairs, the same against the system each one extends;
    the health of every tuning; the networks, perplexities and step times."""
    work = Path(args.work)
    tuning = args.tuning or tuning_name(args.tuner, args.restarts, args.tuner_args)
    systems = args.systems.replace(",", " ").split()
    reference = _lines(Path(args.test_ref)) if args.test_ref else None
    rows, signature, test_signature, all_descriptions = [], None, None, []
    for system in systems:
        runs = _runs(work, system, tuning)
        dev = [b for b in (_bleu(d / "dev.bleu.json") for d in runs.values()) if b]
        test = [b for b in (_bleu(d / "test.bleu.json") for d in runs.values()) if b]
        if not dev and not test:
            continue
        signature = signature or (test or dev)[0].get("signature")
        cells = [_mean_sd([b["score"] for b in part]) if part else "–" for part in (dev, test)]
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
        if system in systems and base in systems and _runs(work, system, tuning) and _runs(work, base, tuning):
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
        lines += ["", "Against the system each one extends (the same tests):", "",
                  "| Models | against | test gain per tuning | p per tuning | p all tunings (AR) "
                  "| p all tunings (bootstrap) |", "|---|---|---|---|---:|---:|", *extended]
    if signature:
        lines += ["", f"sacrebleu signature: `{signature}`"]
    if test_signature:
        lines += ["", f"paired bootstrap signature: `{test_signature}`"]
    for description in all_descriptions:
        lines += ["", f"over all tunings: `{description}`"]
    models = [row for row in (*(_model_row(name, work / folder / "model") for folder, name in NETWORKS.items()),
                              _model_row("CSLM", work / "cslm" / "model")) if row]
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
        lines += ["", "| Step | runs | median min | total min |", "|---|---:|---:|---:|", *_step_times(work / "times.tsv")]
    if args.dev_ref:
        curves = mert_curves(work, systems, Path(args.dev_ref), tuning)
        if curves:
            health = [tuning_health(scores)["verdict"] for runs in curves.values() for scores in runs.values()]
            bad = sum(v in ("failed", "collapsed") for v in health)
            lines += ["", f"Tunings: dev BLEU (tokenized, lowercased) of each iteration's decoded 1-best. 'failed': the "
                      f"best iteration is the first (the tuning kept its starting weights); 'collapsed': an iteration "
                      f"fell below half of the first; 'dipped': more than {DIP_DROP:.1f} below the first; 'weak': the "
                      f"best is less than {FAIL_GAIN:.1f} above the first. {bad} of {len(health)} tunings failed or "
                      f"collapsed, {health.count('dipped')} dipped.", "",
                      "| Tuning | iterations | dev BLEU, iteration 1 | best (iteration) | lowest after 1 | verdict |",
                      "|---|---:|---:|---:|---:|---|", *_health_rows(curves)]
            if args.plot:
                plot_mert(curves, args.plot, args.label or f"dev BLEU of each {args.tuner} iteration's 1-best output",
                          args.tuner)
                lines += ["", f"Dev BLEU per {args.tuner} iteration: `{Path(args.plot).name}`"]
    weights = column_weights(work, systems, tuning)
    if weights:
        lines += ["", "Tuned weights of the network columns (and their share of the sum of all weights' absolute "
                  "values):", "", "| Tuning | network column | share | CSLM (share) |", "|---|---:|---:|---:|", *weights]
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
    learned = [(f"{name} ({NETWORK_ARCHS.get(r['arch'], r['arch'])})", r) for name in networks
               for r in _json_list(work / name / "learning.json")]
    if learned:
        from moses_rnn.analysis.learning import markdown

        lines += ["", "Learning statistics of the sentence networks (Bahdanau et al., Table 2): the saved model's "
                  "updates, passes over the training pairs and hours in training steps; NLL per sentence pair "
                  "(natural log) on 1,000 training pairs, on the pairs held out from training, and on the dev set:",
                  "", markdown(learned).rstrip("\n")]
    drawn = [name for name in networks if (work / name / "alignments.png").exists()]
    if drawn:
        lines += ["", "Soft alignments of the first 4 test sentences of 10-20 words with their references "
                  "(Bahdanau et al., Figure 3): " + ", ".join(f"`{name}/alignments.png`" for name in drawn)]
    if args.length_plot and args.test_src and args.test_ref:
        table = plot_lengths(work, [*systems, *networks], tuning, Path(args.test_src), Path(args.test_ref),
                             args.length_plot)
        lines += ["", f"Test BLEU by source length, tunings pooled (`{Path(args.length_plot).name}`):", "", *table]
    if args.training_plot and plot_training(work, args.training_plot):
        lines += ["", f"Held-out perplexity of each phrase network while training: `{Path(args.training_plot).name}`"]
    notes = work / "NOTES.md"
    if notes.exists():
        lines += ["", notes.read_text().strip()]
    _write_lines(args.output, lines)
    print("\n".join(lines))


# the mert-moses.pl options each TUNER value adds (pipelines/Makefile), for the report's first line
TUNER_FLAGS = {"mert": "", "kbmira": " --batch-mira", "pro": " --pairwise-ranked, megam by pipelines/megam.py"}
MERT_RESTARTS = 20  # mert-moses.pl's default --random-restarts


def tuning_name(tuner: str, restarts: int = MERT_RESTARTS, tuner_args: str = "") -> str:
    """The prefix of a system's tuning folders, systems/SYSTEM/NAME-K: the tuner, with -rN for mert
    run with N random restarts other than mert-moses.pl's 20, and -bp for pro with its -b (the
    smoothed brevity penalty) among the tuner's arguments (pipelines/Makefile's TUNING)."""
    if tuner == "mert" and restarts != MERT_RESTARTS:
        return f"{tuner}-r{restarts}"
    if tuner == "pro" and "-b" in tuner_args.split():
        return "pro-bp"
    return tuner


def table_path(args) -> None:
    """Print the file of a moses.ini's phrase table (--table NAME, else the first); Moses adds .gz
    to a path that does not exist, and so does this."""
    from moses_rnn.formats.mosesini import MosesIni

    ini = MosesIni.read(args.ini)
    tables = [ini.feature(args.table)] if args.table else ini.phrase_tables()
    if not tables or not tables[0].get("path"):
        raise ValueError(f"{args.ini}: no phrase table with a path")
    print(tables[0].table_file())


def positive(args) -> None:
    """Print the names mert's -P option takes (`NAME_0,NAME_1,...`, as in its feature files) for every
    tuned score of each named feature of a moses.ini: mert then keeps their weights above 0.

    mert numbers only a feature's tuneable scores, consecutively (a phrase table whose last column
    is fixed by tuneable-components=true,...,false has names _0 to _4 for its first five). A feature
    with no tuned score (tuneable=false) is refused."""
    from moses_rnn.formats.mosesini import MosesIni

    ini = MosesIni.read(args.ini)
    names = []
    for name in args.features:
        feature = ini.feature(name)
        if feature.get("tuneable") == "false":
            raise ValueError(f"{args.ini}: {name} is not tuned (tuneable=false)")
        count = feature.num_scores()
        if not count:
            raise ValueError(f"{args.ini}: cannot tell how many scores {name} has (no num-features=)")
        components = feature.get("tuneable-components")
        if components is not None:  # Moses's booleans (Scan<bool>): true/yes/1, false/no/0
            flags = [c.strip().lower() for c in components.split(",")]
            if len(flags) != count or any(f not in ("true", "yes", "1", "false", "no", "0") for f in flags):
                raise ValueError(f"{args.ini}: {name}'s tuneable-components={components} is not {count} booleans")
            count = sum(f in ("true", "yes", "1") for f in flags)
        names += [f"{name}_{i}" for i in range(count)]
    print(",".join(names))


def pro_features(args) -> None:
    """Print the names PRO's data gives the named scores (`F<j>,...`: pro writes each dense score
    as F followed by its position in the feature files), from the header of a features file that
    Moses's extractor wrote for the same tuning (`FEATURES_TXT_BEGIN_0 SENT N COUNT NAME...`);
    megam.py -nonneg takes them. A name the header lacks stops with one line naming the file."""
    wanted = [n for n in args.names.split(",") if n]
    if not wanted:  # no constraint: the file is not read
        print("")
        return
    with open(args.features, "rb") as fh:
        header = fh.readline().decode("utf-8", "replace").split()
    if len(header) < 4 or header[0] != "FEATURES_TXT_BEGIN_0" or not header[3].isdigit() \
            or len(header) != 4 + int(header[3]):
        raise UserError(f"{args.features}: not a Moses features file (no FEATURES_TXT_BEGIN_0 header naming its scores)")
    column = {name: j for j, name in enumerate(header[4:])}
    missing = [n for n in wanted if n not in column]
    if missing:
        raise UserError(f"{args.features}: no score named {', '.join(missing)} (it has {' '.join(header[4:])})")
    print(",".join(f"F{column[n]}" for n in wanted))


def best_iteration(args) -> None:
    """Print the iteration whose weights mert-moses.pl --return-best-dev returned (its log's
    'copying weights from best iteration (N, bleu=...)'); exit 1 when the log has none."""
    best = None
    for _, line in iter_lines(args.log):
        if line.startswith("copying weights from best iteration ("):
            best = line.split("(", 1)[1].split(",", 1)[0]
    if best is None or not best.isdigit():
        sys.exit(1)
    print(best)


def nbest_top(args) -> None:
    """The first N hypotheses of each sentence of an n-best list (mtcommon.nbest.top)."""
    from mtcommon.nbest import top

    read, kept = top(args.nbest, args.output, args.n)
    print(f"{args.nbest}: kept {kept:,} of {read:,} hypotheses ({args.n} a sentence at most)", file=sys.stderr)


def json_field(args) -> None:
    """Print one top-level field of a JSON file (a step's result that a later step's command needs)."""
    try:
        value = json.loads(Path(args.file).read_text(encoding="utf-8"))[args.key]
    except (KeyError, TypeError, json.JSONDecodeError):
        raise UserError(f"{args.file}: no field {args.key!r} in a JSON object") from None
    print(value)


# ---- reranking (rerank.py): tune the weights of a rescored dev n-best list, apply them --------

def rerank_tune(args) -> None:
    import rerank

    rerank.tune(args.nbest, args.ref, args.ini, args.moses, args.output, seed=args.seed,
                positive=args.positive.split(), restarts=args.restarts)


def rerank_apply(args) -> None:
    import rerank

    sentences = sum(1 for _ in iter_lines(args.source))
    _write_lines(args.output, rerank.rerank(args.nbest, rerank.read_weights(args.weights), sentences))


# What a run of the pipeline calls, checked before its first step (preflight):
# Moses's programs and scripts, by tuner and by step, and the Python packages
# (bin/mert for every tuner: the reranked systems tune their weights with it).
MOSES_NEEDS = ["bin/moses", "bin/lmplz", "bin/build_binary", "bin/extract", "bin/score", "bin/consolidate",
               "bin/lexical-reordering-score", "bin/extractor", "bin/mert", "bin/evaluator",
               "scripts/training/train-model.perl", "scripts/training/mert-moses.pl",
               "scripts/training/filter-model-given-input.pl"]
TUNER_NEEDS = {"mert": [], "kbmira": ["bin/kbmira"], "pro": ["bin/pro"]}


def preflight(args) -> None:
    """Check, before a run starts, every program and package its steps will call, and stop with
    one line naming all that is missing; print nothing when all is there.

    A step hours into a run (the report's `cslm eval --kenlm`, PRO's optimiser) must not be the
    first to find that something was never installed.
    """
    import importlib.util
    import os
    import shutil

    missing = []
    moses = Path(args.moses)
    for rel in MOSES_NEEDS + TUNER_NEEDS[args.tuner]:
        if not (moses / rel).is_file():
            missing.append(f"{moses / rel}")
    for tool in ["perl", args.moses_rnn, args.sacrebleu, args.eflomal] + ([args.cslm] if args.cslm_systems else []):
        if shutil.which(tool) is None and not os.access(tool, os.X_OK):
            missing.append(f"{tool} (not on PATH)")
    packages = {"sacremoses": "pipeline", "matplotlib": "pipeline"}
    if args.cslm_systems:
        packages["kenlm"] = "pipeline"  # the report's cslm eval --kenlm
    if args.tuner == "pro":
        packages["scipy"] = "pipeline"  # megam.py, PRO's optimiser
    for module, extra in packages.items():
        if importlib.util.find_spec(module) is None:
            missing.append(f"Python package {module} (pip install -e '.[{extra}]')")
    if missing:
        raise SystemExit("pipelines: missing before the run starts: " + "; ".join(missing))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("prepare")
    a.add_argument("input", help="prefix: INPUT.SRC and INPUT.TRG")
    a.add_argument("output", help="prefix of the outputs")
    a.add_argument("--src", required=True)
    a.add_argument("--trg", required=True)
    a.add_argument("--lines", type=int, default=0, help="use only the first N (sampled) lines (0: all)")
    a.add_argument("--stride", type=int, default=1, help="use every K-th line (a sample across the corpus)")
    a.add_argument("--max-len", type=int, default=0, help="drop pairs with a side longer than this (0: keep all)")
    a.add_argument("--max-ratio", type=float, default=9.0)
    a.add_argument("--no-lowercase", dest="lowercase", action="store_false")
    a.set_defaults(fn=prepare)
    a = sub.add_parser("symmetrize")
    a.add_argument("forward")
    a.add_argument("reverse")
    a.add_argument("output")
    a.set_defaults(fn=symmetrize)
    a = sub.add_parser("detok")
    a.add_argument("input")
    a.add_argument("output")
    a.add_argument("--lang", required=True)
    a.set_defaults(fn=detok)
    a = sub.add_parser("rerank-tune", help="weights for a rescored dev n-best list (Moses's extractor and mert)")
    a.add_argument("nbest")
    a.add_argument("--ref", required=True, help="the tokenized dev references")
    a.add_argument("--ini", required=True, help="the tuned moses.ini: the starting weights")
    a.add_argument("--moses", required=True)
    a.add_argument("--seed", type=int, default=1)
    a.add_argument("--restarts", type=int, default=20)
    a.add_argument("--positive", default="", help="features whose weights stay above 0 (mert -P)")
    a.add_argument("-o", "--output", required=True)
    a.set_defaults(fn=rerank_tune)
    a = sub.add_parser("rerank", help="each sentence's best hypothesis of a rescored n-best list")
    a.add_argument("nbest")
    a.add_argument("weights")
    a.add_argument("--source", required=True, help="the source sentences (their count)")
    a.add_argument("-o", "--output", required=True)
    a.set_defaults(fn=rerank_apply)
    a = sub.add_parser("report")
    a.add_argument("work")
    a.add_argument("output")
    a.add_argument("--systems", required=True,
                   help="the systems (pipelines/Makefile's SYSTEMS), by spaces or commas; the first is the baseline "
                        "of the paired tests")
    a.add_argument("--test-ref", help="the test references: with them, paired bootstrap tests against the baseline")
    a.add_argument("--tuner", default="mert", choices=sorted(TUNER_FLAGS), help="whose tunings: systems/S/TUNER-K")
    a.add_argument("--tuner-args", default="", help="the options the tuner's optimiser was given (pipelines/Makefile's "
                                                    "TUNER_ARGS), named in the report; pro's -b makes the tunings pro-bp-K")
    a.add_argument("--restarts", type=int, default=MERT_RESTARTS,
                   help="mert's random restarts (pipelines/Makefile's RESTARTS): other than 20, the tunings are "
                        "systems/S/mert-rN-K")
    a.add_argument("--tuning", help="the tunings' folder name (pipelines/Makefile's TUNING): systems/S/TUNING-K; "
                                    "default: the tuner's, as --restarts makes it")
    a.add_argument("--samples", type=int, default=1000, help="bootstrap samples")
    a.add_argument("--ar-samples", type=int, default=10000, help="samples of the two tests over all tunings")
    a.add_argument("--dev-ref", help="the tokenized dev references (dev.TRG): with --plot, dev BLEU per MERT iteration")
    a.add_argument("--plot", help="PNG of the dev BLEU of every MERT iteration of every tuning")
    a.add_argument("--training-plot", help="PNG of the phrase networks' held-out perplexity against their updates")
    a.add_argument("--test-src", help="the tokenized test sources (test.SRC): with --shortlist and --test-ref, BLEU on "
                                      "the sentences with a word outside the shortlist")
    a.add_argument("--shortlist", help="the word-level RNN's source vocabulary (rnn/model/src.vocab); skipped if absent")
    a.add_argument("--test-trg", help="the tokenized test references (test.TRG): with --networks, the no-unknown subset")
    a.add_argument("--pairs", default="", help="SYSTEM:BASE pairs tested as each system is against the baseline")
    a.add_argument("--networks", default="", help="networks that translated the test set alone (WORK/NAME/test.detok)")
    a.add_argument("--length-plot", help="PNG of test BLEU by source length of every system and network")
    a.add_argument("--label", default="", help="a line above the table (what kind of run this is)")
    a.set_defaults(fn=report)
    a = sub.add_parser("tuners", help="the tuners side by side on the same systems")
    a.add_argument("work")
    a.add_argument("output")
    a.add_argument("--systems", required=True, help="the systems, by spaces or commas")
    a.add_argument("--tuners", default="mert kbmira pro", help="the tuners (or the names of their tunings, TUNING), the first the one the others are tested "
                                                              "against (by spaces or commas)")
    a.add_argument("--restarts", type=int, default=MERT_RESTARTS, help="mert's random restarts (its tunings' folders)")
    a.add_argument("--test-ref", help="the test references: with them, approximate randomization against the first tuner")
    a.add_argument("--dev-ref", help="the tokenized dev references: iterations, verdicts and --plot")
    a.add_argument("--ar-samples", type=int, default=10000)
    a.add_argument("--plot", help="PNG of every tuning's dev BLEU per iteration")
    a.add_argument("--label", default="", help="the picture's title")
    a.set_defaults(fn=tuners)
    a = sub.add_parser("reweight")
    a.add_argument("filtered", help="moses.ini of the filtered model")
    a.add_argument("tuned", help="moses.ini with the tuned [weight] section")
    a.add_argument("-o", "--output", required=True)
    a.set_defaults(fn=reweight)
    a = sub.add_parser("table-path")
    a.add_argument("ini")
    a.add_argument("--table", help="the phrase table's feature name (default: the first phrase table)")
    a.set_defaults(fn=table_path)
    a = sub.add_parser("positive")
    a.add_argument("ini")
    a.add_argument("features", nargs="+", help="feature names (LexicalReordering0 ...)")
    a.set_defaults(fn=positive)
    a = sub.add_parser("pro-features", help="PRO's names (F<j>) of scores named as mert names them")
    a.add_argument("features", help="a features file of the tuning (mert/run1.features.dat)")
    a.add_argument("names", help="comma-separated score names, as `mt.py positive` prints them (may be empty)")
    a.set_defaults(fn=pro_features)
    a = sub.add_parser("preflight")
    a.add_argument("--moses", required=True, help="the Moses checkout (with bin/ built)")
    a.add_argument("--tuner", default="mert", choices=sorted(TUNER_NEEDS))
    a.add_argument("--moses-rnn", default="moses-rnn")
    a.add_argument("--cslm", default="cslm")
    a.add_argument("--sacrebleu", default="sacrebleu")
    a.add_argument("--eflomal", default="eflomal-align")
    a.add_argument("--cslm-systems", action="store_true", help="the run has CSLM systems (cslm, kenlm needed)")
    a.set_defaults(fn=preflight)
    a = sub.add_parser("best-iteration")
    a.add_argument("log", help="mert-moses.pl's log (stdout)")
    a.set_defaults(fn=best_iteration)
    a = sub.add_parser("nbest-top", help="the first N hypotheses of each sentence of an n-best list")
    a.add_argument("nbest")
    a.add_argument("n", type=int)
    a.add_argument("-o", "--output", required=True)
    a.set_defaults(fn=nbest_top)
    a = sub.add_parser("json-field")
    a.add_argument("file")
    a.add_argument("key")
    a.set_defaults(fn=json_field)
    a = sub.add_parser("timed")
    a.add_argument("times", help="the TSV file the step's seconds are appended to")
    a.add_argument("step")
    a.add_argument("command", nargs=argparse.REMAINDER)
    a.set_defaults(fn=timed)
    args = p.parse_args(argv)
    try:
        args.fn(args)
    except (UserError, OSError, ValueError) as e:  # bad or missing input (a cut gzip corpus too): one line
        raise SystemExit(f"mt.py {args.cmd}: {e}") from None


if __name__ == "__main__":
    main()
