"""The `cslm` command line: a thin layer over the library (cslm.train, cslm.engine, cslm.apply, cslm.server)."""

from __future__ import annotations

import json
import signal
import sys

import click

from mtcommon import __version__
from mtcommon.cliutil import (DEVICE, LR_SCHEDULE, QUIET, THREADS, Number, OneLineGroup, RegistryChoice,
                              explicit_options, fail_cleanly, feature_name, require_model_dir, stacked,
                              trainer_options)
from mtcommon.outputs import check_paths

from .data import RESERVED
from .limits import MAX_DELAY_US


def _threads(n):
    """The project's one thread policy (mtcommon.runtime): N threads if given, else OMP_NUM_THREADS, else all cores."""
    from mtcommon.runtime import configure_threads, resolve_device

    configure_threads(resolve_device("cpu"), n)


# a joint model's source side (`eval`, `score`): the source text and the word alignment of TEXT
SOURCE_OPTION = click.option("--source", type=click.Path(dir_okay=False),
                             help="A joint model's source text: tokenized, one sentence per line of TEXT.")
ALIGNMENT_OPTION = click.option("--alignment", type=click.Path(dir_okay=False),
                                help="The word alignment of --source and TEXT, one line each: Moses's `i-j` pairs "
                                     "(source index i, target index j, from 0), as aligned.grow-diag-final-and.")
# What the commands that score a text with a model in this process take last: a joint model's source
# side, where the engine runs, and the progress bar.
TEXT_SCORING_OPTIONS = stacked([SOURCE_OPTION, ALIGNMENT_OPTION, DEVICE, click.option("--threads", type=THREADS), QUIET])


def _source_options(source, alignment, server) -> None:
    """Before any model is loaded or server asked: --source and --alignment together, and in process."""
    if (source is None) != (alignment is None):
        raise click.UsageError("--source and --alignment go together: give both")
    _in_process(source is not None, server, "--source and --alignment are")


def _in_process(given: bool, server, options: str) -> None:
    """A joint model's source side (`options`, when `given`) is not for --server: it scores in process."""
    if server and given:
        raise click.UsageError(f"a joint model scores in process: {options} not for --server")


def _check_joint(backend, given: bool) -> None:
    """A joint model's source side given exactly when the model is a joint one."""
    engine = getattr(backend, "inner", backend)  # the network's engine under --mix
    if hasattr(engine, "check_source"):
        engine.check_source(given)


# `score` and `rescore-nbest`: their numbers become the mixture's (cslm.mix)
MIX_OPTION = click.option("--mix", type=Number(min=0, max=1), metavar="LAMBDA",
                          help="Interpolate with the --kenlm model, LAMBDA on the network (`cslm mix` estimates it).")


def _backend(model_dir, server, kenlm, device, self_normalized=False, mix=None):
    """The in-process engine, or a connection to a running server; with `mix`, either interpolated with the
    --kenlm model (cslm.mix: the network in unk mode, the n-gram model read here)."""
    if mix is not None:
        from .engine import KenLMBackoff
        from .mix import MixedBackend

        if not kenlm:
            raise click.UsageError("--mix needs --kenlm (the n-gram model to interpolate with)")
        return MixedBackend(_backend(model_dir, server, None, device, self_normalized), KenLMBackoff(kenlm), mix)
    if model_dir:
        require_model_dir(model_dir, "cslm")
    if server:
        from .client import RemoteBackend, connect

        if kenlm:
            raise click.UsageError("--kenlm belongs to the server (cslm serve --kenlm) when --server is used")
        if self_normalized:
            raise click.UsageError("--self-normalized belongs to the server (cslm serve --self-normalized) "
                                   "when --server is used")
        return RemoteBackend(connect(server, model_dir))
    if not model_dir:
        raise click.UsageError("give MODEL_DIR or --server HOST:PORT")
    return _engine(model_dir, device, kenlm, self_normalized)


def _engine(model_dir, device, kenlm, self_normalized=False):
    """Engine.load; with self_normalized, a one-line warning on stderr if the model was not trained for it."""
    from .engine import Engine

    engine = Engine.load(model_dir, device=device, kenlm=kenlm, normalized=not self_normalized)
    warning = engine.self_norm_warning(model_dir)
    if warning:
        click.echo(warning, err=True)
    return engine


