"""Faults of training and of the options every command shares (issue 41: items 6, 7, 16, 17, 19, 23; the
training items of issue 42): a resumed run keeps its own data and options, a model folder is never replaced
unasked, the budget is the one given, option ranges fit the machine, and Ctrl-C ends a command with 130.

Option checks run in-process with click's runner; what only a process shows (its exit status after a
signal, one line on stderr) runs as a process of its own.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from cslm.cli import main as cslm_main
from moses_rnn.cli import main as rnn_main
from mtcommon import __version__
from mtcommon.cliutil import INTERRUPTED, MAX_THREADS, fail_cleanly
from mtcommon.errors import UserError
from tests.test_cslm import synthetic_corpus

TOOLS = {"moses-rnn": rnn_main, "cslm": cslm_main}
TINY_RNN = ["--preset", "tiny", "--eval-every", "4", "--valid-pairs", "10", "--quiet", "--device", "cpu",
            "--threads", "1"]
TINY_CSLM = ["--preset", "tiny", "--vocab-size", "60", "--valid-fraction", "0.05", "--batch-size", "64", "--quiet",
             "--device", "cpu", "--threads", "1", "--dtype", "fp32"]


def invoke(tool: str, *args):
    return CliRunner().invoke(TOOLS[tool], [str(a) for a in args])


def one_line_error(r, *names) -> str:
    """The runner's result failed with one line of output, no traceback, naming each of `names`."""
    assert r.exit_code != 0, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.output, r.output
    for name in names:
        assert name in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return synthetic_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt", sentences=300, seed=4)


@pytest.fixture(scope="module")
def other_corpus(tmp_path_factory):
    return synthetic_corpus(tmp_path_factory.mktemp("other") / "other.txt", sentences=300, seed=9)


@pytest.fixture
def rnn_run(tmp_path, example_table):
    """A moses-rnn model folder holding a 4-step run of the example table."""
    out = tmp_path / "m"
    r = invoke("moses-rnn", "train", example_table, "-o", out, "--max-steps", 4, *TINY_RNN)
    assert r.exit_code == 0, r.output
    return out


# -- item 6: resume takes the checkpoint's data and options ------------------------------------------------------------
def test_resume_refuses_options_that_differ_from_the_checkpoint(rnn_run, example_table):
    before = (rnn_run / "checkpoint.pt").read_bytes()
    r = invoke("moses-rnn", "train", example_table, "-o", rnn_run, "--resume", "--max-steps", 8, "--preset", "small",
               "--arch", "rnnsearch", "--batch-size", 7, "--lr", 0.5, "--optimizer", "adadelta", "--quiet")
    line = one_line_error(r, "--preset small", "--arch rnnsearch", "--batch-size 7", "--lr 0.5",
                          "--optimizer adadelta", "--overwrite")
    assert "(the run's: tiny)" in line
    assert (rnn_run / "checkpoint.pt").read_bytes() == before  # nothing trained
    # options equal to the run's own pass (a script that repeats its command line resumes), and so do the
    # budget, the device and the threads; options left out are the checkpoint's, not the command's defaults
    r = invoke("moses-rnn", "train", example_table, "-o", rnn_run, "--resume", "--max-steps", 8, "--preset", "tiny",
               "--batch-size", 128, "--quiet", "--device", "cpu", "--threads", 1)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["steps"] == 8
    saved = json.loads((rnn_run / "config.json").read_text())["meta"]["train_config"]
    assert saved["preset"] == "tiny" and saved["eval_every"] == 4 and saved["valid_pairs"] == 10


def test_resume_without_a_budget_goes_on_to_the_runs_own(tmp_path, example_table):
    out = tmp_path / "m"
    assert invoke("moses-rnn", "train", example_table, "-o", out, "--max-steps", 8, *TINY_RNN).exit_code == 0
    r = invoke("moses-rnn", "train", example_table, "-o", out, "--resume", "--quiet")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["steps"] == 8  # its own budget, reached already: no hidden default of steps


def test_resume_refuses_another_table_or_corpus(rnn_run, example_table, tmp_path):
    other = tmp_path / "other-table"
    other.write_bytes(example_table.read_bytes().replace(b"the", b"a"))
    line = one_line_error(invoke("moses-rnn", "train", other, "-o", rnn_run, "--resume", "--quiet"),
                          str(other), "not the data", "--overwrite")
    # the same bytes under another name are the same data
    copy = tmp_path / "copy-table"
    copy.write_bytes(example_table.read_bytes())
    r = invoke("moses-rnn", "train", copy, "-o", rnn_run, "--resume", "--max-steps", 5, "--quiet")
    assert r.exit_code == 0, r.output + line


def test_resume_on_a_table_of_a_run_on_a_corpus_is_refused(tmp_path, corpus, example_table):
    out = tmp_path / "sent"
    r = invoke("moses-rnn", "train", "--corpus", corpus, corpus, "-o", out, "--max-steps", 4, *TINY_RNN)
    assert r.exit_code == 0, r.output
    one_line_error(invoke("moses-rnn", "train", example_table, "-o", out, "--resume", "--quiet"),
                   str(example_table), "not the data")


