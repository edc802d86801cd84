"""The `moses-rnn` command line: a thin layer over the library."""

from __future__ import annotations

import json
import os

import click

from mtcommon.cliutil import (LR_SCHEDULE, OVERWRITE, SEED, THREADS, Number, check_device, explicit_options,
                              fail_cleanly, feature_name, require_model_dir)
from mtcommon.textio import check_paths
from mtcommon.vocab import RESERVED

from . import __version__
from .networks import ARCHS


def default_output(table: str, suffix: str = "rnn") -> str:
    """phrase-table.gz -> phrase-table.rnn.gz beside the input."""
    base = table[:-3] if table.endswith(".gz") else table
    return f"{base}.{suffix}.gz" if table.endswith(".gz") else f"{base}.{suffix}"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="moses-rnn")
def main():
    """RNN Encoder-Decoder phrase scores for Moses phrase tables (Cho et al., 2014)."""


@main.command()
@click.argument("table", required=False, type=click.Path(dir_okay=False))
@click.option("--corpus", nargs=2, type=click.Path(exists=True, dir_okay=False), metavar="SRC TGT",
              help="Train on the sentence pairs of a tokenized parallel corpus (one sentence a line) instead of "
                   "a phrase table's unique phrase pairs.")
@click.option("--max-len", type=click.IntRange(min=0), default=0,
              help="With --corpus: leave out pairs with more words than this on a side (the paper: 30, 50); "
                   "0: no limit.  [default: 0]")
@click.option("-o", "--model-dir", required=True, type=click.Path(file_okay=False), help="Where the model goes.")
@click.option("--preset", default="small", show_default=True, type=click.Choice(["paper", "small", "tiny"]))
@click.option("--arch", default="encdec", show_default=True, type=click.Choice(ARCHS),
              help="RNN Encoder-Decoder (Cho et al., 2014) or RNNsearch with attention (Bahdanau et al., 2015).")
@click.option("--src-vocab", type=click.IntRange(min=len(RESERVED) + 1),
              help="Source shortlist size, reserved symbols included [preset's: 15000, tiny 256].")
@click.option("--tgt-vocab", type=click.IntRange(min=len(RESERVED) + 1),
              help="Target shortlist size, reserved symbols included [preset's].")
@click.option("--subwords", type=click.IntRange(min=0), default=0,
              help="Read and predict subword units (sentencepiece BPE), this many per side, instead of word "
                   "shortlists: an open vocabulary, no [UNK]. 0: words.  [default: 0]")
@click.option("--subword-corpus", nargs=2, type=click.Path(exists=True, dir_okay=False), metavar="SRC TGT",
              help="Tokenized source and target text to learn the units on [the table's distinct phrases].")
@click.option("--recipe", default="fast", show_default=True, type=click.Choice(["fast", "paper"]),
              help="paper: Cho et al.'s training exactly (64 pairs, Adadelta, full softmax, float32). fast: 128 "
                   "equal-length pairs, Adam, sampled softmax, --dtype auto (see README).")
@click.option("--max-steps", type=click.IntRange(min=0),
              help="Stop after this many updates in all. The budget is what you give: --max-steps, --max-minutes "
                   "or both (the first reached stops); there is no default limit.")
@click.option("--max-minutes", type=Number(min=0), help="Stop after this much wall-clock time in all (a resumed run gets what is left).")
@click.option("--batch-size", type=click.IntRange(min=1), help="Pairs per update [recipe's: fast 128, paper 64].")
@click.option("--optimizer", type=click.Choice(["adam", "adadelta"]), help="[recipe's: fast adam, paper adadelta].")
@click.option("--lr", type=Number(min=0), help="Learning rate [recipe's: fast (adam) 2e-3, paper (adadelta) 1.0].")
@LR_SCHEDULE
@click.option("--sampled-softmax", type=click.IntRange(min=0),
              help="Softmax candidates per batch during training, 0 for the full shortlist [fast 2048, paper 0].")
@click.option("--bucket/--no-bucket", default=None, help="Batches of equal-length pairs [fast: on, paper: off].")
@click.option("--dtype", type=click.Choice(["auto", "bf16", "fp32"]),
              help="auto: on a CPU with native bfloat16, the faster of bfloat16 autocast and float32 on the run's "
                   "first batch; on a GPU, bfloat16 where native [fast auto, paper fp32].")
