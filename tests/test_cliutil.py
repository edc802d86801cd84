"""What the command lines share (mtcommon.cliutil, mtcommon.batching): options written once, one report
writer, one window batcher."""

from __future__ import annotations

import itertools
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from mtcommon.batching import batches
from mtcommon.cliutil import RegistryChoice, write_text


def test_batches_cut_a_stream_in_order_and_read_one_window_ahead_at_most():
    assert list(batches(range(7), 3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(batches([], 3)) == [] and list(batches("ab", 5)) == [["a", "b"]]
    endless = itertools.count()
    first = next(batches(endless, 4))
    assert first == [0, 1, 2, 3] and next(endless) == 4  # nothing read past the window given
    with pytest.raises(ValueError):
        next(batches([1], 0))


def test_write_text_goes_to_a_file_or_to_stdout(tmp_path):
    out = tmp_path / "report.md.gz"
    write_text(str(out), "é | x\n")
    assert out.read_bytes() == "é | x\n".encode("utf-8")  # a report is text, whatever its name
    inp = tmp_path / "in.txt"
    inp.write_text("data\n")
    with pytest.raises(Exception, match="in.txt"):
        write_text(str(inp), "x", inputs=[str(inp)])  # never over an input
    assert inp.read_text() == "data\n"

    @click.command()
    def report():
        write_text("-", "é\n")

    r = CliRunner().invoke(report)
    assert r.exit_code == 0 and r.stdout_bytes == "é\n".encode("utf-8")


def test_a_registry_choice_reads_its_registry_only_when_a_command_needs_it():
    read = []

    def names():
        read.append(1)
        return {"paper": 1, "small": 2}

    @click.group()
    def group():
        pass

    @group.command()
    @click.option("--preset", default="small", show_default=True, type=RegistryChoice(names))
    def train(preset):
        click.echo(preset)

    @group.command()
    def other():
        click.echo("other")

    assert CliRunner().invoke(group, ["other"]).output == "other\n" and not read
    r = CliRunner().invoke(group, ["train", "--help"])
    assert "[paper|small]" in r.output and read
    assert CliRunner().invoke(group, ["train", "--preset", "paper"]).output == "paper\n"
    r = CliRunner().invoke(group, ["train", "--preset", "huge"])
    assert r.exit_code == 2 and "'huge' is not one of 'paper', 'small'" in r.output


def test_the_preset_and_architecture_choices_are_the_registries():
    from cslm.cli import train as cslm_train
    from cslm.model import PRESETS
    from moses_rnn.commands.train import train
    from moses_rnn.networks import ARCHITECTURES

    def choices(command, name):
        return tuple(next(p for p in command.params if p.name == name).type.choices)

    assert choices(train, "arch") == tuple(ARCHITECTURES)
    assert all(set(choices(train, "preset")) == set(a.presets) for a in ARCHITECTURES.values())
    assert choices(cslm_train, "preset") == tuple(PRESETS)


def test_the_cslm_command_line_starts_without_torch():
    """The CSLM's presets live beside its torch model: the command line reads them only when it needs them."""
    code = "import sys, cslm.cli; from cslm.cli import main; assert 'torch' not in sys.modules, 'torch loaded'"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_both_trainers_declare_the_shared_options_alike():
    from cslm.cli import train as cslm_train
    from moses_rnn.commands.train import train

    shared = ("seed", "device", "resume", "overwrite", "quiet")
    for name in shared:
        a, b = (next(p for p in c.params if p.name == name) for c in (train, cslm_train))
        assert (a.opts, a.default, a.is_flag, type(a.type)) == (b.opts, b.default, b.is_flag, type(b.type)), name
