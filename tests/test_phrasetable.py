import gzip
import math

import numpy as np
import pytest

from moses_rnn.formats.phrasetable import format_columns, parse_line, parse_window, read_phrase_table, split_lines
from mtcommon.textio import InputError, iter_line_blocks
from mtcommon.outputs import atomic_output


def write(tmp_path, text, name="t.txt", mode="w"):
    p = tmp_path / name
    if name.endswith(".gz"):
        with gzip.open(p, "wb") as f:
            f.write(text if isinstance(text, bytes) else text.encode("utf-8"))
    elif isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text, encoding="utf-8", newline="")
    return str(p)


def appended(line: str, columns: bytes) -> str:
    """`line` as the table rewrite writes it with `columns` (formatted, leading space) added."""
    return parse_window(line.encode("utf-8"), "x", 1).with_columns([columns]).decode("utf-8")


def test_fields_and_insert_point_on_real_tables(shared_data):
    for rel in ["en-fr-moses/phrase-table.gz", "moses-sample/phrase-table.gz", "moses-sample/phrase-table.0-0.1.1.gz"]:
        path = str(shared_data / rel)
        _, block = next(iter_line_blocks(path, 2000))
        window = parse_window(block, path, 1)
        written = split_lines(window.with_columns([b" 0.5 2.718282"] * len(window)))
        assert len(written) == len(window) > 0
        for out, pair in zip(written, read_phrase_table(path)):
            out = out.decode("utf-8")
            head, tail = pair.line[: pair._scores_end], pair.line[pair._scores_end :]
            assert out == head + " 0.5 2.718282" + tail
            parts = out.split(" ||| ")
            assert parts[0] == pair.source and parts[1] == pair.target
            assert parts[2].split()[-2:] == ["0.5", "2.718282"]


def test_parse_keeps_every_other_byte():
    line = "das Haus ||| the house ||| 0.5 0.25 1 0.3 ||| 0-0 1-1 ||| 4 3 2 ||| |||\r\n"
    pair = parse_line(line, "x", 1)
    assert (pair.source, pair.target) == ("das Haus", "the house")
    assert pair.scores == [0.5, 0.25, 1.0, 0.3]
    assert pair.fields == ["0-0 1-1", "4 3 2", "", ""]
    assert appended(line, b" 9") == "das Haus ||| the house ||| 0.5 0.25 1 0.3 9 ||| 0-0 1-1 ||| 4 3 2 ||| |||\r\n"
    # three fields, no final newline
    assert appended("a ||| b ||| 0.5", b" 1") == "a ||| b ||| 0.5 1"
    assert appended("a ||| b ||| 0.5\n", b" 1") == "a ||| b ||| 0.5 1\n"


@pytest.mark.parametrize(
    "line, message",
    [
        ("a ||| b\n", "expected at least 3 fields"),
        ("just words\n", "expected at least 3 fields"),
        (" ||| b ||| 0.5\n", "empty source"),
        ("a |||  ||| 0.5\n", "empty target"),
        ("a ||| b ||| 0.5 x\n", "'x' is not a number"),
        ("a ||| b ||| 0.5 0\n", "not a positive"),
        ("a ||| b ||| -1\n", "not a positive"),
        ("a ||| b ||| nan\n", "not a positive"),
        ("a ||| b ||| inf\n", "not a positive"),
        ("a ||| b |||  ||| 0-0\n", "no scores"),
        ("a ||| b ||| 1 ||| 0-0 ||| 1 1 ||| s ||| p ||| extra\n", "at most 7"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, line, message):
    path = write(tmp_path, "ok ||| ok ||| 0.5\n" + line if "0.5" in line else line)
    lineno = 2 if "0.5" in line else 1
    with pytest.raises(InputError) as e:
        list(read_phrase_table(path))
    assert f"{path}:{lineno}:" in str(e.value)
    assert message in str(e.value)


def test_undecodable_bytes_and_score_count(tmp_path):
    path = write(tmp_path, b"a ||| b ||| 0.5\nc \xff ||| d ||| 0.5\n", name="bad.gz")
    with pytest.raises(InputError, match=r"bad.gz:2: invalid UTF-8"):
        list(read_phrase_table(path))
    path = write(tmp_path, "a ||| b ||| 0.5 0.5\nc ||| d ||| 0.5\n")
    with pytest.raises(InputError, match=r":2: 1 scores, the first line has 2"):
        list(read_phrase_table(path))


def test_gzip_is_sniffed_not_named(tmp_path):
    text = "a ||| b ||| 0.5\n"
    plain_named_gz = tmp_path / "plain.gz"
    plain_named_gz.write_text(text)
    gz_named_plain = write(tmp_path, text, name="x.gz")
    (tmp_path / "x.txt").write_bytes((tmp_path / "x.gz").read_bytes())
    for p in [str(plain_named_gz), gz_named_plain, str(tmp_path / "x.txt")]:
        assert [q.line for q in read_phrase_table(p)] == [text]


def test_columns_round_trip_through_ln_and_floor():
    ks = [0.0, -1.5, -42.0, 3.0, -1e9, -500.0]
    for cols in (1, 2, 3):
        rows = format_columns([[k] * cols for k in ks])
        for k, row in zip(ks, rows):
            assert row.startswith(b" ")
            values = [math.log(float(v)) for v in row.split()]
            assert len(values) == cols
            assert values == pytest.approx([max(k, -100.0)] * cols, abs=1e-6)
    assert format_columns(np.zeros((0, 2))) == []


def test_atomic_output_keeps_previous_file_on_failure(tmp_path):
    out = tmp_path / "out.gz"
    with atomic_output(str(out)) as f:
        f.write(b"first\n")
    with pytest.raises(RuntimeError):
        with atomic_output(str(out)) as f:
            f.write(b"second\n")
            raise RuntimeError("boom")
    assert gzip.decompress(out.read_bytes()) == b"first\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.gz"]
