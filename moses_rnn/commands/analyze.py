"""`moses-rnn analyze` (the papers' tables and figures, training curves and statistics) and `moses-rnn
align` (RNNsearch's soft alignments drawn)."""

from __future__ import annotations

import json
import os

import click

from mtcommon.cliutil import DEVICE, MODEL_DIR, SEED, Number, device_option, fail_cleanly, stacked, write_text


_PNG = click.option("-o", "--output", required=True, help="PNG file.")
_SEED = click.option("--seed", type=SEED, default=1, show_default=True)
_VECTORS = click.option("--vectors", help="Also write VECTORS.vectors.tsv and VECTORS.labels.tsv.")


def _labels(labels, paths, what: str, name=lambda p: os.path.basename(os.path.normpath(p))) -> list[str]:
    """One label per path: those given (--label, as many as the paths), else each path's `name`."""
    if labels and len(labels) != len(paths):
        raise click.UsageError(f"{len(labels)} --label for {len(paths)} {what}")
    return list(labels) or [name(p) for p in paths]


@click.command()
@click.argument("source", required=False)
@click.argument("target", required=False)
@MODEL_DIR
@_PNG
@click.option("-i", "--input", "input_file", type=click.Path(exists=True, dir_okay=False),
              help="Source sentences, one a line, instead of SOURCE: several alignments in one picture.")
@click.option("--targets", type=click.Path(exists=True, dir_okay=False),
              help="With --input: target sentences line by line with it (e.g. the reference) [the model's translations].")
@click.option("--lines", help="With --input: 1-based line numbers, comma-separated [the first 4 of 10-20 words].")
@click.option("-k", "--beam", default=5, show_default=True, help="Beam width when no target is given.")
@DEVICE
@fail_cleanly
def align(source, target, model_dir, output, input_file, targets, lines, beam, device):
    """Draw the soft alignment of an RNNsearch model for SOURCE and TARGET (or its translation) as PNG,
    or for several lines of a file (--input) in one picture (Bahdanau et al., Figure 3)."""
    from mtcommon.runtime import resolve_device
    from mtcommon.textio import iter_lines
    from ..analysis.align import draw_alignment, draw_alignments, pick_lines, soft_alignment
    from ..networks.modelio import load_model

    if bool(source) == bool(input_file):
        raise click.UsageError("give SOURCE [TARGET], or --input FILE")
    if not input_file and (targets or lines):
        raise click.UsageError("--targets and --lines go with --input")
    loaded = load_model(model_dir, resolve_device(device))
    if source:
        a = soft_alignment(loaded, source, target, beam=beam)
        draw_alignment(a, output)
        click.echo(f"{' '.join(a.target[:-1])} -> {output}", err=True)
        return
    sources = [line for _, line in iter_lines(input_file)]
    wanted = pick_lines(sources)
    if lines:
        try:
            wanted = [int(n) - 1 for n in lines.split(",")]
        except ValueError:
            raise click.UsageError(f"--lines {lines!r}: expected numbers separated by commas") from None
    if not wanted:
        raise click.UsageError(f"{input_file}: no line of 10-20 words; choose with --lines")
    outside = [n + 1 for n in wanted if not 0 <= n < len(sources)]
    if outside:
        raise click.UsageError(f"{input_file} has {len(sources)} lines, not line {outside[0]}")
    given = [line for _, line in iter_lines(targets)] if targets else None
    if given is not None and len(given) != len(sources):
        raise click.UsageError(f"{targets} has {len(given)} lines, {input_file} {len(sources)}")
    alignments = [soft_alignment(loaded, sources[n], given[n] if given else None, beam=beam) for n in wanted]
    what = "given target" if targets else "the network's translation"
    draw_alignments(alignments, output, [f"line {n + 1}" for n in wanted],
                    f"RNNsearch soft alignments ({what})")
    click.echo(f"{len(wanted)} alignments -> {output}", err=True)


@click.group()
def analyze():
    """The paper's analysis: Table 2 and Figures 3-5; training curves."""


# the score columns of `table2` and `scatter`
_columns = stacked([
    click.option("--tm-column", default=2, show_default=True,
                 help="0-based score column of p(target | source) (Moses order: 2)."),
    click.option("--rnn-column", type=int, help="0-based score column of the RNN [found by itself: the last, or "
                 "the one before the unknown-word count of `score --unknown`; refused when it cannot tell]."),
])