@click.option("--valid-pairs", type=click.IntRange(min=0), default=1000, show_default=True,
              help="Held-out pairs for perplexity.")
@click.option("--eval-every", type=click.IntRange(min=1), default=500, show_default=True,
              help="Steps between held-out evaluations and checkpoints.")
@click.option("--clip", type=Number(min=0), help="Gradient-norm clipping threshold, 0 for none [fast 1.0, paper 0].")
@click.option("--seed", type=SEED, default=1, show_default=True)
@click.option("--device", default="auto", show_default=True, callback=check_device,
              help="auto, cpu, cuda or cuda:N (torchrun: cuda:LOCAL_RANK).")
@click.option("--threads", type=THREADS, help="CPU threads [tuned while training; 1 for models smaller than `small`].")
@click.option("--resume", is_flag=True, help="Continue from MODEL_DIR/checkpoint.pt: on the same TABLE (or --corpus), "
              "with the options it was started with (only --max-steps, --max-minutes, --device, --threads, --dtype "
              "may change).")
@OVERWRITE
@click.option("--quiet", is_flag=True, help="No progress bar.")
@fail_cleanly
def train(table, corpus, max_len, model_dir, preset, arch, src_vocab, tgt_vocab, subwords, subword_corpus, recipe, max_steps, max_minutes, batch_size, optimizer,
          lr, lr_schedule, sampled_softmax, bucket, dtype, valid_pairs, eval_every, clip, seed, device, threads, resume,
          overwrite, quiet):
    """Train on the unique phrase pairs of a Moses phrase table TABLE, or on the sentence pairs of a
    parallel corpus (--corpus SRC TGT).

    Data-parallel on several processes or machines with torchrun, e.g.
    `torchrun --nproc-per-node 2 $(which moses-rnn) train TABLE -o MODEL`.
    """
    from .training.train import TrainConfig, train as run_train

    cfg = TrainConfig(preset=preset, recipe=recipe, src_vocab=src_vocab, tgt_vocab=tgt_vocab, batch_size=batch_size,
                      optimizer=optimizer, lr=lr, lr_schedule=lr_schedule, sampled_softmax=sampled_softmax, bucket=bucket, dtype=dtype,
                      max_steps=max_steps, max_minutes=max_minutes, clip=clip, seed=seed,
                      valid_pairs=valid_pairs, eval_every=eval_every, device=device, threads=threads,
                      arch=arch, subwords=subwords, subword_corpus=tuple(subword_corpus) if subword_corpus else None,
                      corpus=tuple(corpus) if corpus else None, max_len=max_len)
    summary = run_train(table, model_dir, cfg, resume=resume, progress=not quiet, given=explicit_options(),
                        overwrite=overwrite)
    if summary["rank"] == 0:
        click.echo(json.dumps(summary, indent=2), err=True)


