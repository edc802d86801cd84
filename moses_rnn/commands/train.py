"""`moses-rnn train`: a phrase model trained on a phrase table or a parallel corpus."""

from __future__ import annotations

import json

import click

from mtcommon.cliutil import LR_SCHEDULE, Number, explicit_options, fail_cleanly, trainer_options
from mtcommon.vocab import RESERVED

from ..networks import ARCHS, PRESET_NAMES


@click.command()
@click.argument("table", required=False, type=click.Path(dir_okay=False))
@click.option("--corpus", nargs=2, type=click.Path(exists=True, dir_okay=False), metavar="SRC TGT",
              help="Train on the sentence pairs of a tokenized parallel corpus (one sentence a line) instead of "
                   "a phrase table's unique phrase pairs.")
@click.option("--max-len", type=click.IntRange(min=0), default=0,
              help="With --corpus: leave out pairs with more words than this on a side (the paper: 30, 50); "
                   "0: no limit.  [default: 0]")
@click.option("-o", "--model-dir", required=True, type=click.Path(file_okay=False), help="Where the model goes.")
@click.option("--preset", default="small", show_default=True, type=click.Choice(PRESET_NAMES))
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
                   "equal-length pairs, Adam, sampled softmax, --dtype auto (docs/training.md, Precision).")
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
@trainer_options(data="TABLE (or --corpus)", budget="--max-steps",
                 threads="tuned while training; 1 for models smaller than `small`")
@fail_cleanly
def train(table, corpus, max_len, model_dir, preset, arch, src_vocab, tgt_vocab, subwords, subword_corpus, recipe, max_steps, max_minutes, batch_size, optimizer,
          lr, lr_schedule, sampled_softmax, bucket, dtype, valid_pairs, eval_every, clip, seed, device, threads, resume,
          overwrite, quiet):
    """Train on the unique phrase pairs of a Moses phrase table TABLE, or on the sentence pairs of a
    parallel corpus (--corpus SRC TGT).

    Data-parallel on several processes or machines with torchrun, e.g.
    `torchrun --nproc-per-node 2 $(which moses-rnn) train TABLE -o MODEL`.
    """
    from ..training.train import TrainConfig, train as run_train

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
