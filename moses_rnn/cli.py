"""The `moses-rnn` command line: a thin layer over the library."""

from __future__ import annotations

import json
import os
import signal
import sys

import click

from . import __version__
from .textio import InputError


def _fail_cleanly(fn):
    """Turn bad input into a one-line error, and SIGTERM into a clean (atomic) exit."""

    def wrapper(*args, **kwargs):
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            return fn(*args, **kwargs)
        except (InputError, FileNotFoundError, ValueError) as e:
            raise click.ClickException(str(e)) from None

    wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
    return wrapper


def default_output(table: str, suffix: str = "rnn") -> str:
    """phrase-table.gz -> phrase-table.rnn.gz beside the input."""
    base = table[:-3] if table.endswith(".gz") else table
    return f"{base}.{suffix}.gz" if table.endswith(".gz") else f"{base}.{suffix}"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="moses-rnn")
def main():
    """RNN Encoder-Decoder phrase scores for Moses phrase tables (Cho et al., 2014)."""


@main.command()
@click.argument("table", type=click.Path(dir_okay=False))
@click.option("-o", "--model-dir", required=True, type=click.Path(file_okay=False), help="Where the model goes.")
@click.option("--preset", default="small", show_default=True, type=click.Choice(["paper", "small", "tiny"]))
@click.option("--src-vocab", type=int, help="Source shortlist size [preset's: 15000, tiny 2000].")
@click.option("--tgt-vocab", type=int, help="Target shortlist size [preset's].")
@click.option("--max-steps", default=20000, show_default=True, help="Stop after this many updates.")
@click.option("--max-minutes", type=float, help="Stop after this much wall-clock time.")
@click.option("--batch-size", default=64, show_default=True)
@click.option("--valid-pairs", default=1000, show_default=True, help="Held-out pairs for perplexity.")
@click.option("--eval-every", default=500, show_default=True, help="Steps between held-out evaluations and checkpoints.")
@click.option("--clip", default=1.0, show_default=True, help="Gradient-norm clipping threshold.")
@click.option("--seed", default=1, show_default=True)
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--resume", is_flag=True, help="Continue from MODEL_DIR/checkpoint.pt.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@_fail_cleanly
def train(table, model_dir, preset, src_vocab, tgt_vocab, max_steps, max_minutes, batch_size, valid_pairs,
          eval_every, clip, seed, device, resume, quiet):
    """Train on the unique phrase pairs of a Moses phrase table TABLE."""
    from .train import TrainConfig, train as run_train

    cfg = TrainConfig(preset=preset, src_vocab=src_vocab, tgt_vocab=tgt_vocab, batch_size=batch_size,
                      max_steps=max_steps, max_minutes=max_minutes, clip=clip, seed=seed,
                      valid_pairs=valid_pairs, eval_every=eval_every, device=device)
    summary = run_train(table, model_dir, cfg, resume=resume, progress=not quiet)
    click.echo(json.dumps(summary, indent=2), err=True)