@main.command()
@click.argument("table", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("-m", "--model-dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--output", help="Output table ('-' for stdout) [TABLE with .rnn before .gz].")
@click.option("--normalize", is_flag=True, help="Divide log p by the number of target symbols (units + </s>; units are words, or subword units).")
@click.option("--unknown/--no-unknown", default=False, show_default=True,
              help="Also append the count of words outside the shortlists (word-penalty feature).")
@click.option("--device", default="auto", show_default=True, callback=check_device,
              help="auto, cpu, cuda or cuda:N (torchrun: cuda:LOCAL_RANK).")
@click.option("--dtype", default="fp32", show_default=True, type=click.Choice(["fp32", "bf16", "auto"]),
              help="fp32: exact. bf16: bfloat16 matrix products (GPUs, CPUs with AVX-512 BF16 or AMX; an error "
                   "elsewhere), log p within a few hundredths, see docs/scoring.md. auto: on a CPU with native "
                   "bfloat16, the faster of the two on the table's first pairs; on a GPU, bf16 where native.")
@click.option("--threads", type=THREADS, help="CPU threads [all cores, shared by torchrun's local processes; "
                                          "1 for models smaller than `small`].")
@click.option("--workers", type=click.IntRange(min=1),
              help="Scoring processes [all cores for models smaller than `small` on CPU and tables over 8 MB; else 1].")
@click.option("--window", type=click.IntRange(min=1), default=8192, show_default=True,
              help="Lines read and scored together.")
@click.option("--token-budget", type=click.IntRange(min=1), default=16384, show_default=True,
              help="Source words per encoder batch.")
@click.option("--max-phrase-words", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Longest phrase scored, in words: a longer one is an error naming its line (time and memory "
                   "grow with a phrase's length; Moses's phrases have up to 7 words by default).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@fail_cleanly
def score(table, model_dir, output, normalize, unknown, device, dtype, threads, workers, window, token_budget,
          max_phrase_words, quiet):
    """Append log p(target | source) (as e^value, see README) to every line of TABLE.

    Sharded over processes or machines with torchrun, e.g.
    `torchrun --nproc-per-node 2 $(which moses-rnn) score TABLE -m MODEL -o OUT` (docs/scoring.md).
    """
    from mtcommon.runtime import Distributed
    from .scoring.table import score_table, setup_scoring, workers_warning

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


@main.group()
def ini():
    """Edit moses.ini files: add phrase-table columns and feature functions."""


def _ini_edit(moses_ini, output, edit):
    from .formats.mosesini import IniError, MosesIni

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
@click.option("--table-has-columns", is_flag=True,
              help="Without --path: the table already has the new columns; do not read its first line to check.")
@click.option("-o", "--output", required=True, help="Output moses.ini ('-' for stdout).")
@fail_cleanly
def ini_add_columns(moses_ini, table, count, weight, table_path, fixed, table_has_columns, output):
    """Declare new score columns on a phrase table of MOSES_INI (num-features and weights).

    Without --path the table keeps its file, which must already have the new columns: its first
    line is checked (relative paths from the current folder, as Moses reads them)."""
    _ini_edit(moses_ini, output, lambda cfg: cfg.add_columns(table, count, list(weight) or 0.2, path=table_path,
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


def _sources(phrases, input_file) -> list[str]:
    from .generation.generate import read_sources

    if bool(phrases) == bool(input_file):
        raise click.UsageError("give source phrases as arguments or with -i FILE (one of the two)")
    return list(phrases) if phrases else read_sources(input_file)


def _generator(model_dir, device):
    from mtcommon.runtime import resolve_device
    from .generation.generate import Generator
    from .networks.modelio import load_model

    require_model_dir(model_dir, "moses-rnn")
    return Generator(load_model(model_dir, resolve_device(device)))


def _in_batches(items, size, quiet, desc):
    from tqdm import tqdm

    with tqdm(total=len(items), unit=" phrases", disable=quiet or len(items) <= size, desc=desc) as bar:
        for i in range(0, len(items), size):
            yield items[i : i + size]
            bar.update(len(items[i : i + size]))


_generation_options = [
    click.option("-m", "--model-dir", required=True, type=click.Path(exists=True, file_okay=False)),
    click.option("-i", "--input", "input_file", type=click.Path(dir_okay=False, allow_dash=True),
                 help="File of source phrases, one per line ('-' for stdin)."),
    click.option("-o", "--output", default="-", show_default=True, help="Output file ('-' for stdout)."),
    click.option("--len-ratio", type=Number(min=0), default=2.0, show_default=True,
                 help="Longest target: LEN_RATIO x source words + LEN_EXTRA."),
    click.option("--len-extra", type=click.IntRange(min=0), default=3, show_default=True,
                 help="Target words allowed beyond LEN_RATIO x source words."),
    click.option("--no-unk", is_flag=True, help="Never generate the unknown-word symbol."),
    click.option("--batch", type=click.IntRange(min=1), default=64, show_default=True,
                 help="Source phrases decoded together."),
    click.option("--device", default="auto", show_default=True, callback=check_device,
                 help="auto, cpu, cuda or cuda:N."),
    click.option("--quiet", is_flag=True, help="No progress bar."),
]


def _with_generation_options(fn):
    for opt in reversed(_generation_options):
        fn = opt(fn)
    return fn


@main.command()
@click.argument("phrases", nargs=-1)
@_with_generation_options
@click.option("-n", "--samples", default=50, show_default=True, help="Samples drawn per source phrase.")
@click.option("--top", type=click.IntRange(min=0), default=5, show_default=True,
              help="Distinct targets listed per phrase (0: all).")
@click.option("--seed", type=SEED, default=1, show_default=True)
@click.option("--tsv", is_flag=True, help="Tab-separated source, target, count, log p.")
@fail_cleanly
def sample(phrases, model_dir, input_file, output, len_ratio, len_extra, no_unk, batch, device, quiet,
           samples, top, seed, tsv):
    """Draw N samples for each source phrase; list the distinct targets by model score, with counts."""
    from mtcommon.textio import atomic_output

    check_paths([input_file], output)
    sources = _sources(phrases, input_file)
    gen = _generator(model_dir, device)
    with atomic_output(output) as out:
        for part in _in_batches(sources, batch, quiet, "sampling"):
            results = gen.sample(part, n=samples, seed=seed, len_ratio=len_ratio, len_extra=len_extra,
                                 allow_unk=not no_unk)
            lines = []
            for src, hyps in zip(part, results):
                hyps = hyps[:top] if top > 0 else hyps
                if tsv:
                    lines += [f"{src}\t{h.text}\t{h.count}\t{h.log_prob:.4f}\n" for h in hyps]
                else:
                    lines.append(f"{src}\n")
                    lines += [f"  {h.count:5d}  {h.log_prob:9.3f}  {h.text}\n" for h in hyps]
            out.write("".join(lines).encode("utf-8"))


@main.command()
@click.argument("phrases", nargs=-1)
@_with_generation_options
@click.option("-k", "--beam", default=5, show_default=True, help="Beam width.")
@click.option("--n-best", default=1, show_default=True,
              help="Targets per phrase; above 1 the output is 'index ||| target ||| score' lines.")
@click.option("--normalize", is_flag=True, help="Rank by log p per target symbol (units + </s>).")
@click.option("--replace-unk", is_flag=True,
              help="Replace each [UNK] of a translation by the source word its attention weighs most (RNNsearch).")
@fail_cleanly
def translate(phrases, model_dir, input_file, output, len_ratio, len_extra, no_unk, batch, device, quiet,
              beam, n_best, normalize, replace_unk):
    """Beam-search the best target of each source phrase or sentence: one line out per line in, in order
    (an empty line gives an empty line); streamed, so a file of any size works."""
    from .generation.translate import read_lines, translate_lines

    if bool(phrases) == bool(input_file):
        raise click.UsageError("give source phrases as arguments or with -i FILE (one of the two)")
    if not 1 <= n_best <= beam:
        raise click.BadParameter(f"must be between 1 and the beam ({beam})", param_hint="--n-best")
    check_paths([input_file], output)
    gen = _generator(model_dir, device)
    stats = translate_lines(gen, phrases or read_lines(input_file), output, beam=beam, n_best=n_best,
                            normalize=normalize, allow_unk=not no_unk, replace_unk=replace_unk, batch=batch,
                            len_ratio=len_ratio, len_extra=len_extra, progress=not quiet)
    if not quiet:
        rate = stats.translated / max(stats.seconds, 1e-9)
        click.echo(f"{stats.lines} lines ({stats.translated} translated, {rate:.1f}/s)"
                   + (f", {stats.unknown_replaced} [UNK] replaced" if replace_unk else ""), err=True)


@main.command()
@click.argument("table", type=click.Path(dir_okay=False))
@click.option("-m", "--model-dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--output", required=True, help="The augmented table (.gz: compressed).")
@click.option("--input", "input_file", type=click.Path(dir_okay=False),
              help="Tokenized text: its n-grams the table lacks become new sources.")
@click.option("-k", "--beam", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--per-source", type=click.IntRange(min=1), default=3, show_default=True,
              help="New targets per source, at most.")
@click.option("--few", type=click.IntRange(min=0), default=1, show_default=True,
              help="Sources with at most this many targets get new ones (0: none).")
@click.option("--max-new", type=click.IntRange(min=0), help="Lines added, at most.")
@click.option("--max-growth", type=Number(min=0), help="Lines added, at most this fraction of TABLE's (0.2: 20%).")
@click.option("--max-ngram", type=click.IntRange(min=1), default=3, show_default=True,
              help="With --input: the longest n-gram made a new source.")
@click.option("--alignment", type=click.Choice(["lexical", "attention"]), default="lexical", show_default=True,
              help="The added lines' word alignment: from lex.f2e, or from an RNNsearch model's attention.")
@click.option("--lex-f2e", type=click.Path(exists=True, dir_okay=False), help="[lex.f2e beside TABLE]")
@click.option("--lex-e2f", type=click.Path(exists=True, dir_okay=False), help="[lex.e2f beside TABLE]")
@click.option("--device", default="auto", show_default=True, callback=check_device)
@click.option("--quiet", is_flag=True, help="No progress bar.")
@fail_cleanly
def augment(table, model_dir, output, input_file, beam, per_source, few, max_new, max_growth, max_ngram, alignment,
            lex_f2e, lex_e2f, device, quiet):
    """Add target phrases generated by the network to a Moses phrase table TABLE (4 scores, sorted as
    train-model.perl writes it); every line gets a 5th score, the generated-line indicator."""
    from .formats.lexical import LexicalTable
    from .generation.augment import AugmentConfig, augment_table

    check_paths([table, input_file, lex_f2e, lex_e2f], output)
    lex = []
    for given, name in ((lex_f2e, "lex.f2e"), (lex_e2f, "lex.e2f")):
        path = given or os.path.join(os.path.dirname(os.path.abspath(table)), name)
        if not os.path.exists(path):
            raise click.ClickException(f"{path}: no such file (train-model.perl's {name}; give --{name.replace('.', '-')})")
        lex.append(LexicalTable.load(path))
    cfg = AugmentConfig(beam=beam, per_source=per_source, few=few, max_new=max_new, max_growth=max_growth, input=input_file,
                        max_ngram=max_ngram, alignment=alignment)
    gen = _generator(model_dir, device)
    stats = augment_table(table, gen, lex[0], lex[1], output, cfg, progress=not quiet)
    click.echo(f"{stats.lines} lines, {stats.added} added ({stats.added / max(stats.lines, 1):.1%}): "
               f"{stats.sources_extended} sources extended, {stats.sources_new} new of {stats.candidates} "
               f"input n-grams missing -> {output}", err=True)


@main.command("rescore-nbest")
@click.argument("nbest", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("-m", "--model-dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--source", required=True, type=click.Path(dir_okay=False, allow_dash=True),
              help="The tokenized source sentences the list translates, one a line (ids count from 0).")
@click.option("-o", "--output", required=True, help="Rescored n-best list ('-' for stdout).")
@click.option("--feature", default="RNN0", show_default=True, callback=feature_name,
              help="The feature's name in the list: letters, digits, '-' and '.', starting with a letter.")
@click.option("--unknown", is_flag=True, help="Also the count of units outside the model's vocabularies.")
@click.option("--device", default="auto", show_default=True, callback=check_device)
@click.option("--dtype", default="fp32", show_default=True, type=click.Choice(["fp32", "bf16", "auto"]))
@click.option("--threads", type=THREADS, help="CPU threads [by the model's size].")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@fail_cleanly
def rescore_nbest(nbest, model_dir, source, output, feature, unknown, device, dtype, threads, quiet):
    """Add `FEATURE= <log p(hypothesis | source)>` to every hypothesis of a Moses n-best list NBEST."""
    from mtcommon.runtime import configure_threads
    from .scoring.nbest import rescore_nbest as run
    from .scoring.scorer import PhraseScorer

    check_paths([nbest, source], output)
    require_model_dir(model_dir, "moses-rnn")
    scorer = PhraseScorer.from_dir(model_dir, device=device, dtype=dtype)
    configure_threads(scorer.device, threads, scorer.model.config)
    stats = run(scorer, source, nbest, output, feature=feature, unknown=unknown, progress=not quiet)
    if not quiet:
        click.echo(f"{stats.hypotheses} hypotheses of {stats.sentences} sentences -> {output}", err=True)


@main.command()
@click.argument("source", required=False)
@click.argument("target", required=False)
@click.option("-m", "--model-dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--output", required=True, help="PNG file.")
@click.option("-i", "--input", "input_file", type=click.Path(exists=True, dir_okay=False),
              help="Source sentences, one a line, instead of SOURCE: several alignments in one picture.")
@click.option("--targets", type=click.Path(exists=True, dir_okay=False),
              help="With --input: target sentences line by line with it (e.g. the reference) [the model's translations].")
@click.option("--lines", help="With --input: 1-based line numbers, comma-separated [the first 4 of 10-20 words].")
@click.option("-k", "--beam", default=5, show_default=True, help="Beam width when no target is given.")
@click.option("--device", default="auto", show_default=True, callback=check_device)
@fail_cleanly
def align(source, target, model_dir, output, input_file, targets, lines, beam, device):
    """Draw the soft alignment of an RNNsearch model for SOURCE and TARGET (or its translation) as PNG,
    or for several lines of a file (--input) in one picture (Bahdanau et al., Figure 3)."""
    from mtcommon.runtime import resolve_device
    from mtcommon.textio import iter_lines
    from .analysis.align import draw_alignment, draw_alignments, pick_lines, soft_alignment
    from .networks.modelio import load_model

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


@main.group()
def analyze():
    """The paper's analysis: Table 2 and Figures 3-5; training curves."""


_column_options = [
    click.option("--tm-column", default=2, show_default=True,
                 help="0-based score column of p(target | source) (Moses order: 2)."),
    click.option("--rnn-column", type=int, help="0-based score column of the RNN [found by itself: the last, or "
                 "the one before the unknown-word count of `score --unknown`; refused when it cannot tell]."),
]


def _with_columns(fn):
    for opt in reversed(_column_options):
        fn = opt(fn)
    return fn


@analyze.command("table2")
@click.argument("table", type=click.Path(dir_okay=False, allow_dash=True))
@_with_columns
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
    from mtcommon.textio import atomic_output
    from .analysis.analyze import table2

    t = table2(table, tm_column, rnn_column, min_words, per_group, top, rare_max, min_targets, seed)
    with atomic_output(output, inputs=[table]) as out:
        out.write(t.markdown().encode("utf-8"))
    click.echo(f"{t.long_sources} source phrases of {min_words}+ words; "
               f"{len(t.frequent)} frequent and {len(t.rare)} rare listed", err=True)


@analyze.command("curves")
@click.argument("model_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--output", required=True, help="PNG file.")
@click.option("--label", "labels", multiple=True, help="One label per MODEL_DIR [the folder names].")
@click.option("--title", default="Held-out perplexity", show_default=True)
@click.option("--reference", type=(str, float), help="A horizontal line: LABEL PERPLEXITY (e.g. KenLM 5-gram 129.0).")
@click.option("--x", "x", type=click.Choice(["minutes", "updates"]), default="minutes", show_default=True,
              help="The horizontal axis: training minutes or updates.")
@fail_cleanly
def analyze_curves(model_dirs, output, labels, title, reference, x):
    """Training curves: held-out perplexity against training time of MODEL_DIRS (either network)."""
    from .analysis.analyze import training_curves, training_history

    if labels and len(labels) != len(model_dirs):
        raise click.UsageError(f"{len(labels)} --label for {len(model_dirs)} model directories")
    names = labels or [os.path.basename(os.path.normpath(d)) for d in model_dirs]
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
@click.option("--seed", type=SEED, default=1, show_default=True)
@fail_cleanly
def analyze_columns(tables, output, labels, tm_column, min_words, examples, seed):
    """Compare the RNN columns of TABLES: one phrase table scored by different models, the word-level
    RNN's first (with --unknown, which marks its shortlist misses). Pearson r with p(e|f), the
    sources whose best target differs, and Table 2-style examples, as Markdown."""
    from mtcommon.textio import atomic_output

    from .analysis.columns import compare_columns

    if len(tables) < 2:
        raise click.UsageError("give two or more scored tables")
    if labels and len(labels) != len(tables):
        raise click.UsageError(f"{len(labels)} --label for {len(tables)} tables")
    names = labels or [os.path.basename(t) for t in tables]
    result = compare_columns(tables, names, tm_column, min_words, examples, seed=seed)
    text = result.markdown(min_words).encode("utf-8")
    if output == "-":
        click.get_binary_stream("stdout").write(text)
    else:
        with atomic_output(output, compress=False, inputs=tables) as out:
            out.write(text)
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
    import json

    from mtcommon.textio import atomic_output

    from .analysis.augmented import usage

    u = usage(table, trace, source)
    text = (json.dumps(u.as_dict(examples), indent=1, ensure_ascii=False) + "\n").encode("utf-8")
    if output == "-":
        click.get_binary_stream("stdout").write(text)
    else:
        with atomic_output(output, compress=False, inputs=[table, trace, source]) as out:
            out.write(text)
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
@click.option("--device", default="cpu", show_default=True, callback=check_device, help="auto, cpu, cuda or cuda:N.")
@fail_cleanly
def analyze_learning(model_dirs, output, labels, dev, sample, seed, device):
    """Learning statistics of trained networks (Bahdanau et al., Table 2): updates, epochs, hours and
    device of the saved model; NLL per sentence pair on training pairs, the held-out pairs and --dev."""
    import json

    from mtcommon.textio import atomic_output

    from .analysis.learning import learning_stats, markdown

    if labels and len(labels) != len(model_dirs):
        raise click.UsageError(f"{len(labels)} --label for {len(model_dirs)} model directories")
    names = labels or [os.path.basename(os.path.normpath(d)) for d in model_dirs]
    rows = [(n, learning_stats(d, dev, sample, seed, device).as_json()) for n, d in zip(names, model_dirs)]
    if output.endswith(".json"):
        text = json.dumps([{"label": n, **r} for n, r in rows], indent=1) + "\n"
    else:
        text = markdown(rows)
    if output == "-":
        click.echo(text, nl=False)
    else:
        with atomic_output(output, compress=False) as out:
            out.write(text.encode("utf-8"))


@analyze.command("scatter")
@click.argument("table", type=click.Path(dir_okay=False, allow_dash=True))
@_with_columns
@click.option("-o", "--output", required=True, help="PNG file.")
@click.option("--max-points", type=click.IntRange(min=1), default=50000, show_default=True,
              help="Pairs drawn (a uniform sample).")
@click.option("--seed", type=SEED, default=1, show_default=True)
@fail_cleanly
def analyze_scatter(table, tm_column, rnn_column, output, max_points, seed):
    """Figure 3: RNN log p against translation-model log p for the pairs of a scored TABLE."""
    from .analysis.analyze import score_scatter

    r = score_scatter(table, output, tm_column, rnn_column, max_points, seed)
    click.echo(f"{r['points']} of {r['pairs']} pairs, Pearson r = {r['pearson']:.3f} -> {output}", err=True)


@analyze.command("words")
@click.option("-m", "--model-dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--output", required=True, help="PNG file.")
@click.option("--words", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Most frequent shortlist words mapped.")
@click.option("--labels", type=click.IntRange(min=0), default=150, show_default=True,
              help="Most labels drawn (never overlapping).")
@click.option("--side", default="source", show_default=True, type=click.Choice(["source", "target"]))
@click.option("--vectors", help="Also write VECTORS.vectors.tsv and VECTORS.labels.tsv.")
@click.option("--seed", type=SEED, default=1, show_default=True)
@fail_cleanly
def analyze_words(model_dir, output, words, labels, side, vectors, seed):
    """Figure 4: a 2-D t-SNE map of the model's word embeddings."""
    from .analysis.analyze import embedding_map
    from .networks.modelio import load_model

    r = embedding_map(load_model(model_dir), output, words, labels, side, vectors, seed)
    click.echo(f"{r.points} words, {r.labels} labelled -> {output}", err=True)


@analyze.command("phrases")
@click.argument("table", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("-m", "--model-dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--output", required=True, help="PNG file.")
@click.option("--phrases", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Most frequent long source phrases mapped.")
@click.option("--labels", type=click.IntRange(min=0), default=60, show_default=True,
              help="Most labels drawn (never overlapping).")
@click.option("--min-words", default=4, show_default=True)
@click.option("--vectors", help="Also write VECTORS.vectors.tsv and VECTORS.labels.tsv.")
@click.option("--seed", type=SEED, default=1, show_default=True)
@fail_cleanly
def analyze_phrases(table, model_dir, output, phrases, labels, min_words, vectors, seed):
    """Figure 5: a 2-D t-SNE map of the representations of TABLE's long source phrases."""
    from .analysis.analyze import phrase_map
    from .networks.modelio import load_model

    r = phrase_map(load_model(model_dir), table, output, phrases, labels, min_words, vectors, seed)
    click.echo(f"{r.points} phrases, {r.labels} labelled -> {output}", err=True)


if __name__ == "__main__":
    main()