@analyze.command("table2")
@click.argument("table", type=click.Path(dir_okay=False, allow_dash=True))
@_columns
@click.option("-o", "--output", default="-", show_default=True, help="Markdown file ('-' for stdout).")
@click.option("--min-words", default=4, show_default=True, help="Shortest source phrase considered.")
@click.option("--per-group", type=click.IntRange(min=1), default=5, show_default=True,
              help="Source phrases per group (frequent, rare).")
@click.option("--top", type=click.IntRange(min=0), default=3, show_default=True, help="Targets listed per column.")
@click.option("--rare-max", type=Number(min=0), default=2.0, show_default=True,
              help="Largest count(source) that is 'rare'.")
@click.option("--min-targets", default=2, show_default=True, help="Skip sources with fewer targets.")
@click.option("--seed", type=SEED, default=1, show_default=True, help="Seed of the random pick of rare phrases.")
@fail_cleanly
def analyze_table2(table, tm_column, rnn_column, output, min_words, per_group, top, rare_max, min_targets, seed):
    """Table 2: top targets by the translation model and by the RNN, for long phrases of a scored TABLE."""
    from ..analysis.analyze import table2

    t = table2(table, tm_column, rnn_column, min_words, per_group, top, rare_max, min_targets, seed)
    write_text(output, t.markdown(), inputs=[table])
    click.echo(f"{t.long_sources} source phrases of {min_words}+ words; "
               f"{len(t.frequent)} frequent and {len(t.rare)} rare listed", err=True)


