"""Faults a user meets (issue 21, Reliability 1-3, and `fail_cleanly`): damaged model files, a model that
gives non-finite scores, bad options, and the one error type behind the one-line messages.

Every bad input must end with a one-line error naming the file, a non-zero exit, no partial output and
no process left behind. The processes themselves (exit status, stderr, leftovers) are checked with
subprocess runs; the wide matrices of damages and commands run in-process with click's runner.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import click
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from cslm.cli import main as cslm_main
from moses_rnn.cli import main as rnn_main
from mtcommon.cliutil import MAX_THREADS
from mtcommon.modeldir import CHECKPOINT, CONFIG, WEIGHTS

TOOLS = {"moses-rnn": rnn_main, "cslm": cslm_main}


# -- helpers ------------------------------------------------------------------------------------------------------
def run(tool: str, *args, timeout: float = 120) -> subprocess.CompletedProcess:
    """The command line `tool` (moses-rnn or cslm) in a process of its own, leading its own process group;
    the result keeps its process id as `pid` (for `assert_nothing_left`)."""
    module = {"moses-rnn": "moses_rnn.cli", "cslm": "cslm.cli"}[tool]
    with subprocess.Popen([sys.executable, "-m", module, *map(str, args)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as p:
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            raise
    r = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
    r.pid = p.pid
    return r


def invoke(tool: str, *args):
    """The command line `tool` run in this process (click's runner)."""
    return CliRunner().invoke(TOOLS[tool], [str(a) for a in args])


def assert_one_line_error(text: str, *names, prefix: str = "Error: ") -> str:
    """`text` (a command's whole output) is one error line, no traceback, naming each of `names`."""
    lines = text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix) and "Traceback" not in text, text
    for name in names:
        assert str(name) in lines[0], (name, lines[0])
    return lines[0]


