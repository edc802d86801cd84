"""The `moses-rnn` command line: the group of the subcommands in `moses_rnn.commands`."""

from __future__ import annotations

import click

from mtcommon.allocator import reuse_freed_memory
from mtcommon.cliutil import OneLineGroup

from . import __version__
from .commands import analyze, generate, ini, score, train


@click.group(cls=OneLineGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="moses-rnn")
def main():
    """RNN Encoder-Decoder phrase scores for Moses phrase tables (Cho et al., 2014)."""
    reuse_freed_memory()


for command in (train.train, score.score, score.rescore_nbest, ini.ini, generate.sample, generate.translate,
                generate.augment, analyze.align, analyze.analyze):
    main.add_command(command)


if __name__ == "__main__":
    main()