def test_cslm_resume_on_another_corpus_is_refused(tmp_path, corpus, other_corpus):
    out = tmp_path / "lm"
    assert invoke("cslm", "train", corpus, "-o", out, "--max-epochs", 1, *TINY_CSLM).exit_code == 0
    one_line_error(invoke("cslm", "train", other_corpus, "-o", out, "--resume", "--max-epochs", 2, "--quiet"),
                   str(other_corpus), "not the data")
    line = one_line_error(invoke("cslm", "train", corpus, "-o", out, "--resume", "--max-epochs", 2, "--objective",
                                 "nce", "--noise-samples", 20, "--self-norm", "0", "--vocab-size", 80, "--quiet"),
                          "--objective nce", "--noise-samples 20", "--vocab-size 80")
    assert "--self-norm" not in line  # given, but the run's own value
    r = invoke("cslm", "train", corpus, "-o", out, "--resume", "--max-epochs", 2, "--quiet")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["stopped"] == "max_epochs"  # issue 42: the limit it reached, by its name


# -- issue 42: a model folder is continued or replaced, never overwritten unasked ----------------------------------------
def test_train_into_a_folder_holding_a_model_needs_resume_or_overwrite(rnn_run, example_table, corpus, tmp_path):
    before = (rnn_run / "checkpoint.pt").read_bytes()
    one_line_error(invoke("moses-rnn", "train", example_table, "-o", rnn_run, "--max-steps", 4, *TINY_RNN),
                   str(rnn_run), "--resume", "--overwrite")
    assert (rnn_run / "checkpoint.pt").read_bytes() == before
    one_line_error(invoke("moses-rnn", "train", example_table, "-o", rnn_run, "--resume", "--overwrite", "--quiet"),
                   "--resume", "--overwrite")
    r = invoke("moses-rnn", "train", example_table, "-o", rnn_run, "--max-steps", 2, "--eval-every", 2, "--overwrite",
               *TINY_RNN[2:])
    assert r.exit_code == 0, r.output
    assert json.loads((rnn_run / "config.json").read_text())["meta"]["step"] == 2
    lm = tmp_path / "lm"
    assert invoke("cslm", "train", corpus, "-o", lm, "--max-epochs", 1, *TINY_CSLM).exit_code == 0
    one_line_error(invoke("cslm", "train", corpus, "-o", lm, "--max-epochs", 1, *TINY_CSLM), "--overwrite")


# -- issue 42: the budget is what the user gives ------------------------------------------------------------------------
def test_moses_rnn_train_has_no_hidden_step_limit(tmp_path, example_table):
    from moses_rnn.training.train import TrainConfig

    assert TrainConfig().max_steps is None
    one_line_error(invoke("moses-rnn", "train", example_table, "-o", tmp_path / "m", "--quiet"),
                   "--max-steps", "--max-minutes")
    assert not (tmp_path / "m").exists()
    helptext = " ".join(invoke("moses-rnn", "train", "--help").output.split())
    assert "there is no default limit" in helptext and "20000" not in helptext


def test_cslm_reports_the_epoch_limit_it_stopped_at(tmp_path, corpus):
    r = invoke("cslm", "train", corpus, "-o", tmp_path / "lm", "--max-epochs", 1, "--patience", 5, *TINY_CSLM)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["stopped"] == "max_epochs"


@pytest.mark.parametrize("tool", ["moses-rnn", "cslm"])
def test_version(tool):
    r = invoke(tool, "--version")
    assert r.exit_code == 0 and r.output == f"{tool}, version {__version__}\n", r.output


# -- item 7: feature names as MERT reads them ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["", "RNN 0", "RNN_0", "a|||b", "0RNN", "RNN0=", "RNN0\n"])
def test_rescore_nbest_refuses_feature_names_mert_misreads(tmp_path, name):
    source = tmp_path / "source.txt"
    source.write_text("a b\n")
    nbest = tmp_path / "nbest.txt"
    nbest.write_text("0 ||| a ||| LM0= -1 ||| -1\n")
    for tool, args in (("moses-rnn", ["rescore-nbest", nbest, "-m", tmp_path, "--source", source]),
                       ("cslm", ["rescore-nbest", tmp_path, nbest])):
        r = invoke(tool, *args, "-o", tmp_path / "out", "--feature", name)
        assert r.exit_code == 2 and "--feature" in r.output and "not usable by MERT" in r.output, r.output
        assert not (tmp_path / "out").exists()


def test_moses_ini_and_nbest_share_the_name_check():
    from moses_rnn.formats.mosesini import IniError, check_name
    from mtcommon import features

    for bad in ("RNN_0", "RNN0\n", "", "a b"):
        with pytest.raises(IniError, match="not usable by MERT"):
            check_name(bad)
        with pytest.raises(UserError, match="not usable by MERT"):
            features.check_name(bad)
    assert check_name("CSLM-0.1") == features.check_name("CSLM-0.1") == "CSLM-0.1"


