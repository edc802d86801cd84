"""Faults of model directories and of what models compute: numbers that overflow, foreign weights files,
config.json and metadata of the wrong kind, the files' modes and temporaries, and messages about a model.

Every command that writes or returns a model's numbers refuses non-finite ones through one check
(`mtcommon.finite`); every loader checks each tensor's dtype and shape and each config field before any
compute (`mtcommon.modeldir`). Each refusal is one line naming the model or the file and field.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from cslm import native
from mtcommon import modeldir
from mtcommon.finite import NonFiniteScores, check_finite
from mtcommon.modeldir import CHECKPOINT, CONFIG, WEIGHTS, ModelError
from mtcommon.outputs import _host_tag
from test_faults import (assert_one_line_error, copy_model, edit_weights, invoke, run, text,  # noqa: F401
                         tiny_cslm)

ROOT = Path(__file__).resolve().parents[1]


def edit_blob(model: Path, fn) -> None:
    blob = json.loads((model / CONFIG).read_text())
    fn(blob)
    (model / CONFIG).write_text(json.dumps(blob))


def overflowing(model: Path, tmp_path: Path) -> Path:
    """A copy of `model` whose weights are finite but so large that its scores overflow (inf - inf = nan)."""
    out = copy_model(model, tmp_path, "overflowing")
    edit_weights(out, lambda state: [v.fill_(1e30) for v in state.values()])
    return out


def attempt(tool: str, *args) -> tuple[int, str]:
    """(exit status, output) of a command expected to fail; `serve` runs in a process of its own, bounded in
    time, since a model it wrongly accepted would be served until stopped."""
    if args[0] == "serve":
        r = run(tool, *args, timeout=60)
        return r.returncode, r.stderr
    r = invoke(tool, *args)
    return r.exit_code, r.output


def nbest_list(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{i} ||| {line} ||| LM0= -1.5 ||| -1.5\n" for i, line in enumerate(lines)))
    return path


# -- the one finiteness check ---------------------------------------------------------------------------------------
def test_check_finite_names_the_model_the_value_and_where():
    check_finite(np.array([-1.0, 0.0], np.float32), "m")
    check_finite(torch.tensor([-3.0, -0.5]), "m")
    check_finite(np.arange(3), "m")  # integers are always finite
    with pytest.raises(NonFiniteScores, match=r"^lm: non-finite scores \(nan for line 3\)$"):
        check_finite(np.array([1.0, 2.0, np.nan]), "lm", lambda i: f"for line {i + 1}")
    with pytest.raises(NonFiniteScores, match=r"^lm: non-finite scores \(inf as a perplexity\)$"):
        check_finite(float("inf"), "lm", "as a perplexity")
    with pytest.raises(NonFiniteScores, match=r"-inf"):
        check_finite(torch.tensor([[0.0, -float("inf")]], dtype=torch.bfloat16), "lm")


def test_cslm_eval_refuses_an_overflowing_model(tmp_path, tiny_cslm, text):
    model = overflowing(tiny_cslm, tmp_path)
    r = invoke("cslm", "eval", model, text, "--quiet")
    assert r.exit_code == 1
    assert_one_line_error(r.output, model, "non-finite scores")


def test_cslm_score_refuses_an_overflowing_model_and_writes_nothing(tmp_path, tiny_cslm, text):
    model = overflowing(tiny_cslm, tmp_path)
    for extra in ([], ["--ngrams"], ["--self-normalized"]):
        out = tmp_path / "scores.txt"
        r = invoke("cslm", "score", model, text, "-o", out, "--quiet", *extra)
        assert r.exit_code == 1, (extra, r.output)
        # --self-normalized warns first that this model was not trained for it
        warnings, error = r.output.strip().splitlines()[:-1], r.output.strip().splitlines()[-1]
        assert all(w.startswith("cslm: warning:") for w in warnings), r.output
        assert_one_line_error(error, model, "non-finite scores")
        assert not out.exists()


def test_cslm_rescore_nbest_names_the_model(tmp_path, tiny_cslm):
    model = overflowing(tiny_cslm, tmp_path)
    out = tmp_path / "out.nbest"
    r = invoke("cslm", "rescore-nbest", model, nbest_list(tmp_path / "n", ["w1 w2", "w3"]), "-o", out, "--quiet")
    assert r.exit_code == 1
    assert_one_line_error(r.output, model, "non-finite scores")
    assert not out.exists()


def test_the_engine_refuses_what_the_server_would_send(tmp_path, tiny_cslm):
    """The engine's every result passes the check, so the server answers a broken model with an error, not NaN."""
    from cslm.engine import Engine

    model = overflowing(tiny_cslm, tmp_path)
    engine = Engine.load(str(model), device="cpu")
    ids = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
    with pytest.raises(NonFiniteScores, match=re.escape(f"{model}: non-finite scores (nan for n-gram 1 of 2)")):
        engine.score_ids(ids)
    with pytest.raises(NonFiniteScores):
        engine.score_ids_log_z(ids)
    with pytest.raises(NonFiniteScores):
        Engine.load(str(model), device="cpu", normalized=False).score_ids(ids)
    with pytest.raises(NonFiniteScores):
        engine.score_sentences([["w1", "w2"]])
    if native.library_path() is not None:  # the server's C++ evaluator (cslm/native.py)
        self_normalized = Engine.load(str(model), device="cpu", normalized=False)
        self_normalized.use_evaluator("native", 16)
        with pytest.raises(NonFiniteScores, match=re.escape(f"{model}: non-finite scores")):
            self_normalized.score_ids(ids)


