"""The moses.ini editor, on the real moses.ini files of ../shared/data."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from moses_rnn.cli import main
from moses_rnn.formats.mosesini import IniError, MosesIni, check_name

INIS = ["en-fr-moses/moses.ini", "moses-sample/moses.ini"]


def _changed(before: str, after: str) -> list[tuple[str, str]]:
    """Lines that differ, as (before, after); insertions pair with ''."""
    import difflib

    out = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, before.splitlines(), after.splitlines()).get_opcodes():
        if tag != "equal":
            out.append(("\n".join(before.splitlines()[i1:i2]), "\n".join(after.splitlines()[j1:j2])))
    return out


@pytest.mark.parametrize("rel", INIS)
def test_round_trip_is_exact(shared_data, rel):
    text = (shared_data / rel).read_text()
    assert MosesIni.parse(text).render() == text


def test_default_names_follow_moses(shared_data):
    ini = MosesIni.read(str(shared_data / "moses-sample" / "moses.ini"))
    names = [f.name for f in ini.features]
    assert names == ["KENLM0", "Distortion0", "WordPenalty0", "UnknownWordPenalty0", "PhraseDictionaryMemory0"]
    assert [t.name for t in ini.phrase_tables()] == ["PhraseDictionaryMemory0"]
    assert ini.weights("PhraseDictionaryMemory0") == [0.2] * 5


def test_add_columns_real_ini(shared_data):
    path = shared_data / "en-fr-moses" / "moses.ini"
    text = path.read_text()
    ini = MosesIni.parse(text)
    ini.add_columns("TranslationModel0", 1, 0.2, path="phrase-table.rnn.gz")
    ini.add_columns("TranslationModel0", 1, 0.0, fixed=True, check_table=False)
    out = ini.render()
    changes = _changed(text, out)
    assert len(changes) == 2  # the feature line and the weight line, nothing else
    feat = MosesIni.parse(out).feature("TranslationModel0")
    assert feat.get("num-features") == "6"
    assert feat.get("path") == "phrase-table.rnn.gz"
    assert feat.get("tuneable-components") == "true,true,true,true,true,false"
    assert feat.get("input-factor") == "0" and feat.type == "PhraseDictionaryMemory"
    assert MosesIni.parse(out).weights("TranslationModel0") == [0.2, 0.2, 0.2, 0.2, 0.2, 0.0]


def test_add_columns_only_table_by_default(shared_data):
    ini = MosesIni.read(str(shared_data / "moses-sample" / "moses.ini"))
    ini.add_columns(None, 2, [0.3, -0.1], check_table=False)
    assert ini.feature("PhraseDictionaryMemory0").get("num-features") == "7"
    assert ini.weights("PhraseDictionaryMemory0") == [0.2] * 5 + [0.3, -0.1]


def test_add_feature_and_remove(shared_data):
    path = shared_data / "moses-sample" / "moses.ini"
    text = path.read_text()
    ini = MosesIni.parse(text)
    feat = ini.add_feature("CSLM name=CSLM0 host=127.0.0.1 port=5000 order=7 path=model", [0.1, -0.2])
    assert feat.name == "CSLM0" and feat.num_scores() == 2
    out = ini.render()
    assert "CSLM name=CSLM0 host=127.0.0.1 port=5000 order=7 path=model" in out.splitlines()
    assert "CSLM0= 0.1 -0.2" in out.splitlines()
    assert len(_changed(text, out)) == 2
    # the [feature] line lands in [feature], the weight in [weight]
    lines = out.splitlines()
    assert lines.index("[feature]") < lines.index("CSLM name=CSLM0 host=127.0.0.1 port=5000 order=7 path=model") \
        < lines.index("[weight]") < lines.index("CSLM0= 0.1 -0.2")
    ini.remove_feature("CSLM0")
    assert ini.render() == text


def test_add_feature_one_score(shared_data):
    ini = MosesIni.read(str(shared_data / "en-fr-moses" / "moses.ini"))
    feat = ini.add_feature("CSLM name=CSLM0 port=1 num-features=1")
    assert ini.weights(feat.name) == [0.1]


def test_add_feature_default_name(shared_data):
    ini = MosesIni.read(str(shared_data / "moses-sample" / "moses.ini"))
    assert ini.add_feature("WordPenalty").name == "WordPenalty1"


@pytest.mark.parametrize("line,weights,msg", [
    ("CSLM name=CSLM_0", None, "not usable by MERT"),
    ("CSLM name=LM0", None, "used twice"),
    ("CSLM name=CSLM0", [0.1], "2 scores but 1 weights"),
    ("Mystery name=M0", None, "num-features"),
])
def test_add_feature_errors_leave_file_alone(shared_data, line, weights, msg):
    text = (shared_data / "en-fr-moses" / "moses.ini").read_text()
    ini = MosesIni.parse(text)
    with pytest.raises(ValueError, match=msg):
        ini.add_feature(line, weights)
    assert ini.render() == text


def test_add_columns_errors(shared_data):
    ini = MosesIni.read(str(shared_data / "en-fr-moses" / "moses.ini"))
    with pytest.raises(IniError, match="no feature named"):
        ini.add_columns("TM9", 1)
    with pytest.raises(IniError, match="3 weights given for 2"):
        ini.add_columns("TranslationModel0", 2, [1, 2, 3])


def _table_and_ini(folder, scores: int, table: str = "pt"):
    """A one-line phrase table with `scores` scores (gzip if `table` ends in .gz) and a moses.ini
    declaring 4 of them, its path= `pt`."""
    import gzip

    line = ("a ||| b ||| " + " ".join(["0.5"] * scores) + " ||| 0-0\n").encode()
    (folder / table).write_bytes(gzip.compress(line) if table.endswith(".gz") else line)
    ini = folder / "moses.ini"
    ini.write_text("[feature]\nPhraseDictionaryMemory name=TranslationModel0 num-features=4 path=pt\n\n"
                   "[weight]\nTranslationModel0= 0.2 0.2 0.2 0.2\n")
    return ini


def _add_columns(*args):
    return CliRunner().invoke(main, ["ini", "add-columns", *map(str, args)])


def test_add_columns_without_path_needs_the_columns_in_the_table(tmp_path, monkeypatch):
    """Without --path the ini keeps its table, so num-features may only grow to the table's own count:
    Moses refuses a table whose lines have another number of scores."""
    monkeypatch.chdir(tmp_path)  # Moses reads a relative path= from the folder it runs in
    ini = _table_and_ini(tmp_path, 4)
    r = _add_columns(ini, "--count", "2", "-o", tmp_path / "out.ini")
    assert r.exit_code == 1 and not (tmp_path / "out.ini").exists()
    assert r.output.count("\n") == 1 and str(ini) in r.output and "pt has 4 scores a line, not the 6" in r.output
    # the scored table named with --path, or the user's word that the table has them
    assert _add_columns(ini, "--count", "2", "--path", "pt.rnn", "-o", tmp_path / "out.ini").exit_code == 0
    assert MosesIni.read(str(tmp_path / "out.ini")).feature("TranslationModel0").get("num-features") == "6"
    assert _add_columns(ini, "--count", "2", "--table-has-columns", "-o", tmp_path / "out2.ini").exit_code == 0
    # a table that has them passes the check (as pt.gz: Moses adds .gz to a path that does not exist)
    (tmp_path / "pt").unlink()
    _table_and_ini(tmp_path, 6, "pt.gz")
    assert _add_columns(ini, "--count", "2", "-o", tmp_path / "out3.ini").exit_code == 0
    r = _add_columns(ini, "--count", "1", "-o", tmp_path / "out4.ini")
    assert r.exit_code == 1 and "has 6 scores a line, not the 5" in r.output
    (tmp_path / "pt.gz").unlink()
    r = _add_columns(ini, "--count", "2", "-o", tmp_path / "out4.ini")
    assert r.exit_code == 1 and "pt is not a file here" in r.output


def test_copy_weights_takes_the_other_files_weight_section(shared_data):
    """A tuned model's weights into a filtered copy of it: the [weight] lines as they are, every other
    line of the copy kept; refused when the two weight other features or a file has no [weight]."""
    text = (shared_data / "en-fr-moses" / "moses.ini").read_text()
    head, weights = text.split("[weight]\n")
    tuned_weights = "LM0= 0.05\nTranslationModel0= 0.1 -0.2 0.3 0.04\n" + "".join(  # other values, other order
        line.replace("0.", "0.0") + "\n" for line in weights.splitlines() if line[:3] not in ("LM0", "Tra"))
    tuned = MosesIni.parse(head.replace("lm.fr.5.arpa.gz", "/elsewhere/lm.bin") + "[weight]\n" + tuned_weights)
    filtered = MosesIni.parse(text.replace("path=phrase-table.gz", "path=filtered/phrase-table.gz"))
    filtered.copy_weights(tuned)
    assert filtered.render().endswith("[weight]\n" + tuned_weights)
    assert filtered.weights("TranslationModel0") == [0.1, -0.2, 0.3, 0.04]
    assert filtered.feature("TranslationModel0").get("path") == "filtered/phrase-table.gz"
    assert filtered.feature("LM0").get("path") == "lm.fr.5.arpa.gz"  # only the weights are copied
    other = MosesIni.parse(text, "other.ini")
    other.add_feature("CSLM name=CSLM0 num-features=1", [0.1])
    with pytest.raises(IniError, match=r"other.ini weights features \[.*'CSLM0'\], moses.ini has"):
        filtered.copy_weights(other)
    with pytest.raises(IniError, match=r"^none.ini: expected one \[weight\] section, found 0$"):
        filtered.copy_weights(MosesIni.parse("[feature]\nWordPenalty\n", "none.ini"))


def test_missing_weight_section_is_created():
    ini = MosesIni.parse("[feature]\nWordPenalty\n")
    ini.add_feature("CSLM name=CSLM0", [1, 2])
    assert ini.render() == "[feature]\nWordPenalty\nCSLM name=CSLM0\n\n[weight]\nCSLM0= 1 2\n"


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="abc[]=# \n\r\t_0", max_size=80))
def test_round_trip_any_text(text):
    try:
        ini = MosesIni.parse(text)
    except ValueError:
        return  # duplicate names are refused
    assert ini.render() == text


@given(st.from_regex(r"[A-Za-z][A-Za-z0-9]{0,8}", fullmatch=True))
def test_names_without_underscore_pass(name):
    assert check_name(name) == name


def test_cli(shared_data, tmp_path):
    src = shared_data / "en-fr-moses" / "moses.ini"
    out = tmp_path / "a.ini"
    r = CliRunner().invoke(main, ["ini", "add-columns", str(src), "--table", "TranslationModel0", "--count", "1",
                                  "--weight", "0.3", "--path", "pt.rnn.gz", "-o", str(out)])
    assert r.exit_code == 0, r.output
    out2 = tmp_path / "b.ini"
    r = CliRunner().invoke(main, ["ini", "add-feature", str(out), "CSLM", "name=CSLM0", "port=5000", "order=7",
                                  "-w", "0.1", "-w", "-0.5", "-o", str(out2)])
    assert r.exit_code == 0, r.output
    out3 = tmp_path / "c.ini"
    r = CliRunner().invoke(main, ["ini", "remove-feature", str(out2), "LexicalReordering0", "-o", str(out3)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["ini", "set", str(out3), "LM0", "path=lm.bin", "-o", str(out3)])
    assert r.exit_code == 0, r.output
    ini = MosesIni.read(str(out3))
    assert ini.weights("TranslationModel0") == [0.2] * 4 + [0.3]
    assert ini.weights("CSLM0") == [0.1, -0.5]
    assert ini.feature("LM0").get("path") == "lm.bin"
    assert "LexicalReordering" not in out3.read_text()
    r = CliRunner().invoke(main, ["ini", "add-feature", str(src), "CSLM", "name=my_lm", "-o", str(out)])
    assert r.exit_code != 0 and "not usable by MERT" in r.output


def test_set_weights_replaces_one_feature_line_only(tmp_path):
    """`ini weight` rewrites one feature's [weight] line, keeps every other line, and refuses a
    feature the file lacks or a count other than the feature's."""
    src = tmp_path / "a.ini"
    src.write_text("[feature]\nKENLM name=LM0 factor=0 path=lm.bin order=5\nWordPenalty\n"
                   "PhraseDictionaryMemory name=TranslationModel0 num-features=2 path=pt.gz input-factor=0 "
                   "output-factor=0\n\n[weight]\nLM0= 0.5\nWordPenalty0= -1\nTranslationModel0= 0.2 0.2\n")
    out = tmp_path / "b.ini"
    r = CliRunner().invoke(main, ["ini", "weight", str(src), "LM0", "0.4", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_text() == src.read_text().replace("LM0= 0.5", "LM0= 0.4")
    r = CliRunner().invoke(main, ["ini", "weight", str(src), "TranslationModel0", "0.1", "0.3", "-o", str(out)])
    assert r.exit_code == 0 and MosesIni.read(str(out)).weights("TranslationModel0") == [0.1, 0.3]
    for args, message in [(["LM0", "0.4", "0.1"], "LM0 has 1 weight(s)"), (["CSLM0", "0.1"], "no feature named 'CSLM0'"),
                          (["LM0", "nan"], "LM0")]:
        before = out.read_text()
        r = CliRunner().invoke(main, ["ini", "weight", str(src), *args, "-o", str(out)])
        assert r.exit_code != 0 and message in r.output and "Traceback" not in r.output, r.output
        assert out.read_text() == before  # nothing written on a refusal
