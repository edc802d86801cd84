"""What every command line of the project shares."""

from __future__ import annotations

import functools
import signal
import sys

import click

from .textio import InputError


def fail_cleanly(fn):
    """Bad input becomes a one-line error; SIGTERM exits through the atomic-output cleanup."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            return fn(*args, **kwargs)
        except (InputError, FileNotFoundError, ValueError, ConnectionError) as e:
            raise click.ClickException(str(e)) from None

    return wrapper