def group_members(pgid: int) -> list[int]:
    """Live processes (zombies not counted) of process group `pgid`, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except (OSError, ValueError):
            continue
        state, _, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            found.append(int(entry))
    return found


def assert_nothing_left(pid: int, grace: float = 10.0) -> None:
    """No process of the finished command's process group (workers, resource tracker) is still running
    once `grace` seconds have passed (a helper sees its parent gone and exits on its own)."""
    deadline = time.monotonic() + grace
    while (left := group_members(pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes left behind: {left}"


def copy_model(src: Path, tmp_path: Path, name: str = "model") -> Path:
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def edit_config(model: Path, **changes) -> None:
    blob = json.loads((model / CONFIG).read_text())
    blob["model"].update(changes)
    (model / CONFIG).write_text(json.dumps(blob))


def edit_weights(model: Path, fn) -> None:
    state = load_file(str(model / WEIGHTS))
    fn(state)
    save_file(state, str(model / WEIGHTS))


# -- models -------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def tiny_cslm(tmp_path_factory) -> Path:
    """A tiny CSLM, initialised (not trained), with a 30-word shortlist."""
    from cslm import modeldir
    from cslm.data import build_vocab
    from cslm.model import CSLM, preset_config

    out = tmp_path_factory.mktemp("faults-cslm") / "lm"
    vocab = build_vocab(Counter({f"w{i}": 100 - i for i in range(40)}), 30)
    torch.manual_seed(0)
    model = CSLM(preset_config("tiny", len(vocab)))
    model.init_weights()
    modeldir.save_vocab(str(out), vocab)
    modeldir.save_weights(str(out), model, {"train_config": {"self_norm": 0.0}})
    return out


@pytest.fixture(scope="session")
def text(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("faults-text") / "text.txt"
    path.write_text("w1 w2 w3\nw4 w5 w39 w2\n", encoding="utf-8")
    return path


# -- 1. damaged model files ---------------------------------------------------------------------------------------
def cut(model):
    data = (model / WEIGHTS).read_bytes()
    (model / WEIGHTS).write_bytes(data[: len(data) // 2])
    return [WEIGHTS]


def empty(model):
    (model / WEIGHTS).write_bytes(b"")
    return [WEIGHTS]


def random_bytes(model):
    (model / WEIGHTS).write_bytes(np.random.default_rng(0).bytes(4096))
    return [WEIGHTS]


def huge_header(model):
    (model / WEIGHTS).write_bytes(struct.pack("<Q", 1 << 40) + b'{"w": {}}')
    return [WEIGHTS]


def nan_weight(model):
    def poison(state):
        name = sorted(state)[0]
        state[name].view(-1)[0] = float("nan")
    edit_weights(model, poison)
    return [WEIGHTS, "NaN"]


def shapes(model):  # a config whose sizes do not fit the weights
    edit_config(model, embed=24)
    return [WEIGHTS, CONFIG, "size mismatch"]


def huge_config(model):  # ... and asks for a model far beyond memory: refused before anything is allocated
    edit_config(model, embed=10**9)
    return [WEIGHTS, CONFIG]


def negative(model):
    edit_config(model, embed=-5)
    return [CONFIG, "embed", "-5"]


def string(model):
    edit_config(model, embed="16")
    return [CONFIG, "embed"]


def unknown_key(model):  # a config.json from another program or version: refused, not half-read
    edit_config(model, heads=4)
    return [CONFIG, "unknown keys 'heads'"]


def not_json(model):
    (model / CONFIG).write_text('{"format": "cslm", "model": {', encoding="utf-8")
    return [CONFIG, "invalid JSON"]


def short_vocab(model):
    vocab = next(p for p in sorted(model.iterdir()) if p.suffix == ".vocab")
    vocab.write_text("".join(vocab.read_text(encoding="utf-8").splitlines(keepends=True)[:-1]), encoding="utf-8")
    return [vocab.name, CONFIG]


def bad_utf8_vocab(model):
    vocab = next(p for p in sorted(model.iterdir()) if p.suffix == ".vocab")
    vocab.write_bytes(vocab.read_bytes() + b"caf\xe9\t3\n")
    return [vocab.name, "invalid UTF-8"]


DAMAGES = [cut, empty, random_bytes, huge_header, nan_weight, shapes, huge_config, negative, string, unknown_key,
           not_json, short_vocab, bad_utf8_vocab]


def commands(tool: str, model: Path, table: Path, text: Path, out: Path) -> dict[str, list]:
    """The commands that load a model, with `out` as their output folder."""
    if tool == "moses-rnn":
        return {"score": ["score", table, "-m", model, "-o", out / "o.gz", "--quiet", "--device", "cpu"],
                "translate": ["translate", "-m", model, "-o", out / "t.txt", "--quiet", "--device", "cpu", "a cat"],
                "sample": ["sample", "-m", model, "-o", out / "s.txt", "--quiet", "--device", "cpu", "a cat"]}
    return {"score": ["score", model, text, "-o", out / "s.txt", "--quiet", "--device", "cpu"],
            "eval": ["eval", model, text, "--quiet", "--device", "cpu"]}


@pytest.mark.parametrize("tool", ["moses-rnn", "cslm"])
@pytest.mark.parametrize("damage", DAMAGES, ids=lambda d: d.__name__)
def test_a_damaged_model_is_one_line_naming_the_file(tool, damage, tmp_path, tiny_model, tiny_cslm, example_table,
                                                     text):
    source = tiny_model if tool == "moses-rnn" else tiny_cslm
    model = copy_model(source, tmp_path)
    names = damage(model)
    names = [model / names[0], *names[1:]]
    out = tmp_path / "out"
    out.mkdir()
    for name, args in commands(tool, model, example_table, text, out).items():
        r = invoke(tool, *args)
        assert r.exit_code == 1, (name, r.output)
        assert_one_line_error(r.output, *names)
        assert list(out.iterdir()) == [], name  # no output, no temporary


@pytest.mark.parametrize("damage", [cut, shapes, negative], ids=lambda d: d.__name__)
def test_serve_refuses_a_damaged_model_before_listening(damage, tmp_path, tiny_cslm):
    model = copy_model(tiny_cslm, tmp_path)
    names = damage(model)
    r = run("cslm", "serve", model, "--port", "0", "--port-file", tmp_path / "port", "--device", "cpu", timeout=60)
    assert r.returncode == 1
    assert_one_line_error(r.stderr, model / names[0], *names[1:])
    assert not (tmp_path / "port").exists()
    assert_nothing_left(r.pid)


@pytest.mark.parametrize("tool", ["moses-rnn", "cslm"])
def test_a_damaged_model_in_a_real_process(tool, tmp_path, tiny_model, tiny_cslm, example_table, text):
    """The same as the in-process matrix, as the user runs it: stderr holds one line, exit status 1."""
    model = copy_model(tiny_model if tool == "moses-rnn" else tiny_cslm, tmp_path)
    cut(model)
    out = tmp_path / "out"
    out.mkdir()
    (out / "s.txt").write_text("previous\n")
    args = (["score", example_table, "-m", model, "-o", out / "s.txt", "--quiet"] if tool == "moses-rnn"
            else ["score", model, text, "-o", out / "s.txt", "--quiet"])
    r = run(tool, *args)
    assert r.returncode == 1 and r.stdout == ""
    assert_one_line_error(r.stderr, model / WEIGHTS, "not a readable safetensors file")
    assert snapshot(out) == {"s.txt": b"previous\n"}
    assert_nothing_left(r.pid)


def resume(model: Path, table: Path):
    return invoke("moses-rnn", "train", table, "-o", model, "--resume", "--preset", "tiny", "--max-steps", 70,
                  "--device", "cpu", "--quiet")


def cut_checkpoint(model):
    data = (model / CHECKPOINT).read_bytes()
    (model / CHECKPOINT).write_bytes(data[: len(data) // 2])
    return [CHECKPOINT, "not a readable training checkpoint"]


def random_checkpoint(model):
    (model / CHECKPOINT).write_bytes(np.random.default_rng(0).bytes(4096))
    return [CHECKPOINT, "not a readable training checkpoint"]


def not_a_checkpoint(model):
    torch.save({"model": {}}, model / CHECKPOINT)
    return [CHECKPOINT, "not a training checkpoint"]


def nan_checkpoint(model):
    state = torch.load(model / CHECKPOINT, weights_only=True)
    next(iter(state["model"].values())).view(-1)[0] = float("inf")
    torch.save(state, model / CHECKPOINT)
    return [CHECKPOINT, "NaN or infinite"]


def foreign_loop(model):  # the loop's counters in another layout: refused, not merged into this run's
    state = torch.load(model / CHECKPOINT, weights_only=True)
    state["loop"]["epoch"] = 3
    torch.save(state, model / CHECKPOINT)
    return [CHECKPOINT, "not a training checkpoint", "'epoch'"]


def config_shapes(model):  # the checkpoint's weights do not fit config.json
    edit_config(model, hidden=40)
    return [CHECKPOINT, CONFIG, "size mismatch"]


def config_huge(model):
    edit_config(model, hidden=10**6)
    return [CHECKPOINT, CONFIG]


def config_string(model):
    edit_config(model, maxout="16")
    return [CONFIG, "maxout"]


@pytest.mark.parametrize("damage", [cut_checkpoint, random_checkpoint, not_a_checkpoint, nan_checkpoint,
                                    foreign_loop, config_shapes, config_huge, config_string, short_vocab],
                         ids=lambda d: d.__name__)
def test_resume_from_a_damaged_model_dir_is_one_line_and_changes_nothing(damage, tmp_path, tiny_model,
                                                                          example_table):
    model = copy_model(tiny_model, tmp_path)
    names = damage(model)
    before = snapshot(model)
    r = resume(model, example_table)
    assert r.exit_code == 1, r.output
    assert_one_line_error(r.output, model / names[0], *names[1:])
    assert snapshot(model) == before


# -- 2. non-finite log-probabilities ------------------------------------------------------------------------------
def test_nan_weights_are_refused_before_scoring(tmp_path, tiny_model, example_table):
    model = copy_model(tiny_model, tmp_path)
    edit_weights(model, lambda state: state["decoder.O_h.weight"].view(-1).__setitem__(3, float("nan")))
    out = tmp_path / "out.gz"
    r = run("moses-rnn", "score", example_table, "-m", model, "-o", out, "--quiet")
    assert r.returncode == 1
    assert_one_line_error(r.stderr, model / WEIGHTS, "decoder.O_h.weight holds NaN or infinite values")
    assert not out.exists()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_model_that_overflows_stops_the_run_naming_it(workers, tmp_path, tiny_model, example_table):
    """Finite weights can still overflow to inf - inf = nan: the scores are checked, not only the weights."""
    model = copy_model(tiny_model, tmp_path)
    edit_weights(model, lambda state: [v.fill_(1e30) for v in state.values()])
    out = tmp_path / "out.gz"
    out.write_bytes(gzip.compress(b"previous\n"))
    r = run("moses-rnn", "score", example_table, "-m", model, "-o", out, "--workers", workers, "--window", 64,
            "--quiet")
    assert r.returncode == 1
    line = assert_one_line_error(r.stderr, model, "non-finite scores", f"{example_table}:")
    assert "nan" in line or "inf" in line
    assert gzip.decompress(out.read_bytes()) == b"previous\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "out.gz"]
    assert_nothing_left(r.pid)


def test_scores_of_a_sound_model_are_all_finite(tmp_path, tiny_model, example_table):
    """The check does not refuse what a trained model writes."""
    r = invoke("moses-rnn", "score", example_table, "-m", tiny_model, "-o", tmp_path / "o", "--quiet")
    assert r.exit_code == 0, r.output
    values = [float(v) for line in (tmp_path / "o").read_text().splitlines() for v in line.split(" ||| ")[2].split()]
    assert all(np.isfinite(values))


# -- 3. bad options -----------------------------------------------------------------------------------------------
def option_commands(tiny_model, tiny_cslm, table, text, out) -> list[tuple[str, list, set]]:
    """(tool, arguments, the options it takes of --threads and --device)."""
    return [
        ("moses-rnn", ["train", table, "-o", out / "m", "--preset", "tiny", "--quiet"], {"--threads", "--device"}),
        ("moses-rnn", ["score", table, "-m", tiny_model, "-o", out / "o.gz", "--quiet"], {"--threads", "--device"}),
        ("moses-rnn", ["sample", "-m", tiny_model, "a cat", "--quiet"], {"--device"}),
        ("moses-rnn", ["translate", "-m", tiny_model, "a cat", "--quiet"], {"--device"}),
        ("moses-rnn", ["align", "a cat", "-m", tiny_model, "-o", out / "a.png"], {"--device"}),
        ("cslm", ["train", text, "-o", out / "m", "--preset", "tiny", "--quiet"], {"--threads", "--device"}),
        ("cslm", ["eval", tiny_cslm, text, "--quiet"], {"--threads", "--device"}),
        ("cslm", ["score", tiny_cslm, text, "--quiet"], {"--threads", "--device"}),
        ("cslm", ["rescore-nbest", tiny_cslm, text, "-o", out / "n.txt", "--quiet"], {"--threads", "--device"}),
        ("cslm", ["serve", tiny_cslm, "--port", "0"], {"--threads", "--device"}),
    ]


BAD_OPTIONS = [("--threads", "0", f"0 is not in the range 1<=x<={MAX_THREADS}."),
               ("--threads", "-1", f"-1 is not in the range 1<=x<={MAX_THREADS}."),
               ("--device", "tpu", "'tpu' is not a device: choose auto, cpu, cuda or cuda:N")]


@pytest.mark.parametrize("option,value,message", BAD_OPTIONS, ids=["threads=0", "threads=-1", "device=tpu"])
def test_bad_threads_and_device_are_usage_errors_everywhere(option, value, message, tmp_path, tiny_model, tiny_cslm,
                                                           example_table, text):
    out = tmp_path / "out"
    out.mkdir()
    checked = 0
    for tool, args, takes in option_commands(tiny_model, tiny_cslm, example_table, text, out):
        if option not in takes:
            continue
        r = invoke(tool, *args, option, value)
        assert r.exit_code == 2, (tool, args[0], r.output)
        assert "Traceback" not in r.output and r.output.strip().splitlines()[-1] == \
            f"Error: Invalid value for '{option}': {message}", (tool, args[0], r.output)
        assert list(out.iterdir()) == []
        checked += 1
    assert checked == (7 if option == "--threads" else 10)


@pytest.mark.parametrize("tool,args,message", [
    ("moses-rnn", ["augment", "nosuch.gz"], "Error: Missing option '-m' / '--model-dir'."),
    ("moses-rnn", ["nosuchcmd"], "Error: No such command 'nosuchcmd'."),
    ("moses-rnn", ["ini", "add-columns"], "Error: Missing argument 'MOSES_INI'."),
    ("cslm", ["serve"], "Error: Missing argument 'MODEL_DIR'."),
    ("cslm", ["eval", "--nosuch"], "Error: No such option '--nosuch'"),  # click may add a suggestion
])
def test_usage_errors_are_one_line(tool, args, message):
    """A missing, unknown or bad option or argument is one line, as every other error: not click's usage and
    --help hint above it."""
    r = run(tool, *args, timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and r.stdout == "" and len(lines) == 1 and lines[0].startswith(message), r.stderr


@pytest.mark.parametrize("tool,args", [("moses-rnn", ["score", "TABLE", "-m", "MODEL", "-o", "OUT"]),
                                       ("cslm", ["serve", "MODEL"])])
def test_bad_options_in_a_real_process(tool, args, tmp_path, tiny_model, tiny_cslm, example_table):
    paths = {"TABLE": example_table, "MODEL": tiny_model if tool == "moses-rnn" else tiny_cslm,
             "OUT": tmp_path / "o.gz"}
    args = [paths.get(a, a) for a in args]
    for option, value, message in BAD_OPTIONS:
        r = run(tool, *args, option, value, timeout=60)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.strip().splitlines()[-1] == f"Error: Invalid value for '{option}': {message}"
        assert_nothing_left(r.pid)
    assert list(tmp_path.iterdir()) == []


def test_the_library_refuses_bad_devices_and_thread_counts_too():
    from mtcommon.errors import UserError
    from mtcommon.runtime import check_device, configure_threads, resolve_device

    for name in ("tpu", "cuda:", "cuda:x", "cpu:0", ""):
        with pytest.raises(UserError, match="is not a device"):
            resolve_device(name)
    assert [check_device(n) for n in ("auto", "cpu", "cuda", "cuda:1")] == ["auto", "cpu", "cuda", "cuda:1"]
    with pytest.raises(UserError, match="--threads must be at least 1"):
        configure_threads(torch.device("cpu"), 0)


# -- 4. one error type: the user's errors in one line, bugs with their traceback -------------------------------------
def test_the_projects_errors_are_one_type():
    from moses_rnn.formats.mosesini import IniError
    from mtcommon.errors import UserError
    from mtcommon.modeldir import ModelError
    from mtcommon.textio import InputError, iter_lines  # noqa: F401 (pipelines/mt.py's import
    from mtcommon.outputs import atomic_output

    assert issubclass(InputError, UserError) and issubclass(IniError, UserError) and issubclass(ModelError, InputError)
    assert issubclass(UserError, ValueError)  # callers that catch ValueError (pipelines/mt.py) still catch them
    import pickle

    e = pickle.loads(pickle.dumps(ModelError("m/model.safetensors", "gives nan")))  # from a worker process
    assert type(e) is ModelError and str(e) == "m/model.safetensors: gives nan"


def test_fail_cleanly_shows_user_errors_in_one_line_and_bugs_with_a_traceback():
    from moses_rnn.formats.mosesini import IniError
    from mtcommon.cliutil import fail_cleanly
    from mtcommon.errors import UserError
    from mtcommon.textio import InputError

    @fail_cleanly
    def command(exc):
        raise exc

    for exc, message in [(UserError("bad option"), "bad option"), (InputError("t.gz", 3, "bad line"), "t.gz:3: bad line"),
                         (IniError("no feature named 'X'"), "no feature named 'X'"),
                         (FileNotFoundError("x: no such file"), "x: no such file")]:
        with pytest.raises(click.ClickException) as e:
            command(exc)
        assert e.value.message == message
    for bug in (ValueError("a bug"), RuntimeError("--looks like an option"), KeyError("k"), ImportError("x")):
        with pytest.raises(type(bug)):
            command(bug)


def test_a_bug_inside_a_command_keeps_its_traceback(tmp_path, tiny_model, example_table):
    code = ("import sys\n"
            "from moses_rnn.scoring import table\n"
            "def bug(*a, **k):\n"
            "    raise ValueError('a bug, not bad input')\n"
            "table.setup_scoring = bug\n"
            "from moses_rnn.cli import main\n"
            f"sys.argv = ['moses-rnn', 'score', {str(example_table)!r}, '-m', {str(tiny_model)!r}, "
            f"'-o', {str(tmp_path / 'o.gz')!r}, '--quiet']\n"
            "main()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "Traceback" in r.stderr and r.stderr.strip().splitlines()[-1] == "ValueError: a bug, not bad input"


@pytest.fixture
def moses_ini(tmp_path) -> Path:
    path = tmp_path / "moses.ini"
    path.write_text("[feature]\nPhraseDictionaryMemory path=pt.gz num-features=2\nWordPenalty\n\n"
                    "[weight]\nPhraseDictionaryMemory0= 0.2 0.2\nWordPenalty0= -1\n", encoding="utf-8")
    return path


def test_errors_that_were_plain_value_errors_are_still_one_line(tmp_path, tiny_model, example_table, moses_ini,
                                                                tiny_cslm):
    """Each of these once reached the user as a bare ValueError; each is now the project's error type."""
    bad_ini = tmp_path / "bad.ini"
    bad_ini.write_bytes(moses_ini.read_bytes().replace(b"0.2 0.2", b"0.2 \xe9"))
    r = invoke("moses-rnn", "ini", "add-columns", bad_ini, "-o", tmp_path / "x.ini")
    assert_one_line_error(r.output, f"{bad_ini}:6: invalid UTF-8")
    bad_ini.write_text(moses_ini.read_text().replace("0.2 0.2", "0.2 abc"))
    r = invoke("moses-rnn", "ini", "add-columns", bad_ini, "-o", tmp_path / "x.ini")
    assert_one_line_error(r.output, bad_ini, "not a number")
    r = invoke("moses-rnn", "ini", "add-columns", moses_ini, "-w", "nan", "-o", tmp_path / "x.ini")
    assert_one_line_error(r.output, "must be finite numbers")
    r = invoke("moses-rnn", "translate", "-m", tiny_model, "", "--quiet")  # one line out per line in
    assert r.exit_code == 0 and r.output == "\n", r.output
    r = invoke("moses-rnn", "align", "a cat", "-m", tiny_model, "-o", tmp_path / "a.png")
    assert_one_line_error(r.output, "model has no alignment")
    one_pair = tmp_path / "one.txt"
    one_pair.write_text(example_table.read_text(encoding="utf-8").splitlines(keepends=True)[0], encoding="utf-8")
    r = invoke("moses-rnn", "train", one_pair, "-o", tmp_path / "m", "--preset", "tiny", "--max-steps", "1",
               "--quiet")
    assert_one_line_error(r.output, one_pair, "needs at least 2 distinct phrase pairs")
    r = invoke("cslm", "score", "--server", "no-port", one_pair, "--quiet")
    assert_one_line_error(r.output, "expected HOST:PORT")
    r = invoke("cslm", "train", one_pair, "-o", tmp_path / "m2", "--preset", "tiny", "--quiet")
    assert_one_line_error(r.output, one_pair, "needs at least 2 non-blank sentences")
    for option, value in [("--lr", "-1"), ("--seed", "-1"), ("--batch-size", "0")]:
        r = invoke("moses-rnn", "train", example_table, "-o", tmp_path / "m", "--preset", "tiny", option, value)
        assert r.exit_code == 2 and f"Invalid value for '{option}'" in r.output and "Traceback" not in r.output
    for option, value in [("--window", "0"), ("--token-budget", "-1")]:
        r = invoke("moses-rnn", "score", example_table, "-m", tiny_model, "-o", tmp_path / "o", option, value)
        assert r.exit_code == 2 and f"Invalid value for '{option}'" in r.output
    r = invoke("moses-rnn", "translate", "-m", tiny_model, "--len-ratio", "nan", "a cat")
    assert r.exit_code == 2 and "nan is not a finite number" in r.output
    r = invoke("moses-rnn", "ini", "set", moses_ini, "WordPenalty0", "novalue", "-o", "-")
    assert r.exit_code == 2 and "expected KEY=VALUE" in r.output
    assert not (tmp_path / "x.ini").exists() and not (tmp_path / "o").exists()