def test_the_server_sends_an_error_not_nan(tmp_path, tiny_cslm):
    from cslm.client import Client, ServerError
    from cslm.engine import Engine
    from cslm.server import Server, ServerConfig

    engine = Engine.load(str(overflowing(tiny_cslm, tmp_path)), device="cpu")
    server = Server(engine, ServerConfig(port=0, cache_size=0))
    loop, ready = asyncio.new_event_loop(), threading.Event()
    ports = []

    async def main():
        ports.append(await server.start())
        ready.set()
        await server.wait_closed()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    try:
        assert ready.wait(10)
        with Client("127.0.0.1", ports[0], timeout=10) as c, pytest.raises(ServerError, match="non-finite scores"):
            c.score(np.array([[1, 2, 3]], np.int32))
    finally:
        loop.call_soon_threadsafe(server.request_shutdown)
        thread.join(10)


def test_a_perplexity_past_the_largest_float_is_refused(tmp_path, tiny_cslm, text):
    """Finite log-probabilities (-1e5 a token) whose perplexity overflows: one line, not an OverflowError."""
    model = copy_model(tiny_cslm, tmp_path)

    def one_word(state):
        for v in state.values():
            v.zero_()
        state["out.bias"][5] = 1e5  # every other word gets ln P = -1e5

    edit_weights(model, one_word)
    r = invoke("cslm", "eval", model, text, "--quiet")
    assert r.exit_code == 1
    assert_one_line_error(r.output, model, "non-finite scores (inf as a perplexity)")


@pytest.mark.parametrize("command", ["translate", "sample"])
def test_translate_and_sample_refuse_an_overflowing_model(command, tmp_path, tiny_model):
    model = overflowing(tiny_model, tmp_path)
    src = tmp_path / "src.txt"
    src.write_text("a cat\nthe house\n")
    out = tmp_path / "out.txt"
    r = invoke("moses-rnn", command, "-m", model, "-i", src, "-o", out, "--quiet")
    assert r.exit_code == 1, r.output
    assert_one_line_error(r.output, model, "non-finite scores", "target word 1")
    assert not out.exists()


def test_a_non_finite_score_formatted_by_a_planning_worker_names_the_model_and_its_line(tmp_path, tiny_model,
                                                                                       example_table):
    """On a GPU, workers plan and format what this process scored: NaN scores from every window after the
    first (the second and third go to the worker; this process scores the fourth itself, perhaps before them)
    are refused at line 65, the first in the table, named as a single process names it; nothing is written."""
    from moses_rnn.scoring.scorer import PhraseScorer
    from moses_rnn.scoring.table import score_table

    scorer = PhraseScorer.from_dir(str(tiny_model), device="cpu")
    run = scorer.run

    def broken(plan):  # the device's scores: NaN after the first window
        log_p = run(plan)
        if broken.calls:
            log_p[:] = np.nan
        broken.calls += 1
        return log_p

    broken.calls = 0
    scorer.run = broken
    out = tmp_path / "out.gz"
    with pytest.raises(NonFiniteScores, match=rf"^{re.escape(str(tiny_model))}: non-finite scores "
                                              rf"\(nan for {re.escape(str(example_table))}:65\)$"):
        score_table(scorer, str(example_table), str(out), window=64, workers=2, progress=False, planning=True)
    assert not out.exists()