@analyze.command("curves")
@click.argument("model_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@_PNG
@click.option("--label", "labels", multiple=True, help="One label per MODEL_DIR [the folder names].")
@click.option("--title", default="Held-out perplexity", show_default=True)
@click.option("--reference", type=(str, float), help="A horizontal line: LABEL PERPLEXITY (e.g. KenLM 5-gram 129.0).")
@click.option("--x", "x", type=click.Choice(["minutes", "updates"]), default="minutes", show_default=True,
              help="The horizontal axis: training minutes or updates.")
@fail_cleanly
def analyze_curves(model_dirs, output, labels, title, reference, x):
    """Training curves: held-out perplexity against training time of MODEL_DIRS (either network)."""
    from ..analysis.analyze import training_curves, training_history

    names = _labels(labels, model_dirs, "model directories")
    training_curves([(n, training_history(d)) for n, d in zip(names, model_dirs)], output, title, reference, x=x)
    click.echo(f"{len(model_dirs)} runs -> {output}", err=True)


@analyze.command("columns")
@click.argument("tables", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", default="-", show_default=True, help="Markdown file ('-': stdout).")
@click.option("--label", "labels", multiple=True, help="One label per TABLE [the file names].")
@click.option("--tm-column", type=click.IntRange(min=0), default=2, show_default=True,
              help="0-based score column of p(e|f) (Moses: 2).")
@click.option("--min-words", type=click.IntRange(min=1), default=5, show_default=True,
              help="A long source phrase has at least this many words.")
@click.option("--examples", type=click.IntRange(min=0), default=6, show_default=True,
              help="Example sources of each kind (long; with a shortlist miss).")
@_SEED
@fail_cleanly
def analyze_columns(tables, output, labels, tm_column, min_words, examples, seed):
    """Compare the RNN columns of TABLES: one phrase table scored by different models, the word-level
    RNN's first (with --unknown, which marks its shortlist misses). Pearson r with p(e|f), the
    sources whose best target differs, and Table 2-style examples, as Markdown."""
    from ..analysis.columns import compare_columns

    if len(tables) < 2:
        raise click.UsageError("give two or more scored tables")
    names = _labels(labels, tables, "tables")
    result = compare_columns(tables, names, tm_column, min_words, examples, seed=seed)
    write_text(output, result.markdown(min_words), inputs=tables)
    click.echo(f"{result.pairs:,} pairs compared", err=True)


@analyze.command("augmented")
@click.argument("table", type=click.Path(exists=True, dir_okay=False))
@click.argument("trace", type=click.Path(exists=True, dir_okay=False))
@click.argument("source", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", default="-", show_default=True, help="JSON file ('-': stdout).")
@click.option("--examples", type=click.IntRange(min=0), default=12, show_default=True,
              help="Generated pairs listed, the most used first.")
@fail_cleanly
def analyze_augmented(table, trace, source, output, examples):
    """Which generated pairs of an augmented TABLE (moses-rnn augment) the 1-best of TRACE used: Moses's
    output with -t (segmentation) for the sentences of SOURCE. Counts, the sentences that used one,
    and the most used pairs, as JSON."""
    from ..analysis.augmented import usage

    u = usage(table, trace, source)
    write_text(output, json.dumps(u.as_dict(examples), indent=1, ensure_ascii=False) + "\n",
               inputs=[table, trace, source])
    click.echo(f"{u.used:,} of {u.phrases:,} phrases of the 1-best were generated pairs ({len(u.pairs):,} distinct), "
               f"in {len(u.sentences_using):,} of {u.sentences:,} sentences", err=True)


@analyze.command("learning")
@click.argument("model_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--output", default="-", show_default=True,
              help="A .json file (one object per MODEL_DIR), else Markdown ('-' for stdout).")
@click.option("--label", "labels", multiple=True, help="One label per MODEL_DIR [the folder names].")
@click.option("--dev", nargs=2, type=click.Path(exists=True, dir_okay=False), metavar="SRC TGT",
              help="A parallel dev text (tokenized, one sentence a line) for the dev NLL.")
@click.option("--sample", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Training pairs the train NLL is computed on.")
@click.option("--seed", type=SEED, default=1, show_default=True, help="Seed of the training sample.")
@device_option("cpu")
@fail_cleanly
def analyze_learning(model_dirs, output, labels, dev, sample, seed, device):
    """Learning statistics of trained networks (Bahdanau et al., Table 2): updates, epochs, hours and
    device of the saved model; NLL per sentence pair on training pairs, the held-out pairs and --dev."""
    from ..analysis.learning import learning_stats, markdown

    names = _labels(labels, model_dirs, "model directories")
    rows = [(n, learning_stats(d, dev, sample, seed, device).as_json()) for n, d in zip(names, model_dirs)]
    if output.endswith(".json"):
        text = json.dumps([{"label": n, **r} for n, r in rows], indent=1) + "\n"
    else:
        text = markdown(rows)
    write_text(output, text)


@analyze.command("scatter")
@click.argument("table", type=click.Path(dir_okay=False, allow_dash=True))
@_columns
@_PNG
@click.option("--max-points", type=click.IntRange(min=1), default=50000, show_default=True,
              help="Pairs drawn (a uniform sample).")
@_SEED
@fail_cleanly
def analyze_scatter(table, tm_column, rnn_column, output, max_points, seed):
    """Figure 3: RNN log p against translation-model log p for the pairs of a scored TABLE."""
    from ..analysis.analyze import score_scatter

    r = score_scatter(table, output, tm_column, rnn_column, max_points, seed)
    click.echo(f"{r['points']} of {r['pairs']} pairs, Pearson r = {r['pearson']:.3f} -> {output}", err=True)


@analyze.command("words")
@MODEL_DIR
@_PNG
@click.option("--words", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Most frequent shortlist words mapped.")
@click.option("--labels", type=click.IntRange(min=0), default=150, show_default=True,
              help="Most labels drawn (never overlapping).")
@click.option("--side", default="source", show_default=True, type=click.Choice(["source", "target"]))
@_VECTORS
@_SEED
@fail_cleanly
def analyze_words(model_dir, output, words, labels, side, vectors, seed):
    """Figure 4: a 2-D t-SNE map of the model's word embeddings."""
    from ..analysis.analyze import embedding_map
    from ..networks.modelio import load_model

    r = embedding_map(load_model(model_dir), output, words, labels, side, vectors, seed)
    click.echo(f"{r.points} words, {r.labels} labelled -> {output}", err=True)


@analyze.command("phrases")
@click.argument("table", type=click.Path(dir_okay=False, allow_dash=True))
@MODEL_DIR
@_PNG
@click.option("--phrases", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Most frequent long source phrases mapped.")
@click.option("--labels", type=click.IntRange(min=0), default=60, show_default=True,
              help="Most labels drawn (never overlapping).")
@click.option("--min-words", default=4, show_default=True)
@_VECTORS
@_SEED
@fail_cleanly
def analyze_phrases(table, model_dir, output, phrases, labels, min_words, vectors, seed):
    """Figure 5: a 2-D t-SNE map of the representations of TABLE's long source phrases."""
    from ..analysis.analyze import phrase_map
    from ..networks.modelio import load_model

    r = phrase_map(load_model(model_dir), table, output, phrases, labels, min_words, vectors, seed)
    click.echo(f"{r.points} phrases, {r.labels} labelled -> {output}", err=True)