def _presets():
    from .model import PRESETS  # torch: loaded only when a command needs the names

    return PRESETS


@click.group(cls=OneLineGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cslm")
def main():
    """Continuous-space 7-gram language model (Schwenk, 2007; Cho et al., 2014): train, score, serve."""


@main.command()
@click.argument("corpus", type=click.Path(dir_okay=False, allow_dash=False))
@click.option("-o", "--model-dir", required=True, type=click.Path(file_okay=False), help="Where the model goes.")
@click.option("--preset", default="small", show_default=True, type=RegistryChoice(_presets))
@click.option("--vocab-size", type=click.IntRange(min=len(RESERVED) + 1), help="Shortlist size, reserved symbols included [paper 15000, small 10000, tiny 1000].")
@click.option("--order", type=click.IntRange(min=2, max=64),
              help="n: n-1 target words predict the n-th [the preset's 7; a joint model's 4, as Devlin et al.].")
@click.option("--source", type=click.Path(exists=True, dir_okay=False),
              help="Train a joint model (NNJM, Devlin et al. 2014): the source text, one sentence per line of CORPUS.")
@click.option("--alignment", type=click.Path(exists=True, dir_okay=False),
              help="With --source: the word alignment of --source and CORPUS, Moses's `i-j` pairs per line "
                   "(aligned.grow-diag-final-and).")
@click.option("--source-window", type=click.IntRange(min=1),
              help="With --source: m source words around the affiliated one, odd [11, as Devlin et al.].")
@click.option("--source-vocab-size", type=click.IntRange(min=len(RESERVED) + 1),
              help="With --source: the source shortlist, reserved symbols included [the target's size].")
@click.option("--max-epochs", type=click.IntRange(min=0), default=100, show_default=True)
@click.option("--max-minutes", type=Number(min=0), help="Stop after this much wall-clock time in all (a resumed run gets what is left).")
@click.option("--patience", type=click.IntRange(min=0), default=10, show_default=True,
              help="Stop after this many epochs without held-out improvement.")
@click.option("--valid-fraction", type=Number(min=0, max=1), default=0.001, show_default=True,
              help="Share of sentences held out.")
@click.option("--valid-text", type=click.Path(exists=True, dir_okay=False),
              help="Measure held-out perplexity (early stopping, the best weights) on this tokenized text instead of "
                   "the held-out sentences: text of the test's domain, such as the tuning set.")
@click.option("--epoch-ngrams", type=click.IntRange(min=1), help="N-grams per epoch [one pass over the corpus].")
@click.option("--recipe", default="fast", show_default=True, type=click.Choice(["fast", "paper"]),
              help="paper: 256 n-grams per update, float32. fast: 1,024 n-grams, --dtype auto (docs/training.md, Precision).")
@click.option("--batch-size", type=click.IntRange(min=1), help="N-grams per update [fast 1024, paper 256].")
@click.option("--dtype", type=click.Choice(["auto", "bf16", "fp32"]),
              help="auto: on a CPU with native bfloat16, the faster of bfloat16 autocast and float32 on the run's "
                   "first batch; on a GPU, bfloat16 where native [fast auto, paper fp32].")
@click.option("--optimizer", default="adam", show_default=True, type=click.Choice(["adam", "sgd"]))
@click.option("--lr", type=Number(min=0), help="Learning rate [adam 1e-3, sgd 0.05].")
@LR_SCHEDULE
@click.option("--dropout", type=Number(min=0, max=0.99), default=0.0, show_default=True,
              help="Dropout after each rectified layer while training (not in the paper).")
@click.option("--self-norm", type=Number(min=0), default=0.0, show_default=True,
              help="Weight alpha of the alpha*(log Z)^2 self-normalisation penalty (Devlin et al., 2014).")
@click.option("--objective", default="softmax", show_default=True, type=click.Choice(["softmax", "nce"]),
              help="softmax: the paper's cross-entropy over the shortlist. nce: noise-contrastive estimation "
                   "(Mnih & Teh 2012, as NPLM trains): k+1 output rows an n-gram, self-normalised by construction.")
@click.option("--noise-samples", type=click.IntRange(min=1), default=100, show_default=True,
              help="k: noise words per update with --objective nce, at most the shortlist's size.")
@trainer_options(data="CORPUS", budget="--max-epochs")
@fail_cleanly
def train(corpus, model_dir, preset, vocab_size, order, source, alignment, source_window, source_vocab_size, max_epochs, max_minutes, patience, valid_fraction, valid_text, epoch_ngrams,
          recipe, batch_size, dtype, optimizer, lr, lr_schedule, dropout, self_norm, objective, noise_samples, seed, device, threads, resume,
          overwrite, quiet):
    """Train on CORPUS: tokenized text, one sentence per line, plain or gzip.

    With --source and --alignment, a joint model (NNJM): CORPUS is the target side of a parallel corpus.

    Data-parallel with torchrun: `torchrun --nproc-per-node 2 $(which cslm) train CORPUS -o MODEL`.
    """
    from .train import TrainConfig, train as run_train

    cfg = TrainConfig(preset=preset, recipe=recipe, vocab_size=vocab_size, order=order, source=source,
                      alignment=alignment, source_window=source_window, source_vocab_size=source_vocab_size,
                      batch_size=batch_size, dtype=dtype,
                      optimizer=optimizer, lr=lr, lr_schedule=lr_schedule, dropout=dropout, self_norm=self_norm, objective=objective,
                      noise_samples=noise_samples, valid_fraction=valid_fraction, valid_text=valid_text,
                      patience=patience, max_epochs=max_epochs, max_minutes=max_minutes, epoch_ngrams=epoch_ngrams,
                      seed=seed, device=device, threads=threads)
    summary = run_train(corpus, model_dir, cfg, resume=resume, progress=not quiet, given=explicit_options(),
                        overwrite=overwrite)
    if summary["rank"] == 0:
        click.echo(json.dumps(summary, indent=2), err=True)


@main.command("eval")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("text", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--kenlm", type=click.Path(exists=True, dir_okay=False),
              help="Also report this n-gram model's perplexity (ARPA or KenLM binary) on the same tokens.")
@click.option("--backoff", is_flag=True, help="Score unknown words with the --kenlm model (back-off mode).")
@click.option("--mix", type=Number(min=0, max=1), metavar="LAMBDA",
              help="Also report the --kenlm model and the network interpolated, LAMBDA on the network "
                   "(`cslm mix` estimates it).")
@click.option("--log-z", is_flag=True,
              help="Also report ln Z(h) over the text's n-grams (mean, sd, percentiles, mean |ln Z|) and the "
                   "perplexity of the unnormalised scores o_w used as log-probabilities (self-normalisation).")
@TEXT_SCORING_OPTIONS
@fail_cleanly
def eval_(model_dir, text, kenlm, backoff, mix, log_z, source, alignment, device, threads, quiet):
    """Per-word perplexity of tokenized TEXT (all words and </s>), beside a KenLM model's.

    A joint model's TEXT comes with its --source and --alignment."""
    from .apply import perplexity
    from .engine import Engine

    if (backoff or mix is not None) and not kenlm:
        raise click.UsageError(f"{'--backoff' if backoff else '--mix'} needs --kenlm")
    if backoff and mix is not None:
        raise click.UsageError("--mix interpolates the network's own [UNK] probabilities: not with --backoff")
    check_paths([text, source, alignment])
    require_model_dir(model_dir, "cslm")
    _threads(threads)
    _source_options(source, alignment, None)
    engine = Engine.load(model_dir, device=device, kenlm=kenlm if backoff else None)
    _check_joint(engine, source is not None)
    res = perplexity(engine, text, kenlm=kenlm, progress=not quiet, log_z=log_z, mix_weight=mix, source=source,
                     alignment=alignment)
    res["mode"] = engine.mode
    if log_z:
        res["train_self_norm"] = engine.train_self_norm
        res["train_self_normalized"] = engine.trained_self_normalized
    click.echo(json.dumps(res, indent=2))


@main.command("mix")
@click.argument("paths", nargs=-1, metavar="[MODEL_DIR] DEV_TEXT")
@click.option("--kenlm", required=True, type=click.Path(exists=True, dir_okay=False),
              help="The n-gram model to interpolate with (ARPA or KenLM binary).")
@click.option("--server", metavar="HOST:PORT", help="Ask a running `cslm serve` (unk mode) instead of loading the model.")
@DEVICE
@click.option("--threads", type=THREADS)
@fail_cleanly
def mix_(paths, kenlm, server, device, threads):
    """The weight LAMBDA of the network interpolated with an n-gram model, estimated on DEV_TEXT.

    Maximum likelihood by EM on the tokens in the shortlist (docs/cslm.md, "Interpolated with KenLM");
    prints it with the perplexities of both models and of the mixture there, as JSON."""
    from .apply import estimate_mix_weight

    model_dir, text = _split_paths(paths, server, "DEV_TEXT")
    _threads(threads)
    backend = _backend(model_dir, server, None, device)
    click.echo(json.dumps(estimate_mix_weight(backend, kenlm, text), indent=2))


def _split_paths(paths, server, what):
    """[MODEL_DIR] INPUT: MODEL_DIR may be left out when --server is given; INPUT defaults to stdin."""
    paths = list(paths)
    if len(paths) > 2:
        raise click.UsageError(f"expected MODEL_DIR {what}")
    if server:
        model_dir, text = (paths[0], paths[1]) if len(paths) == 2 else (None, paths[0] if paths else None)
    elif not paths:
        raise click.UsageError(f"expected MODEL_DIR {what} (or --server HOST:PORT {what})")
    else:
        model_dir, text = paths[0], paths[1] if len(paths) == 2 else None
    if text is None:  # stdin, unless it is a terminal: a forgotten argument would wait there forever
        if sys.stdin.isatty():
            raise click.UsageError(f"no {what} given and stdin is a terminal: give {what}, or pipe it in (or '-')")
        text = "-"
    return model_dir, text


@main.command()
@click.argument("paths", nargs=-1, metavar="[MODEL_DIR] [TEXT]")
@click.option("-o", "--output", default="-", show_default=True, help="Output file ('-' for stdout).")
@click.option("--server", metavar="HOST:PORT", help="Ask a running `cslm serve` instead of loading the model.")
@click.option("--ngrams", is_flag=True, help="Each line is an n-gram (predicted word last), not a sentence.")
@click.option("--per-word", is_flag=True, help="Sentence mode: also print each token's log-probability.")
@click.option("--kenlm", type=click.Path(exists=True, dir_okay=False), help="Back off to this n-gram model for unknown words.")
@MIX_OPTION
@click.option("--self-normalized", is_flag=True,
              help="Unnormalised scores o_w (no softmax; premultiplied first layer): ln P only for a model "
                   "trained with --self-norm. Default: exact log-probabilities.")
@TEXT_SCORING_OPTIONS
@fail_cleanly
def score(paths, output, server, ngrams, per_word, kenlm, mix, self_normalized, source, alignment, device, threads,
          quiet):
    """Natural-log probabilities of the sentences (or n-grams) of TEXT ('-' = stdin).

    Sentence mode prints `<ln P(sentence)>\\t<unknown words>\\t<tokens>` per line;
    n-gram mode prints `<ln P(last word | the others)>\\t<flags>` (flags: 1 unknown, 2 backed off).
    With --server only TEXT is needed: `cslm score --server HOST:PORT TEXT`.
    With --self-normalized the values are the unnormalised scores o_w (see docs/cslm.md).
    A joint model scores sentences with their --source and --alignment.
    """
    from .apply import score_file

    model_dir, text = _split_paths(paths, server, "TEXT")
    check_paths([text, source, alignment], output)
    _threads(threads)
    if ngrams and source is not None:
        raise click.UsageError("--ngrams lines carry no source window: a joint model scores sentences")
    _source_options(source, alignment, server)
    backend = _backend(model_dir, server, kenlm, device, self_normalized, mix)
    _check_joint(backend, source is not None)
    summary = score_file(backend, text, output, ngrams=ngrams, per_word=per_word, progress=not quiet,
                         source=source, alignment=alignment)
    if not quiet:
        click.echo(json.dumps(summary), err=True)


@main.command("rescore-nbest")
@click.argument("paths", nargs=-1, metavar="[MODEL_DIR] NBEST")
@click.option("-o", "--output", required=True, help="Rescored n-best list ('-' for stdout).")
@click.option("--feature", default="CSLM0", show_default=True, callback=feature_name,
              help="Feature name (Moses: NAME= values): letters, digits, '-' and '.', starting with a letter.")
@click.option("--server", metavar="HOST:PORT", help="Ask a running `cslm serve` instead of loading the model.")
@click.option("--kenlm", type=click.Path(exists=True, dir_okay=False), help="Back off to this n-gram model for unknown words.")
@MIX_OPTION
@click.option("--source", type=click.Path(dir_okay=False),
              help="A joint model's source text: line k is the source of the list's sentence k.")
@DEVICE
@click.option("--threads", type=THREADS)
@QUIET
@fail_cleanly
def rescore_nbest(paths, output, feature, server, kenlm, mix, source, device, threads, quiet):
    """Add `FEATURE= <ln P(hypothesis)> <unknown words>` to every hypothesis of a Moses n-best list.

    A joint model reads the --source text and each hypothesis' word alignment (Moses's
    -print-alignment-info-in-n-best); with -include-segmentation-in-n-best too, its scores are the
    decoder's NNJM feature's."""
    from .apply import rescore_nbest as run

    model_dir, nbest = _split_paths(paths, server, "NBEST")
    check_paths([nbest, source], output)
    _threads(threads)
    _in_process(source is not None, server, "--source is")
    backend = _backend(model_dir, server, kenlm, device, mix=mix)
    _check_joint(backend, source is not None)
    summary = run(backend, nbest, output, feature=feature, progress=not quiet, source=source)
    if not quiet:
        click.echo(json.dumps(summary), err=True)


@main.command()
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (0.0.0.0: all interfaces).")
@click.option("--port", type=click.IntRange(0, 65535), default=5555, show_default=True,
              help="TCP port (0: any free port, printed on stderr).")
@click.option("--max-batch", type=click.IntRange(min=1), default=8192, show_default=True,
              help="Most n-grams scored in one engine call.")
@click.option("--max-delay-us", type=click.IntRange(0, MAX_DELAY_US), default=200, show_default=True,
              help="Longest wait for other requests to join a batch (microseconds).")
@click.option("--cache-size", type=click.IntRange(min=0), default=0, show_default=True,
              help="N-gram cache entries shared by every client (0: none). Off by default: Moses's CSLM feature "
                   "caches per decoder thread, and in decoding the server's cache answered 1% of the n-grams "
                   "and cost more than it saved; it pays for clients that repeat n-grams.")
@click.option("--evaluator", type=click.Choice(["auto", "native", "graphs", "torch"]), default="auto",
              show_default=True,
              help="Who computes: native, with --self-normalized on a CPU, the C++ evaluator of Moses's in-process "
                   "mode (one history at a time, up to sixteen with --precision int8; a request's rows split over --threads "
                   "cores; the faster on a decoder's requests); graphs, on a GPU, the network recorded as CUDA graphs, replayed with one "
                   "launch a request; torch, batched matrix products; auto, native for self-normalised scores on a "
                   "CPU where the install built it, graphs on a GPU, else torch.")
@click.option("--history-cache", type=click.IntRange(min=0),
              help="With --self-normalized: rows of a cache of last hidden layers by history, so that an "
                   "n-gram of a history met before costs one output row (memory: this x the last layer x 4 bytes; "
                   "the C++ evaluator's threads share one; CUDA graphs keep none). 0: none "
                   "[16384 native, 0 torch].")
@click.option("--precision", type=click.Choice(["fp32", "int8"]), default="fp32", show_default=True,
              help="The C++ evaluator's layers after the first: int8 stores their weights in 8 bits and rounds "
                   "their inputs to 8 bits per history, and keeps the first layer's premultiplied tables in "
                   "bfloat16, half their memory (faster with AVX-512 VNNI or AMX; scores move by a few "
                   "thousandths of a nat, docs/moses-feature.md). Needs --self-normalized on a CPU.")
@click.option("--max-frame", type=click.IntRange(min=1), default=16 << 20, show_default=True,
              help="Largest request payload accepted (bytes).")
@click.option("--idle-timeout", type=Number(min=0, min_open=True), default=300.0, show_default=True,
              help="Close connections silent this long (seconds).")
@click.option("--frame-timeout", type=Number(min=0, min_open=True), default=30.0, show_default=True,
              help="Close a connection whose frame, once begun, has not arrived whole in this many seconds, or "
                   "whose client has not read a reply in as long.")
@click.option("--max-connections", type=click.IntRange(min=1),
              help="Most open connections; at the limit a new one closes the least recently active one without a "
                   "request in flight (idle, or stalled mid-frame), or is refused (ERROR 9) if every "
                   "one has a request in flight [what the open-file limit leaves room for: `ulimit -n` less 128, "
                   "e.g. 896 under 1024].")
@click.option("--max-pending", type=click.IntRange(min=1), default=16, show_default=True,
              help="Requests one connection may have read and not yet answered; at the cap it is not read further "
                   "until one is answered.")
@click.option("--max-conn-bytes", type=click.IntRange(min=1),
              help="Bytes one connection's requests read and not yet answered may hold: their payloads and what "
                   "answering them makes (10 bytes an n-gram) [2 x --max-frame].")
@click.option("--max-total-bytes", type=click.IntRange(min=1),
              help="The same for all connections together [16 x --max-frame].")
@click.option("--kenlm", type=click.Path(exists=True, dir_okay=False), help="Back-off mode: score unknown words with this n-gram model.")
@click.option("--self-normalized", is_flag=True,
              help="Unnormalised scores o_w (no softmax; premultiplied first layer): ln P only for a model "
                   "trained with --self-norm. Default: exact log-probabilities.")
@DEVICE
@click.option("--threads", type=THREADS, help="CPU threads for the engine [all cores].")
@click.option("--port-file", type=click.Path(dir_okay=False), help="Write the bound port here once listening (removed when the server stops).")
@fail_cleanly
def serve(model_dir, host, port, max_batch, max_delay_us, cache_size, evaluator, history_cache, precision, max_frame,
          idle_timeout, frame_timeout, max_connections, max_pending, max_conn_bytes, max_total_bytes, kenlm,
          self_normalized, device, threads, port_file):
    """Serve n-gram scores over TCP (protocol: docs/cslm.md) until SIGTERM."""
    from .limits import ServerConfig, connection_limit
    from .server import check_port_file, serve as run

    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # until listening; then SIGTERM and SIGHUP stop it gracefully
    if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
    require_model_dir(model_dir, "cslm")
    # impossible limits and an unwritable port file are refused before the model loads
    cfg = ServerConfig(host=host, port=port, max_batch=max_batch, max_delay=max_delay_us * 1e-6,
                       cache_size=cache_size, evaluator=evaluator, history_cache=history_cache, precision=precision,
                       max_frame=max_frame,
                       idle_timeout=idle_timeout, frame_timeout=frame_timeout, max_connections=max_connections,
                       max_pending=max_pending, max_conn_bytes=max_conn_bytes, max_total_bytes=max_total_bytes)
    connection_limit(max_connections)
    if port_file:
        check_port_file(port_file)
    _threads(threads)
    engine = _engine(model_dir, device, kenlm, self_normalized)
    engine.check_source(False)  # the protocol carries target n-grams only: a joint model is not served
    if self_normalized:
        _ = engine.tables  # build the premultiplied tables before listening, not on the first request
    run(engine, cfg, name=model_dir, port_file=port_file, summary=True)


@main.command()
@click.argument("address", metavar="HOST:PORT")
@fail_cleanly
def stats(address):
    """Print a running server's statistics (JSON)."""
    from .client import connect

    with connect(address) as c:
        click.echo(json.dumps(c.stats(), indent=2))


if __name__ == "__main__":
    main()