def test_moses_rnn_rescore_nbest_names_the_model_and_the_line(tmp_path, tiny_model):
    model = overflowing(tiny_model, tmp_path)
    src = tmp_path / "src.txt"
    src.write_text("a cat\n")
    nbest = nbest_list(tmp_path / "n", ["un chat"])
    r = invoke("moses-rnn", "rescore-nbest", nbest, "-m", model, "--source", src, "-o", tmp_path / "o", "--quiet")
    assert r.exit_code == 1
    assert_one_line_error(r.output, model, "non-finite scores", f"{nbest}:1")
    assert not (tmp_path / "o").exists()


def test_score_uses_the_same_check(tmp_path, tiny_model, example_table):
    model = overflowing(tiny_model, tmp_path)
    r = invoke("moses-rnn", "score", example_table, "-m", model, "-o", tmp_path / "o.gz", "--quiet")
    assert r.exit_code == 1
    assert_one_line_error(r.output, model, "non-finite scores", f"{example_table}:1")


def test_a_sound_model_passes_the_check(tmp_path, tiny_model, tiny_cslm, text):
    r = invoke("moses-rnn", "translate", "-m", tiny_model, "a cat", "--quiet")
    assert r.exit_code == 0 and r.output.strip(), r.output
    r = invoke("moses-rnn", "sample", "-m", tiny_model, "a cat", "-n", "5", "--quiet")
    assert r.exit_code == 0, r.output
    r = invoke("cslm", "eval", tiny_cslm, text, "--quiet")
    assert r.exit_code == 0 and np.isfinite(json.loads(r.output)["cslm_ppl"]), r.output


# -- foreign weights: dtypes checked against the architecture -------------------------------------------------------
def loading_commands(tiny_model, tiny_cslm, text, tmp_path):
    """(tool, arguments) of every command that loads a model directory, and which one."""
    src = tmp_path / "src.txt"
    src.write_text("a cat\n")
    nbest = nbest_list(tmp_path / "n", ["w1 w2"])
    return [
        ("moses-rnn", tiny_model, ["score", ROOT / "moses_rnn" / "data" / "example.en-fr.phrase-table", "-m", "MODEL",
                                   "-o", tmp_path / "o.gz", "--quiet"]),
        ("moses-rnn", tiny_model, ["sample", "-m", "MODEL", "a cat", "--quiet"]),
        ("moses-rnn", tiny_model, ["translate", "-m", "MODEL", "a cat", "--quiet"]),
        ("moses-rnn", tiny_model, ["rescore-nbest", nbest, "-m", "MODEL", "--source", src, "-o", tmp_path / "r",
                                   "--quiet"]),
        ("cslm", tiny_cslm, ["eval", "MODEL", text, "--quiet"]),
        ("cslm", tiny_cslm, ["score", "MODEL", text, "--quiet"]),
        ("cslm", tiny_cslm, ["serve", "MODEL", "--port", "0"]),
    ]


@pytest.mark.parametrize("dtype", [torch.int64, torch.float16])
def test_weights_of_another_dtype_are_refused_by_every_loader(dtype, tmp_path, tiny_model, tiny_cslm, text):
    for tool, source, args in loading_commands(tiny_model, tiny_cslm, text, tmp_path):
        model = copy_model(source, tmp_path, f"{tool}-{args[0]}")
        state = load_file(str(model / WEIGHTS))
        name = sorted(state)[0]
        save_file({k: (v * 1000).to(dtype) for k, v in state.items()}, str(model / WEIGHTS))
        status, output = attempt(tool, *[model if a == "MODEL" else a for a in args])
        assert status == 1, (tool, args[0], output)
        assert_one_line_error(output, model / WEIGHTS, f"tensor {name!r} is {str(dtype)[6:]}",
                              "not the architecture's float32")


