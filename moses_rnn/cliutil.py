"""What every command line of the project shares."""

from __future__ import annotations

import functools
import signal
import sys

import click

from .textio import GZIP_ERRORS, InputError

# Errors that are the user's input or environment, not a bug: one line, no traceback.
# OSError covers a missing or unreadable file, a full disk, a refused connection and a
# bad gzip header; ImportError an optional package that is not installed (kenlm);
# GZIP_ERRORS are a safety net for a stream read outside textio's readers (which
# already turn them into InputError): click would print a bare EOFError as "Aborted!".
USER_ERRORS = (InputError, ValueError, OSError, ImportError, *GZIP_ERRORS)


def fail_cleanly(fn):
    """Bad input becomes a one-line error; SIGTERM exits through the atomic-output cleanup."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as e:
            message = str(e) or type(e).__name__
            if isinstance(e, GZIP_ERRORS) and not isinstance(e, InputError):
                message = f"bad gzip input: {message}"
            raise click.ClickException(message) from None
        except RuntimeError as e:  # one about an option ("--device cuda asked for, but ..."), not a bug
            if str(e).startswith("--"):
                raise click.ClickException(str(e)) from None
            raise

    return wrapper


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
