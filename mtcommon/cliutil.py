"""What every command line of the project shares."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import signal
import sys
from typing import Callable, Iterable

import click

from .errors import UserError
from .textio import GZIP_ERRORS, InputError

# Errors that are the user's input or environment, not a bug: one line, no traceback.
# UserError is the project's own (bad input, options, model files: errors.py); OSError
# covers a missing or unreadable file, a full disk, a refused connection and a bad gzip
# header; GZIP_ERRORS are a safety net for a stream read outside textio's readers (which
# already turn them into InputError): click would print a bare EOFError as "Aborted!".
# Everything else is a bug and keeps its traceback.
USER_ERRORS = (UserError, OSError, *GZIP_ERRORS)


def exit_on_signals() -> None:
    """SIGTERM, and SIGHUP (a closed terminal), raise SystemExit (exit status 128 + the signal's number), so
    that a stopped command leaves through its clean-up: the atomic output's temporary removed, the previous
    output untouched, worker processes stopped. A SIGHUP already ignored (nohup) stays ignored."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, lambda *_: sys.exit(128 + signal.SIGHUP))


#: The exit status of a command stopped by Ctrl-C (SIGINT), as a shell reports a process the signal ended.
INTERRUPTED = 128 + signal.SIGINT


def user_error_message(e: BaseException) -> str:
    """The one line a user error (USER_ERRORS) is shown as."""
    message = str(e) or type(e).__name__
    if isinstance(e, GZIP_ERRORS) and not isinstance(e, InputError):
        message = f"bad gzip input: {message}"
    return message


def fail_cleanly(fn):
    """A user error becomes a one-line message (exit 1); SIGTERM and SIGHUP exit through the clean-up
    (`exit_on_signals`); Ctrl-C, once the clean-up has run on the way out (the atomic output's temporary
    removed, workers stopped), is one line and exit status 130, not click's "Aborted!" and 1."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        exit_on_signals()
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as e:
            raise click.ClickException(user_error_message(e)) from None
        except KeyboardInterrupt:
            click.echo("Error: interrupted (Ctrl-C)", err=True)
            sys.exit(INTERRUPTED)

    return wrapper


def run_script(main: Callable[[], int | None]) -> None:
    """Runs a script's main (benchmarks/) as the commands run theirs: a user error (a file missing or damaged,
    a bad value: USER_ERRORS) is one line, `SCRIPT: error: MESSAGE`, and exit status 1, not a traceback;
    SIGTERM and SIGHUP exit through the clean-up (`exit_on_signals`: servers and workers the script started
    are stopped); Ctrl-C is one line and exit status 130. Exits with main's return value (None: 0)."""
    exit_on_signals()
    name = os.path.basename(sys.argv[0])
    try:
        code = main()
    except USER_ERRORS as e:
        print(f"{name}: error: {user_error_message(e)}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"{name}: error: interrupted (Ctrl-C)", file=sys.stderr)
        sys.exit(INTERRUPTED)
    sys.exit(code or 0)


class OneLineUsageError(click.UsageError):
    """A usage error shown as click shows its other errors: `Error: MESSAGE`, one line (exit status 2)."""

    def show(self, file=None) -> None:
        click.echo(f"Error: {self.format_message()}", err=True, file=file)


@contextlib.contextmanager
def _one_line_usage():
    try:
        yield
    except OneLineUsageError:
        raise
    except click.UsageError as e:
        raise OneLineUsageError(e.format_message(), e.ctx) from None


class OneLineGroup(click.Group):
    """The commands' group: a usage error (an option or argument missing, unknown or out of range) is one
    line, `Error: ...` as click writes it last, without the usage and the --help hint click prints above it.
    The group's own arguments are parsed in `make_context`, every subcommand's (nested groups' too) in
    `invoke`."""

    def make_context(self, *args, **kwargs):
        with _one_line_usage():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        with _one_line_usage():
            return super().invoke(ctx)


def explicit_options(ctx: click.Context | None = None) -> frozenset[str]:
    """The names of the current command's parameters that the user gave (on the command line or in the
    environment), not left at their defaults: what a resumed training compares with its checkpoint."""
    ctx = ctx or click.get_current_context()
    given = (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)
    return frozenset(name for name in ctx.params if ctx.get_parameter_source(name) in given)


def feature_name(ctx, param, value: str | None) -> str | None:
    """Click callback of every --feature option that names a Moses feature: refuse a name MERT would
    misread (`mtcommon.features.check_name`, the check the moses.ini editor makes too)."""
    from .features import check_name

    if value is None:
        return None
    try:
        return check_name(value)
    except UserError as e:
        raise click.BadParameter(str(e)) from None


def check_device(ctx, param, value: str) -> str:
    """Click callback of every --device option: refuse a name that is no device (`runtime.check_device`)."""
    from .runtime import check_device as check

    try:
        return check(value)
    except UserError as e:
        raise click.BadParameter(str(e)) from None


#: The most CPU threads any --threads option takes: well past any machine's cores (oversubscribing a few
#: times over can be measured), and far from the counts whose thread stacks alone exhaust memory.
MAX_THREADS = max(1024, 4 * (os.cpu_count() or 1))
THREADS = click.IntRange(1, MAX_THREADS)  # the type of every --threads option
SEED = click.IntRange(min=0)  # numpy's generators take no negative seed
# the --lr-schedule option of both trainers (mtcommon.trainer.lr_factor)
LR_SCHEDULE = click.option(
    "--lr-schedule", default="constant", show_default=True, type=click.Choice(["constant", "linear", "cosine"]),
    help="constant: the paper's. linear, cosine: decay to 0 at the end of the budget (the step, epoch or "
         "--max-minutes limit the run reaches first).")

# the --overwrite flag of both trainers (mtcommon.trainer.Trainer: a model directory is never replaced unasked)
OVERWRITE = click.option(
    "--overwrite", is_flag=True,
    help="Start afresh in a MODEL_DIR that already holds a model (its weights, config and checkpoint are "
         "removed first); without it, or --resume, such a folder is refused.")

# the model a command reads (a `moses-rnn train` folder)
MODEL_DIR = click.option("-m", "--model-dir", required=True, type=click.Path(exists=True, file_okay=False))

QUIET = click.option("--quiet", is_flag=True, help="No progress bar.")


def device_option(default: str = "auto", torchrun: bool = False):
    """The --device option (`check_device`); `torchrun`: the command runs under torchrun too."""
    where = " (torchrun: cuda:LOCAL_RANK)." if torchrun else "."
    return click.option("--device", default=default, show_default=True, callback=check_device,
                        help=f"auto, cpu, cuda or cuda:N{where}")


DEVICE = device_option()


def trainer_options(data: str, budget: str, threads: str = "tuned while training"):
    """The options both trainers share (mtcommon.trainer), in this order: --seed, --device, --threads,
    --resume, --overwrite, --quiet. `data`: what a resumed run must be given again; `budget`: the trainer's
    own limit, which a resumed run may change (as it may the others of `trainer.RUN_CONTROL`)."""
    options = [
        click.option("--seed", type=SEED, default=1, show_default=True),
        device_option(torchrun=True),
        click.option("--threads", type=THREADS, help=f"CPU threads [{threads}]."),
        click.option("--resume", is_flag=True,
                     help=f"Continue from MODEL_DIR/checkpoint.pt: on the same {data}, with the options it was "
                          f"started with (only {budget}, --max-minutes, --device, --threads, --dtype may change)."),
        OVERWRITE,
        QUIET,
    ]
    return stacked(options)


def stacked(options):
    """One decorator applying `options` (click decorators) in their order, as if written one above another."""

    def decorate(fn):
        for option in reversed(options):
            fn = option(fn)
        return fn

    return decorate


class RegistryChoice(click.Choice):
    """A choice among a registry's names, read when a command first needs them (to parse or show its
    options), so that a registry whose module imports torch is not loaded for every command."""

    def __init__(self, names: Callable[[], Iterable[str]]):
        self._names = names
        self.case_sensitive = True

    @functools.cached_property
    def choices(self) -> tuple[str, ...]:
        return tuple(self._names())


def write_text(path: str, text: str, inputs: Iterable[str | None] = ()) -> None:
    """A command's report (Markdown, JSON) into file `path`, atomically, or onto stdout for '-': UTF-8,
    never gzip-compressed. `path` must not be one of `inputs`."""
    from .outputs import atomic_output

    with atomic_output(path, compress=False, inputs=inputs) as out:
        out.write(text.encode("utf-8"))


class Number(click.FloatRange):
    """A float option that must be a finite number within the range (click's FloatRange lets nan through)."""

    name = "number"

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{number} is not a finite number", param, ctx)
        return number


def model_dir_kind(model_dir: str) -> str | None:
    """'cslm' for a `cslm train` directory, 'moses-rnn' for a `moses-rnn train` one, None if neither."""
    from .modeldir import kind

    return kind(model_dir)


def require_model_dir(model_dir: str, tool: str) -> None:
    """Refuse, in one line, a model directory of the other tool (each would fail on it obscurely)."""
    kind = model_dir_kind(model_dir)
    if kind is not None and kind != tool:
        raise click.ClickException(f"{model_dir} is {_KINDS[kind]} model directory (made by `{kind} train`); "
                                   f"{tool} needs {_KINDS[tool]} one (made by `{tool} train`)")


_KINDS = {"cslm": "a CSLM language-model", "moses-rnn": "an RNN phrase-scorer"}