def test_a_checkpoint_of_another_dtype_is_refused(tmp_path):
    """fit_state is the one check of every model loaded: a checkpoint's model too."""
    model = torch.nn.Linear(3, 2)
    state = {k: v.to(torch.int64) for k, v in model.state_dict().items()}
    with pytest.raises(ModelError, match=r"^ck\.pt: tensor 'weight' is int64, not the architecture's float32$"):
        modeldir.fit_state("ck.pt", lambda: torch.nn.Linear(3, 2), state)


def test_parameter_names_of_no_version_are_refused(tmp_path, tiny_model):
    """No legacy parameter names are read (a 0.1.0 package has none): a renamed tensor is a foreign file."""
    model = copy_model(tiny_model, tmp_path)
    state = load_file(str(model / WEIGHTS))
    save_file({k.replace("output.G_l.", "decoder.G_l."): v for k, v in state.items()}, str(model / WEIGHTS))
    r = invoke("moses-rnn", "translate", "-m", model, "a cat", "--quiet")
    assert r.exit_code == 1
    assert_one_line_error(r.output, model / WEIGHTS, "decoder.G_l")


# -- config.json: the format and the metadata checked before any compute -------------------------------------------
@pytest.mark.parametrize("value", ["gpt", ["cslm"], 7])
def test_an_unknown_format_is_one_line_everywhere(value, tmp_path, tiny_model, tiny_cslm, text):
    for tool, source, args in loading_commands(tiny_model, tiny_cslm, text, tmp_path):
        model = copy_model(source, tmp_path, f"{tool}-{args[0]}-{len(str(value))}")
        edit_blob(model, lambda blob: blob.update(format=value))
        status, output = attempt(tool, *[model if a == "MODEL" else a for a in args])
        assert status == 1, (tool, args[0], output)
        assert_one_line_error(output, model / CONFIG, 'unknown "format"', json.dumps(value))


def bad_meta(blob):
    blob["meta"] = ["not", "an", "object"]
    return "meta"


def bad_train_config(blob):
    blob["meta"]["train_config"] = "fast"
    return "meta.train_config"


def bad_self_norm(blob):
    blob["meta"]["train_config"]["self_norm"] = "0.1"
    return "meta.train_config.self_norm"


def bad_objective(blob):
    blob["meta"]["train_config"]["objective"] = {"nce": True}
    return "meta.train_config.objective"


def bad_step(blob):
    blob["meta"]["step"] = -3
    return "meta.step"


@pytest.mark.parametrize("damage,command", [(bad_meta, "eval"), (bad_train_config, "eval"), (bad_self_norm, "eval"),
                                            (bad_objective, "eval"), (bad_step, "eval"), (bad_train_config, "serve")],
                         ids=lambda d: getattr(d, "__name__", d))
def test_metadata_of_the_wrong_type_is_one_line(damage, command, tmp_path, tiny_cslm, text):
    model = copy_model(tiny_cslm, tmp_path)
    fields = []
    edit_blob(model, lambda blob: fields.append(damage(blob)))
    args = [model, text, "--quiet"] if command == "eval" else [model, "--port", "0"]
    status, output = attempt("cslm", command, *args)
    assert status == 1, output
    assert_one_line_error(output, model / CONFIG, f'"{fields[0]}" ')


def test_the_phrase_models_metadata_is_checked_too(tmp_path, tiny_model):
    model = copy_model(tiny_model, tmp_path)
    edit_blob(model, lambda blob: blob["meta"]["train_config"].update(threads="all"))
    r = invoke("moses-rnn", "translate", "-m", model, "a cat", "--quiet")
    assert r.exit_code == 1
    assert_one_line_error(r.output, model / CONFIG, '"meta.train_config.threads" must be an integer of at least 0, '
                                                    'or null, not "all"')


