"""`moses-rnn score` and `moses-rnn rescore-nbest`: a phrase model's log p added to a phrase table's lines
or to an n-best list's hypotheses."""

from __future__ import annotations

import click

from mtcommon.cliutil import (DEVICE, MODEL_DIR, QUIET, THREADS, device_option, fail_cleanly, feature_name,
                              require_model_dir)
from mtcommon.outputs import check_paths


def default_output(table: str, suffix: str = "rnn") -> str:
    """phrase-table.gz -> phrase-table.rnn.gz beside the input."""
    base = table[:-3] if table.endswith(".gz") else table
    return f"{base}.{suffix}.gz" if table.endswith(".gz") else f"{base}.{suffix}"


@click.command()
@click.argument("table", type=click.Path(dir_okay=False, allow_dash=True))
@MODEL_DIR
@click.option("-o", "--output", help="Output table ('-' for stdout) [TABLE with .rnn before .gz].")
@click.option("--normalize", is_flag=True, help="Divide log p by the number of target symbols (units + </s>; units are words, or subword units).")
@click.option("--unknown/--no-unknown", default=False, show_default=True,
              help="Also append the count of words outside the shortlists (word-penalty feature).")
@device_option(torchrun=True)
@click.option("--dtype", default="fp32", show_default=True, type=click.Choice(["fp32", "bf16", "auto"]),
              help="fp32: exact. bf16: bfloat16 matrix products (GPUs, CPUs with AVX-512 BF16 or AMX; an error "
                   "elsewhere), log p within a few hundredths, see docs/scoring.md. auto: on a CPU with native "
                   "bfloat16, the faster of the two on the table's first pairs; on a GPU, bf16 where native.")
@click.option("--threads", type=THREADS, help="CPU threads [all cores, shared by torchrun's local processes; "
                                          "1 for models smaller than `small`].")
@click.option("--workers", type=click.IntRange(min=1),
              help="Scoring processes [tables over 8 MB: on CPU all cores for models smaller than `small`, on a "
                   "GPU up to 8; else 1]. On a GPU the others parse, plan and format windows for this one, which "
                   "alone runs the network.")
@click.option("--window", type=click.IntRange(min=1),
              help="Lines read and scored together [8192 on CPU; 65536 on a GPU, 32768 on 8 and 12 GB cards].")
@click.option("--token-budget", type=click.IntRange(min=1),
              help="Source words per encoder batch [16384 on CPU; on a GPU 65536 for a 16 GB card, 32768 to "
                   "262144 by its memory].")
@click.option("--max-phrase-words", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Longest phrase scored, in words: a longer one is an error naming its line (time and memory "
                   "grow with a phrase's length; Moses's phrases have up to 7 words by default).")
@QUIET
@fail_cleanly
def score(table, model_dir, output, normalize, unknown, device, dtype, threads, workers, window, token_budget,
          max_phrase_words, quiet):
    """Append log p(target | source) (as e^value, see docs/score-table.md) to every line of TABLE.

    Sharded over processes or machines with torchrun, e.g.
    `torchrun --nproc-per-node 2 $(which moses-rnn) score TABLE -m MODEL -o OUT` (docs/scoring.md).
    """
    from mtcommon.runtime import Distributed
    from ..scoring.table import score_table, setup_scoring, workers_warning

    output = output or default_output(table)
    check_paths([table], output)
    require_model_dir(model_dir, "moses-rnn")
    with setup_scoring(model_dir, table, device, threads, workers, token_budget, dtype,
                       Distributed.from_env()) as setup:
        warning = workers_warning(setup.workers, setup.dist.local_world) if workers else None
        if warning and setup.dist.is_main:
            click.echo(warning, err=True)
        stats = score_table(setup.scorer, table, output, normalize=normalize, unknown=unknown, window=window,
                            workers=setup.workers, progress=not quiet, dist=setup.dist, max_words=max_phrase_words)
    if setup.dist.is_main:
        procs = f"{stats.processes} torchrun processes x " if stats.processes > 1 else ""
        click.echo(f"{stats.lines} lines, {stats.distinct_sources} source groups, {stats.pairs_per_second:.0f} pairs/s "
                   f"on {setup.device}, {setup.scorer.compute_dtype} ({procs}{stats.workers} "
                   f"process{'es' if stats.workers > 1 else ''}) -> {output}", err=True)


@click.command("rescore-nbest")
@click.argument("nbest", type=click.Path(dir_okay=False, allow_dash=True))
@MODEL_DIR
@click.option("--source", required=True, type=click.Path(dir_okay=False, allow_dash=True),
              help="The tokenized source sentences the list translates, one a line (ids count from 0).")
@click.option("-o", "--output", required=True, help="Rescored n-best list ('-' for stdout).")
@click.option("--feature", default="RNN0", show_default=True, callback=feature_name,
              help="The feature's name in the list: letters, digits, '-' and '.', starting with a letter.")
@click.option("--unknown", is_flag=True, help="Also the count of units outside the model's vocabularies.")
@DEVICE
@click.option("--dtype", default="fp32", show_default=True, type=click.Choice(["fp32", "bf16", "auto"]))
@click.option("--threads", type=THREADS, help="CPU threads [by the model's size].")
@QUIET
@fail_cleanly
def rescore_nbest(nbest, model_dir, source, output, feature, unknown, device, dtype, threads, quiet):
    """Add `FEATURE= <log p(hypothesis | source)>` to every hypothesis of a Moses n-best list NBEST."""
    from mtcommon.runtime import configure_threads
    from ..scoring.nbest import rescore_nbest as run
    from ..scoring.scorer import PhraseScorer

    check_paths([nbest, source], output)
    require_model_dir(model_dir, "moses-rnn")
    scorer = PhraseScorer.from_dir(model_dir, device=device, dtype=dtype)
    configure_threads(scorer.device, threads, scorer.model.config)
    stats = run(scorer, source, nbest, output, feature=feature, unknown=unknown, progress=not quiet)
    if not quiet:
        click.echo(f"{stats.hypotheses} hypotheses of {stats.sentences} sentences -> {output}", err=True)