# -- item 16: --threads within what the machine can run -----------------------------------------------------------------
def _commands(group: click.Group, prefix=()):
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _commands(command, (*prefix, name))
        else:
            yield (*prefix, name), command


@pytest.mark.parametrize("tool", ["moses-rnn", "cslm"])
def test_every_threads_option_is_bounded(tool):
    seen = 0
    for path, command in _commands(TOOLS[tool]):
        for param in command.params:
            if param.name == "threads":
                seen += 1
                assert isinstance(param.type, click.IntRange) and param.type.min == 1, path
                assert param.type.max == MAX_THREADS, path
    assert seen >= 3


def test_a_billion_threads_is_a_usage_error(tmp_path, example_table):
    r = invoke("moses-rnn", "score", example_table, "-m", tmp_path, "-o", tmp_path / "out.gz", "--threads", 10**9)
    assert r.exit_code == 2 and "--threads" in r.output, r.output
    assert list(tmp_path.iterdir()) == []  # no temporary left
    r = invoke("cslm", "eval", tmp_path, example_table, "--threads", 10**9)
    assert r.exit_code == 2 and "--threads" in r.output, r.output


# -- item 17: Ctrl-C exits 130 with one line -----------------------------------------------------------------------------
def test_keyboard_interrupt_exits_130_after_the_clean_up(tmp_path):
    cleaned = []

    @click.command()
    @fail_cleanly
    def slow():
        try:
            raise KeyboardInterrupt
        finally:
            cleaned.append(True)

    r = CliRunner().invoke(slow, [])
    assert r.exit_code == INTERRUPTED == 130 and cleaned == [True]
    assert "Aborted" not in r.output and r.output.strip() == "Error: interrupted (Ctrl-C)"


def test_sigint_to_a_waiting_command_exits_130_in_one_line():
    """`cslm stats` waits on a server that accepts and never answers; Ctrl-C ends it."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(60)
        port = server.getsockname()[1]
        # Ctrl-C's default disposition, as a terminal gives it: a test run in the background (`make test &`)
        # inherits SIGINT ignored, and a command started so rightly keeps ignoring it
        p = subprocess.Popen([sys.executable, "-m", "cslm.cli", "stats", f"127.0.0.1:{port}"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            conn, _ = server.accept()  # the command is in its body, waiting for the reply
            with conn:
                os.kill(p.pid, signal.SIGINT)
                _, stderr = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert p.returncode == 130, stderr
    assert stderr.strip().splitlines() == ["Error: interrupted (Ctrl-C)"], stderr


# -- item 19: sizes and lengths within their ranges ----------------------------------------------------------------------
@pytest.mark.parametrize("tool,args,option", [
    ("moses-rnn", ["train", "TABLE", "-o", "OUT", "--max-steps", 1, "--src-vocab", 0], "--src-vocab"),
    ("moses-rnn", ["train", "TABLE", "-o", "OUT", "--max-steps", 1, "--tgt-vocab", 2], "--tgt-vocab"),
    ("cslm", ["train", "TABLE", "-o", "OUT", "--vocab-size", 3], "--vocab-size"),
    ("moses-rnn", ["translate", "a", "-m", "DIR", "--len-extra", -50], "--len-extra"),
    ("moses-rnn", ["sample", "a", "-m", "DIR", "--len-extra", -1], "--len-extra"),
])
def test_sizes_and_lengths_out_of_range_are_usage_errors(tmp_path, example_table, tool, args, option):
    names = {"TABLE": example_table, "OUT": tmp_path / "out", "DIR": tmp_path}
    r = invoke(tool, *[names.get(a, a) if isinstance(a, str) else a for a in args])
    assert r.exit_code == 2 and option in r.output, r.output
    assert not (tmp_path / "out").exists()


def test_library_refuses_a_shortlist_without_room_for_a_word():
    from cslm.train import TrainConfig as LMConfig
    from moses_rnn.training.train import TrainConfig

    with pytest.raises(UserError, match="--src-vocab must be more than the 2 reserved symbols, not 0"):
        TrainConfig(src_vocab=0)
    with pytest.raises(UserError, match="--vocab-size must be more than the 3 reserved symbols, not 3"):
        LMConfig(vocab_size=3)


# -- item 23: NCE noise within the shortlist -----------------------------------------------------------------------------
def test_nce_noise_samples_beyond_the_shortlist_are_refused_at_once(tmp_path, corpus):
    r = invoke("cslm", "train", corpus, "-o", tmp_path / "lm", "--objective", "nce", "--noise-samples", 1000000,
               *TINY_CSLM)
    one_line_error(r, "--noise-samples", "60", "1000000")
    assert not (tmp_path / "lm").exists()