def test_kind_speaks_for_an_unreadable_config(tmp_path):
    """A folder whose config.json cannot be read is not passed over as 'no model here'."""
    (tmp_path / CONFIG).write_text('{"format": "cslm", "model": ')
    with pytest.raises(ModelError, match=re.escape(f"{tmp_path / CONFIG}: invalid JSON")):
        modeldir.kind(str(tmp_path))
    (tmp_path / CONFIG).write_text('[1, 2]')
    with pytest.raises(ModelError, match="not a model config"):
        modeldir.kind(str(tmp_path))
    (tmp_path / CONFIG).write_bytes(b'{"format": "cslm", "model": {}, "x": "\xff"}')
    with pytest.raises(ModelError, match="invalid UTF-8"):
        modeldir.kind(str(tmp_path))
    os.unlink(tmp_path / CONFIG)
    assert modeldir.kind(str(tmp_path)) is None  # no config.json at all: not a model directory yet


# -- the files: one mode, one atomic writer -------------------------------------------------------------------------
def write_models(out: Path) -> tuple[Path, Path]:
    """A phrase model's and a CSLM's directories written by the library, with a checkpoint each."""
    from collections import Counter

    from cslm import modeldir as cslm_dir
    from cslm.data import build_vocab
    from cslm.model import CSLM, preset_config
    from moses_rnn.networks.modelbase import preset_config as phrase_preset
    from moses_rnn.networks.modelio import build_model, save_model, save_vocabularies
    from mtcommon.vocab import Vocabulary

    vocab = build_vocab(Counter({f"w{i}": 100 - i for i in range(40)}), 30)
    lm = out / "lm"
    cslm_dir.save_vocab(str(lm), vocab)
    cslm_dir.save_weights(str(lm), CSLM(preset_config("tiny", len(vocab))))
    modeldir.save_checkpoint(str(lm), {"step": 1})
    phrase = out / "phrase"
    words = Vocabulary(["</s>", "[UNK]"] + [f"v{i}" for i in range(9)])
    save_vocabularies(str(phrase), words, words)
    save_model(str(phrase), build_model(phrase_preset("tiny", len(words), len(words))))
    modeldir.save_checkpoint(str(phrase), {"step": 1})
    return lm, phrase


def test_every_file_of_a_model_directory_has_one_mode(tmp_path):
    for folder in write_models(tmp_path):
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()}
        assert {WEIGHTS, CONFIG, CHECKPOINT} <= set(modes)
        assert len(set(modes.values())) == 1, modes
        assert modes[WEIGHTS] & 0o044, modes  # readable by others, as the umask allows


def test_the_weights_follow_the_umask(tmp_path):
    """In a process of its own: the umask is the whole process's."""
    code = ("import os, stat, sys; os.umask(0o027); sys.path.insert(0, 'tests');"
            "from test_faults_models import write_models; from pathlib import Path;"
            "print(sorted({oct(stat.S_IMODE(p.stat().st_mode)) for d in write_models(Path(sys.argv[1]))"
            " for p in d.iterdir()}))")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["['0o640']"]


def test_a_killed_runs_temporaries_of_model_files_are_removed(tmp_path):
    """The model directory's files are written by the one atomic writer, whose stale temporaries the next run
    removes (those of a process that is gone)."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    lm = tmp_path / "lm"
    lm.mkdir()
    stale = [lm / f".{name}.{_host_tag()}-{dead}.abcd.tmp" for name in (WEIGHTS, CONFIG, CHECKPOINT)]
    for p in stale:
        p.write_bytes(b"half")
    write_models(tmp_path)
    assert not [p.name for p in stale if p.exists()]
    assert not [p.name for p in lm.iterdir() if p.name.endswith(".tmp")]


# -- messages about a model -----------------------------------------------------------------------------------------
def test_no_article_is_put_before_a_name_it_may_not_fit():
    """"a 'encdec' model": an article before an interpolated name agrees with some names and not others, so
    the messages name the value after a noun instead ("architecture 'encdec'")."""
    pattern = re.compile(r"""\b[Aa]n? \{[^}]*\}""")
    found = []
    for pkg in ("mtcommon", "moses_rnn", "cslm", "pipelines"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if pattern.search(line) and re.search(r"""\bf["']""", line):
                    found.append(f"{path.relative_to(ROOT)}:{lineno}")
    assert not found, found


def test_replace_unk_on_an_encdec_model_reads_well(tiny_model):
    r = invoke("moses-rnn", "translate", "-m", tiny_model, "a cat", "--replace-unk", "--quiet")
    assert r.exit_code == 1
    line = assert_one_line_error(r.output, "architecture 'encdec'")
    assert "a 'encdec'" not in line
