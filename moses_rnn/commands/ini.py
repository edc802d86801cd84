"""`moses-rnn ini`: moses.ini edits (phrase-table columns, feature functions, their weights)."""

from __future__ import annotations

import click

from mtcommon.cliutil import fail_cleanly

from ..formats.mosesini import COLUMN_WEIGHT


@click.group()
def ini():
    """Edit moses.ini files: add phrase-table columns and feature functions."""


def _ini_edit(moses_ini, output, edit):
    from ..formats.mosesini import IniError, MosesIni

    try:
        cfg = MosesIni.read(moses_ini)
        edit(cfg)
    except IniError as e:
        raise click.ClickException(f"{moses_ini}: {e}") from None
    cfg.write(output)  # '-': stdout

@ini.command("add-columns")
@click.argument("moses_ini", type=click.Path(exists=True, dir_okay=False))
@click.option("--table", help="Phrase table's feature name, e.g. TranslationModel0 [the only one].")
@click.option("--count", "-n", default=1, show_default=True, help="Columns added to the table.")
@click.option("--weight", "-w", multiple=True, type=float, help=f"Initial weight, once or once per column [{COLUMN_WEIGHT}].")
@click.option("--path", "table_path", help="Also point the table at this file (the scored table).")
@click.option("--fixed", is_flag=True, help="Mark the new columns untuneable (MERT keeps their weights).")
@click.option("--table-has-columns", is_flag=True,
              help="Without --path: the table already has the new columns; do not read its first line to check.")
@click.option("-o", "--output", required=True, help="Output moses.ini ('-' for stdout).")
@fail_cleanly
def ini_add_columns(moses_ini, table, count, weight, table_path, fixed, table_has_columns, output):
    """Declare new score columns on a phrase table of MOSES_INI (num-features and weights).

    Without --path the table keeps its file, which must already have the new columns: its first
    line is checked (relative paths from the current folder, as Moses reads them)."""
    _ini_edit(moses_ini, output, lambda cfg: cfg.add_columns(table, count, list(weight) or COLUMN_WEIGHT, path=table_path,
                                                             fixed=fixed, check_table=not table_has_columns))


@ini.command("add-feature")
@click.argument("moses_ini", type=click.Path(exists=True, dir_okay=False))
@click.argument("feature_line", nargs=-1, required=True)
@click.option("--weight", "-w", multiple=True, type=float, help="Initial weight, once per score [0.1 each].")
@click.option("-o", "--output", required=True, help="Output moses.ini ('-' for stdout).")
@fail_cleanly
def ini_add_feature(moses_ini, feature_line, weight, output):
    """Add a feature function line, e.g. `CSLM name=CSLM0 host=127.0.0.1 port=5000 order=7`, and its weights."""
    _ini_edit(moses_ini, output, lambda cfg: cfg.add_feature(" ".join(feature_line), list(weight) or None))


@ini.command("remove-feature")
@click.argument("moses_ini", type=click.Path(exists=True, dir_okay=False))
@click.argument("name")
@click.option("-o", "--output", required=True, help="Output moses.ini ('-' for stdout).")
@fail_cleanly
def ini_remove_feature(moses_ini, name, output):
    """Remove feature NAME and its weights."""
    _ini_edit(moses_ini, output, lambda cfg: cfg.remove_feature(name))


@ini.command("set")
@click.argument("moses_ini", type=click.Path(exists=True, dir_okay=False))
@click.argument("name")
@click.argument("assignments", nargs=-1, required=True)
@click.option("-o", "--output", required=True, help="Output moses.ini ('-' for stdout).")
@fail_cleanly
def ini_set(moses_ini, name, assignments, output):
    """Set KEY=VALUE parameters on feature NAME (e.g. path=phrase-table.rnn.gz)."""

    def edit(cfg):
        for a in assignments:
            key, eq, value = a.partition("=")
            if not eq or not key:
                raise click.UsageError(f"expected KEY=VALUE, got {a!r}")
            cfg.set_param(name, key, value)

    _ini_edit(moses_ini, output, edit)


@ini.command("weight")
@click.argument("moses_ini", type=click.Path(exists=True, dir_okay=False))
@click.argument("name")
@click.argument("weights", nargs=-1, required=True, type=float)
@click.option("-o", "--output", required=True, help="Output moses.ini ('-' for stdout).")
@fail_cleanly
def ini_weight(moses_ini, name, weights, output):
    """Set the starting weights of feature NAME, one per score (e.g. `LM0 0.4`)."""
    _ini_edit(moses_ini, output, lambda cfg: cfg.set_weights(name, list(weights)))
