"""Faults of input and output (issue 41, items 1, 2, 5, 15, 18, 22; issue 42's errors that were not one line).

- An input given as a pipe (`<(...)`, /dev/fd/N, a FIFO, stdin) is read whole: every byte once, the gzip
  check included (it used to read the first 4 KB of the pipe, then open it again).
- An output that is one of the command's inputs (also through a linked folder) is refused in one line,
  and the input is left as it was.
- Scores and feature values are read as Moses reads them: `1_000`, `٣` and a no-break space are refused.
- Bad tables and lists end in one line naming the file and line, never a traceback.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from cslm.cli import main as cslm_main
from moses_rnn.cli import main as rnn_main
from moses_rnn.formats.phrasetable import parse_line, parse_window, parse_window_exactly
from mtcommon import nbest
from mtcommon.errors import UserError
from mtcommon.textio import InputError, iter_line_blocks, iter_lines
from test_faults import assert_one_line_error, tiny_cslm  # noqa: F401 (a shared session fixture)

LEX_F2E = "la the 0.5\nle the 0.4\nmaison house 0.6\nrouge red 0.8\nvoiture car 0.7\nla NULL 0.05\nune NULL 0.1\n"
LEX_E2F = "the la 0.6\nthe le 0.3\nhouse maison 0.9\nred rouge 0.7\ncar voiture 0.8\nthe NULL 0.2\na NULL 0.3\n"


def invoke(main, *args):
    return CliRunner().invoke(main, [str(a) for a in args])


class Pipe:
    """A real pipe, named /dev/fd/N as a shell's `<(...)` names it, fed `data` by a thread (a pipe holds
    64 KB: larger data needs a writer beside the reader)."""

    def __init__(self, data: bytes, first: int | None = None):
        self.read_fd, self.write_fd = os.pipe()
        self.path = f"/dev/fd/{self.read_fd}"
        self.thread = threading.Thread(target=self._feed, args=(data, first), daemon=True)
        self.thread.start()

    def _feed(self, data: bytes, first: int | None) -> None:
        try:
            with open(self.write_fd, "wb", buffering=0) as f:
                if first is not None:  # the first bytes in a write of their own
                    f.write(data[:first])
                    data = data[first:]
                f.write(data)
        except BrokenPipeError:  # the reader stopped early (an error under test)
            pass

    def close(self) -> None:
        os.close(self.read_fd)
        self.thread.join(timeout=10)


@pytest.fixture
def pipe():
    made = []

    def make(data: bytes, first: int | None = None) -> str:
        made.append(Pipe(data, first))
        return made[-1].path

    yield make
    for p in made:
        p.close()


@pytest.fixture(scope="module")
def table(tmp_path_factory, example_table) -> Path:
    """The example table three times over (1,212 lines, 90 KB): far over the 4 KB the gzip check lost."""
    path = tmp_path_factory.mktemp("io") / "table.txt"
    path.write_bytes(example_table.read_bytes() * 3)
    return path


@pytest.fixture(scope="module")
def phrases(tmp_path_factory, example_table) -> Path:
    """1,000 source phrases of the example table, one a line (about 12 KB)."""
    sources = [line.split(" ||| ")[0] for line in example_table.read_text(encoding="utf-8").splitlines()]
    path = tmp_path_factory.mktemp("io") / "phrases.txt"
    path.write_text("".join(f"{sources[i % len(sources)]}\n" for i in range(1000)), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def cslm_text(tmp_path_factory) -> Path:
    """1,000 sentences of the tiny CSLM's words (about 15 KB)."""
    path = tmp_path_factory.mktemp("io") / "text.txt"
    path.write_text("".join(f"w{i % 30} w{(i * 7) % 40} w{(i * 3) % 35}\n" for i in range(1000)), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def nbest_list(tmp_path_factory, phrases) -> tuple[Path, Path]:
    """An n-best list of 3 hypotheses for each of 300 source sentences, and those sentences."""
    folder = tmp_path_factory.mktemp("io")
    sources = phrases.read_text(encoding="utf-8").splitlines()[:300]
    (folder / "source.txt").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    lines = [f"{i} ||| {t} ||| LM0= -{k + 1}.5 TM0= -2 -3 ||| -{k + 4}\n"
             for i in range(300) for k, t in enumerate(["un livre", "une voiture", "la maison"])]
    (folder / "list.nbest").write_text("".join(lines), encoding="utf-8")
    return folder / "list.nbest", folder / "source.txt"


# -- 1. one way to open an input: pipes read whole ------------------------------------------------------------
@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("first", [None, 1])  # the gzip magic cut between two writes
def test_a_pipe_is_read_whole(pipe, table, compress, first):
    data = table.read_bytes()
    sent = gzip.compress(data) if compress else data
    lines = data.decode("utf-8").splitlines()
    assert [line for _, line in iter_lines(pipe(sent, first))] == lines
    blocks = list(iter_line_blocks(pipe(sent, first), 100))
    assert b"".join(b for _, b in blocks) == data and blocks[-1][0] == 1 + 100 * (len(blocks) - 1)


def test_a_fifo_is_read_whole(tmp_path, table):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    data = table.read_bytes()

    def feed():
        with open(fifo, "wb") as f:
            f.write(data)

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    assert len(list(iter_lines(str(fifo)))) == data.count(b"\n")
    writer.join(timeout=10)


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("first", [None, 1])
def test_stdin_through_a_pipe_is_read_whole(table, compress, first):
    """With `first`, stdin's first byte comes alone, once the reader waits for it: a single look at the
    buffered stream (peek) took a gzip stream for plain text."""
    import time

    data = table.read_bytes()
    sent = gzip.compress(data) if compress else data
    code = ("import sys; from mtcommon.textio import iter_lines; print('ready', flush=True); "
            "print(sum(1 for _ in iter_lines('-')))")
    with subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as p:
        assert p.stdout.readline() == b"ready\n"
        if first is not None:
            p.stdin.write(sent[:first])
            p.stdin.flush()
            time.sleep(0.2)  # the reader takes its first look meanwhile (if it is late, the case is merely easier)
            sent = sent[first:]
        out, err = p.communicate(sent, timeout=60)
    assert p.returncode == 0 and int(out) == data.count(b"\n"), err


def test_a_pipe_cannot_be_entered_at_a_byte_offset(pipe, table):
    with pytest.raises(ValueError, match="a pipe at byte 10"):
        next(iter_line_blocks(pipe(table.read_bytes()), 10, start=10))


def test_stdin_given_as_two_inputs_is_refused(tmp_path, tiny_model):
    r = invoke(rnn_main, "rescore-nbest", "-", "--source", "-", "-m", tiny_model, "-o", tmp_path / "out", "--quiet")
    assert r.exit_code == 1
    assert_one_line_error(r.output, "stdin ('-')", "more than one input")


def test_sharded_scoring_refuses_a_pipe(pipe, tmp_path, table):
    """Every torchrun process reads the table by byte offsets: a pipe cannot be shared, so it is refused
    before any process reads it (a single process streams it: `test_score_reads_a_pipe_whole`)."""
    from moses_rnn.scoring.shard import score_shard

    with pytest.raises(UserError, match="sharded scoring .* needs a table file, not a pipe"):
        score_shard(None, None, pipe(table.read_bytes()), str(tmp_path / "out"), 100, 1, False, None)


def test_score_reads_a_pipe_whole(pipe, tmp_path, table, tiny_model):
    """`score <(cat table)` wrote 268 of 300 lines and said "268 lines"; with two processes too."""
    expected = tmp_path / "file.out"
    assert invoke(rnn_main, "score", table, "-m", tiny_model, "-o", expected, "--quiet").exit_code == 0
    for workers in ("1", "2"):
        out = tmp_path / f"pipe{workers}.out"
        r = invoke(rnn_main, "score", pipe(table.read_bytes()), "-m", tiny_model, "-o", out, "--quiet",
                   "--workers", workers)
        assert r.exit_code == 0, r.output
        assert out.read_bytes() == expected.read_bytes()


def test_translate_reads_a_pipe_whole(pipe, tmp_path, phrases, tiny_model):
    """`translate -i <(...)` wrote 963 lines for 1,000."""
    out = tmp_path / "out.txt"
    r = invoke(rnn_main, "translate", "-m", tiny_model, "-i", pipe(phrases.read_bytes()), "-o", out, "--quiet",
               "--beam", "1", "--len-ratio", "0", "--len-extra", "2")
    assert r.exit_code == 0, r.output
    assert len(out.read_text(encoding="utf-8").splitlines()) == 1000


def test_cslm_score_and_eval_read_a_pipe_whole(pipe, tmp_path, cslm_text, tiny_cslm):
    """`cslm score` wrote 970 lines for 1,000; `cslm eval` measured 970 sentences."""
    import json

    out = tmp_path / "scores.txt"
    r = invoke(cslm_main, "score", tiny_cslm, pipe(cslm_text.read_bytes()), "-o", out, "--quiet", "--device", "cpu")
    assert r.exit_code == 0, r.output
    expected = tmp_path / "expected.txt"
    assert invoke(cslm_main, "score", tiny_cslm, cslm_text, "-o", expected, "--quiet", "--device", "cpu").exit_code == 0
    assert out.read_bytes() == expected.read_bytes() and len(out.read_bytes().splitlines()) == 1000
    r = invoke(cslm_main, "eval", tiny_cslm, pipe(gzip.compress(cslm_text.read_bytes())), "--quiet", "--device", "cpu")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["sentences"] == 1000


def test_rescore_nbest_reads_its_source_from_a_pipe_whole(pipe, tmp_path, nbest_list, tiny_model):
    """`rescore-nbest --source <(...)` scored every hypothesis against the wrong source sentence."""
    nbest_path, source = nbest_list
    expected, out = tmp_path / "expected", tmp_path / "out"
    args = ["rescore-nbest", nbest_path, "-m", tiny_model, "--quiet", "--device", "cpu"]
    assert invoke(rnn_main, *args, "--source", source, "-o", expected).exit_code == 0
    r = invoke(rnn_main, *args, "--source", pipe(source.read_bytes()), "-o", out)
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == expected.read_bytes()


# -- 2. one guard: an output that is an input is refused -----------------------------------------------------
def _commands(table, phrases, cslm_text, nbest_list, tiny_model, tiny_cslm, lex):
    """(main, arguments, the input the output is) for every command that writes, with OUT for the output."""
    nb, source = nbest_list
    return {
        "score": (rnn_main, ["score", table, "-m", tiny_model, "-o", "OUT", "--quiet"], table),
        "augment": (rnn_main, ["augment", table, "-m", tiny_model, "-o", "OUT", "--quiet", "--lex-f2e", lex[0],
                               "--lex-e2f", lex[1]], table),
        "translate": (rnn_main, ["translate", "-m", tiny_model, "-i", phrases, "-o", "OUT", "--quiet"], phrases),
        "sample": (rnn_main, ["sample", "-m", tiny_model, "-i", phrases, "-o", "OUT", "--quiet"], phrases),
        "rescore-nbest (list)": (rnn_main, ["rescore-nbest", nb, "-m", tiny_model, "--source", source, "-o", "OUT",
                                            "--quiet"], nb),
        "rescore-nbest (source)": (rnn_main, ["rescore-nbest", nb, "-m", tiny_model, "--source", source, "-o", "OUT",
                                              "--quiet"], source),
        "cslm score": (cslm_main, ["score", tiny_cslm, cslm_text, "-o", "OUT", "--quiet"], cslm_text),
        "cslm rescore-nbest": (cslm_main, ["rescore-nbest", tiny_cslm, nb, "-o", "OUT", "--quiet"], nb),
    }


COMMANDS = ["score", "augment", "translate", "sample", "rescore-nbest (list)", "rescore-nbest (source)", "cslm score",
            "cslm rescore-nbest"]


@pytest.mark.parametrize("how", ["same name", "linked folder"])
@pytest.mark.parametrize("command", COMMANDS)
def test_an_output_that_is_an_input_is_refused(command, how, tmp_path, table, phrases, cslm_text, nbest_list,
                                               tiny_model, tiny_cslm):
    """`translate -i a -o a`, `cslm score M a -o a` and both rescorers overwrote their input; `score` and
    `augment` refused the same name only, not the same file through a linked folder."""
    folder = tmp_path / "data"
    folder.mkdir()
    for f in (table, phrases, cslm_text, *nbest_list):
        (folder / f.name).write_bytes(f.read_bytes())
    (folder / "lex.f2e").write_text(LEX_F2E)
    (folder / "lex.e2f").write_text(LEX_E2F)
    (tmp_path / "link").symlink_to(folder, target_is_directory=True)
    copies = [folder / f.name for f in (table, phrases, cslm_text, *nbest_list)]
    main, args, victim = _commands(*copies[:3], tuple(copies[3:]), tiny_model, tiny_cslm,
                                   (folder / "lex.f2e", folder / "lex.e2f"))[command]
    before = victim.read_bytes()
    output = victim if how == "same name" else tmp_path / "link" / victim.name
    r = invoke(main, *[output if a == "OUT" else a for a in args])
    assert r.exit_code == 1
    assert_one_line_error(r.output, output, "would overwrite")
    assert victim.read_bytes() == before


def test_an_output_folder_is_named_not_the_temporary(tmp_path, nbest_list, tiny_model):
    """`rescore-nbest -o EXISTING_DIR` printed the temporary's name."""
    nb, source = nbest_list
    (tmp_path / "out").mkdir()
    r = invoke(rnn_main, "rescore-nbest", nb, "-m", tiny_model, "--source", source, "-o", tmp_path / "out", "--quiet")
    assert r.exit_code == 1
    line = assert_one_line_error(r.output, tmp_path / "out", "is a folder")
    assert ".tmp" not in line and os.listdir(tmp_path / "out") == []


@pytest.mark.parametrize("command", ["score", "augment"])
def test_a_missing_table_is_one_line_naming_it(command, tmp_path, tiny_model):
    """`score nosuch.gz` printed a raw `[Errno 2]`; `augment nosuch.gz` click's three-line usage."""
    missing = tmp_path / "nosuch.gz"
    r = invoke(rnn_main, command, missing, "-m", tiny_model, "-o", tmp_path / "out.gz")
    assert r.exit_code == 1
    assert assert_one_line_error(r.output) == f"Error: {missing}: no such file"


def test_score_draws_no_progress_bar_before_an_error_in_its_first_window(tmp_path, example_table, tiny_model):
    lines = example_table.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[4] = lines[4].replace(" ||| 0.6 ", " ||| abc ", 1)
    bad = tmp_path / "bad.txt"
    bad.write_text("".join(lines), encoding="utf-8")
    r = invoke(rnn_main, "score", bad, "-m", tiny_model, "-o", tmp_path / "out")
    assert r.exit_code == 1
    assert_one_line_error(r.output, f"{bad}:5: score 'abc' is not a number")


# -- 5. scores read as Moses reads them ---------------------------------------------------------------------
# what float() and str.split() take and Moses does not read so
MOSES_REFUSES = {"underscore": "1_000", "arabic-indic digit": "\u0663", "fullwidth digit": "\uff13",
                 "no-break space": "0.5\u00a00.25"}


@pytest.mark.parametrize("score", MOSES_REFUSES.values(), ids=MOSES_REFUSES.keys())
def test_a_score_moses_would_misread_is_refused(score, tmp_path, example_table, tiny_model):
    lines = example_table.read_text(encoding="utf-8").splitlines(keepends=True)
    src, tgt, scores, rest = lines[2].split(" ||| ", 3)
    first, *others = scores.split()
    bad_line = f"{src} ||| {tgt} ||| {score} {' '.join(others[: 3 - score.count(chr(0xA0))])} ||| {rest}"
    with pytest.raises(InputError, match=r"t:3: score .* is not a number"):
        parse_line(bad_line, "t", 3)
    data = "".join(lines[:2] + [bad_line] + lines[3:]).encode("utf-8")
    for parse in (parse_window, parse_window_exactly):  # the fast path, and the line-by-line one
        with pytest.raises(InputError, match=r"t:3: score .* is not a number"):
            parse(data, "t", 1, 4)
    table = tmp_path / "t.txt"
    table.write_bytes(data)
    r = invoke(rnn_main, "score", table, "-m", tiny_model, "-o", tmp_path / "out", "--quiet")
    assert r.exit_code == 1 and not (tmp_path / "out").exists()
    assert_one_line_error(r.output, f"{table}:3: score")


def test_scores_moses_reads_are_still_read():
    for scores in ("1 0.5 .25 2.", "1e-3\t+2E+2 0.5 7", "3 4 5 6\r"):
        pair = parse_line(f"a ||| b ||| {scores}\n", "t", 1)
        assert len(pair.scores) == 4


@pytest.mark.parametrize("value", MOSES_REFUSES.values(), ids=MOSES_REFUSES.keys())
def test_an_nbest_feature_value_moses_would_misread_is_refused(value):
    h = nbest.parse(f"0 ||| un livre ||| LM0= -3 TM0= {value} ||| -3", "l", 1)
    with pytest.raises(ValueError):
        h.features()
    assert nbest.parse("0 ||| x ||| LM0= -3 TM0= 1e-2\t-.5 ||| -3", "l", 1).features() == \
        [("LM0_0", -3.0), ("TM0_0", 0.01), ("TM0_1", -0.5)]


@pytest.mark.parametrize("sentence_id", ["\u00b2", "\u0663"])  # str.isdigit() takes both
def test_an_nbest_sentence_id_moses_would_not_write_is_refused(sentence_id):
    with pytest.raises(InputError, match="l:7: not a Moses n-best line"):
        nbest.parse(f"{sentence_id} ||| un livre ||| LM0= -3 ||| -3", "l", 7)


# -- 15. tracebacks on bad input ----------------------------------------------------------------------------
def test_rescore_nbest_with_a_sentence_id_that_is_no_number_is_one_line(tmp_path, nbest_list, tiny_model):
    """A sentence id `²` raised a ValueError from int()."""
    _, source = nbest_list
    nb = tmp_path / "list"
    nb.write_text("0 ||| un livre ||| LM0= -3 ||| -3\n\u00b2 ||| un livre ||| LM0= -3 ||| -3\n", encoding="utf-8")
    r = invoke(rnn_main, "rescore-nbest", nb, "-m", tiny_model, "--source", source, "-o", tmp_path / "out", "--quiet")
    assert r.exit_code == 1 and not (tmp_path / "out").exists()
    assert_one_line_error(r.output, f"{nb}:2: not a Moses n-best line")


@pytest.fixture(scope="module")
def tiny_rnnsearch(tmp_path_factory, example_table) -> Path:
    """An RNNsearch model, trained for a few steps (an empty source leaves its attention nothing to read)."""
    from moses_rnn.training.train import TrainConfig, train

    model_dir = tmp_path_factory.mktemp("tiny-rnnsearch")
    cfg = TrainConfig(preset="tiny", arch="rnnsearch", max_steps=4, eval_every=2, valid_pairs=20, device="cpu")
    train(str(example_table), str(model_dir), cfg, progress=False)
    return model_dir


@pytest.mark.parametrize("model", ["encdec", "rnnsearch"])
def test_rescore_nbest_with_hypotheses_of_an_empty_source_line_is_one_line(model, tmp_path, tiny_model, request):
    """An empty source line with hypotheses raised a RuntimeError from the attention (RNNsearch)."""
    model_dir = tiny_model if model == "encdec" else request.getfixturevalue("tiny_rnnsearch")
    source, nb = tmp_path / "source", tmp_path / "list"
    source.write_text("a big book\n\nthe car\n", encoding="utf-8")
    nb.write_text("0 ||| un livre ||| LM0= -3 ||| -3\n1 ||| une voiture ||| LM0= -3 ||| -3\n", encoding="utf-8")
    r = invoke(rnn_main, "rescore-nbest", nb, "-m", model_dir, "--source", source, "-o", tmp_path / "out", "--quiet")
    assert r.exit_code == 1 and not (tmp_path / "out").exists()
    assert_one_line_error(r.output, f"{nb}:2:", f"line 2 of {source} is empty")


# -- augment: 15, 18, 22 -------------------------------------------------------------------------------------
def augment(tmp_path, model, lines) -> tuple:
    table = tmp_path / "table.txt"
    table.write_text("".join(lines), encoding="utf-8")
    (tmp_path / "lex.f2e").write_text(LEX_F2E)
    (tmp_path / "lex.e2f").write_text(LEX_E2F)
    out = tmp_path / "out.gz"
    return invoke(rnn_main, "augment", table, "-m", model, "-o", out, "--quiet"), table, out


def test_augment_refuses_an_empty_table_as_score_does(tmp_path, tiny_model):
    r, table, out = augment(tmp_path, tiny_model, [])
    assert r.exit_code == 1 and not out.exists()
    score = invoke(rnn_main, "score", table, "-m", tiny_model, "-o", tmp_path / "scored", "--quiet")
    assert assert_one_line_error(r.output) == assert_one_line_error(score.output) == \
        f"Error: {table}: the phrase table is empty (no lines)"


BAD_FIELDS = {
    "count 1e999": ("0-0 1-1 2-2 ||| 34 1e999 17", "count '1e999' is not a finite number"),
    "count abc": ("0-0 1-1 2-2 ||| 34 abc 17", "count 'abc' is not a number"),
    "count 1_000": ("0-0 1-1 2-2 ||| 34 1_000 17", "count '1_000' is not a number"),
    "negative count": ("0-0 1-1 2-2 ||| 34 -3 17", "count '-3' is not a finite number of at least 0"),
    "alignment x-1": ("0-0 x-1 2-2 ||| 34 34 17", "alignment point 'x-1' is not"),
    "alignment out of range": ("0-0 1-1 2-7 ||| 34 34 17", "alignment point '2-7' is outside the phrases"),
}


@pytest.mark.parametrize("fields,message", BAD_FIELDS.values(), ids=BAD_FIELDS.keys())
def test_augment_refuses_bad_alignment_and_count_fields(fields, message, tmp_path, example_table, tiny_model):
    """They were passed through (a count of 1e999 raised an OverflowError, one of `abc` became 0)."""
    lines = example_table.read_text(encoding="utf-8").splitlines(keepends=True)
    src, tgt, scores, _ = lines[2].split(" ||| ", 3)
    lines[2] = f"{src} ||| {tgt} ||| {scores} ||| {fields} ||| |||\n"
    r, table, out = augment(tmp_path, tiny_model, lines)
    assert r.exit_code == 1 and not out.exists()
    assert_one_line_error(r.output, f"{table}:3: {message}")


def test_augment_refuses_a_phrase_over_scores_limit(tmp_path, example_table, tiny_model):
    lines = example_table.read_text(encoding="utf-8").splitlines(keepends=True)
    lines.insert(3, f"a big book ||| {' '.join(['livre'] * 1001)} ||| 0.5 0.5 0.5 0.5 ||| ||| 1 1 1 ||| |||\n")
    r, table, out = augment(tmp_path, tiny_model, lines)
    assert r.exit_code == 1 and not out.exists()
    assert_one_line_error(r.output, f"{table}:4: target phrase of 1001 words, more than the limit of 1000")


def test_augment_with_max_growth_refuses_a_pipe(pipe, tmp_path, example_table, tiny_model):
    """--max-growth counts the table's lines first: a pipe read twice would lose them."""
    (tmp_path / "lex.f2e").write_text(LEX_F2E)
    (tmp_path / "lex.e2f").write_text(LEX_E2F)
    r = invoke(rnn_main, "augment", pipe(example_table.read_bytes()), "-m", tiny_model, "-o", tmp_path / "out",
               "--quiet", "--max-growth", "0.1", "--lex-f2e", tmp_path / "lex.f2e", "--lex-e2f", tmp_path / "lex.e2f")
    assert r.exit_code == 1 and not (tmp_path / "out").exists()
    assert_one_line_error(r.output, "--max-growth", "not a pipe")