@main.command()
@click.argument("table", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("-m", "--model-dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--output", help="Output table ('-' for stdout) [TABLE with .rnn before .gz].")
@click.option("--normalize", is_flag=True, help="Divide log p by the number of target symbols (words + </s>).")
@click.option("--unknown/--no-unknown", default=False, show_default=True,
              help="Also append the count of words outside the shortlists (word-penalty feature).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--threads", type=int, help="CPU threads [all cores].")
@click.option("--window", default=8192, show_default=True, help="Lines read and scored together.")
@click.option("--token-budget", default=16384, show_default=True, help="Target symbols per batch.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@_fail_cleanly
def score(table, model_dir, output, normalize, unknown, device, threads, window, token_budget, quiet):
    """Append log p(target | source) (as e^value, see README) to every line of TABLE."""
    from .score import PhraseScorer, configure_threads, score_table
    from .train import resolve_device

    dev = resolve_device(device)
    configure_threads(dev, threads)
    scorer = PhraseScorer.from_dir(model_dir, device=str(dev), token_budget=token_budget)
    output = output or default_output(table)
    if output != "-" and os.path.abspath(output) == os.path.abspath(table):
        raise click.ClickException("output would overwrite the input table")
    stats = score_table(scorer, table, output, normalize=normalize, unknown=unknown, window=window,
                        progress=not quiet)
    click.echo(f"{stats.lines} lines, {stats.distinct_sources} source groups, "
               f"{stats.pairs_per_second:.0f} pairs/s on {dev} -> {output}", err=True)


@main.group()
def ini():
    """Edit moses.ini files: add phrase-table columns and feature functions."""


def _ini_edit(moses_ini, output, edit):
    from .mosesini import IniError, MosesIni

    try:
        cfg = MosesIni.read(moses_ini)
        edit(cfg)
    except IniError as e:
        raise click.ClickException(f"{moses_ini}: {e}") from None
    if output == "-":
        click.echo(cfg.render(), nl=False)
    else:
        cfg.write(output)


@ini.command("add-columns")
@click.argument("moses_ini", type=click.Path(exists=True, dir_okay=False))
@click.option("--table", help="Phrase table's feature name, e.g. TranslationModel0 [the only one].")
@click.option("--count", "-n", default=1, show_default=True, help="Columns added to the table.")
@click.option("--weight", "-w", multiple=True, type=float, help="Initial weight, once or once per column [0.2].")
@click.option("--path", "table_path", help="Also point the table at this file (the scored table).")
@click.option("--fixed", is_flag=True, help="Mark the new columns untuneable (MERT keeps their weights).")
@click.option("-o", "--output", required=True, help="Output moses.ini ('-' for stdout).")
@_fail_cleanly
def ini_add_columns(moses_ini, table, count, weight, table_path, fixed, output):
    """Declare new score columns on a phrase table of MOSES_INI (num-features and weights)."""
    _ini_edit(moses_ini, output, lambda cfg: cfg.add_columns(table, count, list(weight) or 0.2,
                                                             path=table_path, fixed=fixed))


@ini.command("add-feature")
@click.argument("moses_ini", type=click.Path(exists=True, dir_okay=False))
@click.argument("feature_line", nargs=-1, required=True)
@click.option("--weight", "-w", multiple=True, type=float, help="Initial weight, once per score [0.1 each].")
@click.option("-o", "--output", required=True, help="Output moses.ini ('-' for stdout).")
@_fail_cleanly
def ini_add_feature(moses_ini, feature_line, weight, output):
    """Add a feature function line, e.g. `CSLM name=CSLM0 host=127.0.0.1 port=5000 order=7`, and its weights."""
    _ini_edit(moses_ini, output, lambda cfg: cfg.add_feature(" ".join(feature_line), list(weight) or None))


@ini.command("remove-feature")
@click.argument("moses_ini", type=click.Path(exists=True, dir_okay=False))
@click.argument("name")
@click.option("-o", "--output", required=True, help="Output moses.ini ('-' for stdout).")
@_fail_cleanly
def ini_remove_feature(moses_ini, name, output):
    """Remove feature NAME and its weights."""
    _ini_edit(moses_ini, output, lambda cfg: cfg.remove_feature(name))


@ini.command("set")
@click.argument("moses_ini", type=click.Path(exists=True, dir_okay=False))
@click.argument("name")
@click.argument("assignments", nargs=-1, required=True)
@click.option("-o", "--output", required=True, help="Output moses.ini ('-' for stdout).")
@_fail_cleanly
def ini_set(moses_ini, name, assignments, output):
    """Set KEY=VALUE parameters on feature NAME (e.g. path=phrase-table.rnn.gz)."""

    def edit(cfg):
        for a in assignments:
            key, eq, value = a.partition("=")
            if not eq or not key:
                raise ValueError(f"expected KEY=VALUE, got {a!r}")
            cfg.set_param(name, key, value)

    _ini_edit(moses_ini, output, edit)


if __name__ == "__main__":
    main()
