"""moses-rnn augment: generated target phrases added to a Moses phrase table."""

import gzip
import math

import pytest
from click.testing import CliRunner

from moses_rnn.cli import main
from moses_rnn.formats.lexical import LexicalTable
from moses_rnn.formats.phrasetable import read_phrase_table
from moses_rnn.scoring.scorer import PhraseScorer

LEX_F2E = "la the 0.5\nle the 0.4\nmaison house 0.6\nrouge red 0.8\nvoiture car 0.7\nla NULL 0.05\nune NULL 0.1\n"
LEX_E2F = "the la 0.6\nthe le 0.3\nhouse maison 0.9\nred rouge 0.7\ncar voiture 0.8\nthe NULL 0.2\na NULL 0.3\n"


def test_lexical_weight_is_the_phrase_scorers():
    """score-main.cpp's computeLexicalTranslation: the mean over a word's links, w(e|NULL) for an unlinked
    word, 1.0 for a pair the file lacks."""
    lex = LexicalTable({("la", "the"): 0.5, ("le", "the"): 0.4, ("maison", "house"): 0.6, ("maison", "the"): 0.2,
                        ("rouge", "NULL"): 0.1})
    # maison linked to the and house: (0.2 + 0.6) / 2; rouge unlinked: w(rouge|NULL); bleu|house absent: 1.0
    assert lex.weight(["la", "maison", "rouge"], ["the", "house"], [(0, 0), (0, 1), (1, 1)]) == \
        pytest.approx(0.5 * 0.4 * 0.1)
    assert lex.weight(["bleu"], ["house"], [(0, 0)]) == 1.0
    assert lex.best_links(["la", "maison", "xyz"], ["the", "house"]) == [(0, 0), (1, 1)]


@pytest.fixture()
def lex_files(tmp_path):
    (tmp_path / "lex.f2e").write_text(LEX_F2E)
    (tmp_path / "lex.e2f").write_text(LEX_E2F)
    return tmp_path / "lex.f2e", tmp_path / "lex.e2f"


def run_augment(table, model, out, lex, *args):
    return CliRunner().invoke(main, ["augment", str(table), "-m", str(model), "-o", str(out), "--lex-f2e",
                                     str(lex[0]), "--lex-e2f", str(lex[1]), "--quiet", *args])


def read(path):
    data = open(path, "rb").read()
    return (gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).decode().splitlines(keepends=True)


def test_augment_keeps_every_line_and_adds_scored_generated_ones(example_table, tiny_model, lex_files, tmp_path):
    (tmp_path / "input.txt").write_text("house the red\na new car is here\n")
    out = tmp_path / "augmented.gz"
    r = run_augment(example_table, tiny_model, out, lex_files, "--input", str(tmp_path / "input.txt"), "--few", "2",
                    "--beam", "4", "--per-source", "2")
    assert r.exit_code == 0, r.output
    before, after = read(example_table), read(out)
    kept = [line for line in after if " 1 ||| " in line]
    added = [line for line in after if f" {math.e:.6f} ||| " in line]
    assert len(kept) == len(before) and len(kept) + len(added) == len(after) and added
    for old, new in zip(before, kept):  # byte for byte, one more score: 1 (ln 1 = 0)
        src, tgt, scores, rest = old.split(" ||| ", 3)
        assert new == f"{src} ||| {tgt} ||| {scores} 1 ||| {rest}"
    table = {}
    for p in read_phrase_table(str(example_table)):
        table.setdefault(p.source, set()).add(p.target)
    scorer = PhraseScorer.from_dir(str(tiny_model), device="cpu")
    lex_f2e, lex_e2f = (LexicalTable.load(str(f)) for f in lex_files)
    groups, order = {}, []
    for line in after:
        src, tgt, scores, align, counts, _ = line.split(" ||| ")
        if src not in groups:
            order.append(src)
        groups.setdefault(src, []).append(tgt)
        if line not in added:
            continue
        assert tgt not in table.get(src, set())  # only what the table lacks
        assert len(table.get(src, ())) <= 2  # (a) sources with few targets, or (b) new ones
        values = [float(v) for v in scores.split()]
        assert len(values) == 5 and values[4] == pytest.approx(math.e, abs=1e-5)
        assert values[2] == pytest.approx(math.exp(scorer.score([(src, tgt)])[0]), rel=1e-4)  # p(e|f): the network's
        links = [tuple(map(int, a.split("-"))) for a in align.split()]
        s, t = src.split(), tgt.split()
        assert all(0 <= j < len(s) and 0 <= i < len(t) for j, i in links)
        assert values[3] == pytest.approx(lex_f2e.weight(t, s, links), rel=1e-4)  # lex(e|f)
        assert values[1] == pytest.approx(lex_e2f.weight(s, t, [(i, j) for j, i in links]), rel=1e-4)  # lex(f|e)
        assert values[0] == values[1]  # p(f|e) := lex(f|e)
        assert counts.split()[0] == "0" and counts.split()[2] == "0"
    assert all(len([t for t in groups[s] if t not in table.get(s, set())]) <= 2 for s in groups)
    # new sources from the input, in Moses's sort order (LC_ALL=C, whole lines)
    assert "house the" in groups and "house the" not in table
    assert not any(w in ("is", "here") for s in order for w in s.split())  # words the network lacks
    keys = [(s + " ||| ").encode() for s in order]
    assert keys == sorted(keys)
    assert len(order) == len(set(order))  # each source's lines together


def test_augment_limits(example_table, tiny_model, lex_files, tmp_path):
    out = tmp_path / "a.txt"
    r = run_augment(example_table, tiny_model, out, lex_files, "--few", "5", "--max-new", "7")
    assert r.exit_code == 0, r.output
    assert len(read(out)) == len(read(example_table)) + 7
    r = run_augment(example_table, tiny_model, out, lex_files, "--few", "5", "--max-growth", "0.05")
    assert r.exit_code == 0, r.output
    assert len(read(out)) == len(read(example_table)) + int(0.05 * len(read(example_table)))
    r = run_augment(example_table, tiny_model, out, lex_files, "--few", "0")
    assert r.exit_code == 0 and len(read(out)) == len(read(example_table))


def test_augment_refuses_a_scored_or_unsorted_table(example_table, tiny_model, lex_files, tmp_path):
    scored = tmp_path / "scored.txt"
    scored.write_text("".join(line.replace(" ||| 0-0", " 0.5 ||| 0-0", 1) for line in read(example_table)))
    out = tmp_path / "out.txt"
    r = run_augment(scored, tiny_model, out, lex_files)
    assert r.exit_code != 0 and "5 scores per line" in r.output and not out.exists()
    lines = read(example_table)
    unsorted = tmp_path / "unsorted.txt"
    unsorted.write_text("".join(lines[200:] + lines[:200]))
    (tmp_path / "input.txt").write_text("the red house\n")
    r = run_augment(unsorted, tiny_model, out, lex_files, "--input", str(tmp_path / "input.txt"))
    assert r.exit_code != 0 and "not sorted" in r.output and not out.exists()
    r = run_augment(example_table, tiny_model, out, lex_files, "--alignment", "attention")
    assert r.exit_code != 0 and "RNNsearch" in r.output
    r = CliRunner().invoke(main, ["augment", str(example_table), "-m", str(tiny_model), "-o", str(out)])
    assert r.exit_code != 0 and "lex.f2e" in r.output


def test_usage_counts_the_generated_pairs_of_a_segmented_one_best(tmp_path):
    """analyze augmented: Moses's -t spans looked up among the indicator-e lines; bad traces fail by line."""
    from moses_rnn.analysis.augmented import segments

    table = tmp_path / "aug.gz"
    with gzip.open(table, "wt") as f:
        f.write("la maison ||| the house ||| 0.5 0.4 0.6 0.3 1 0.3 1 ||| 0-0 1-1 ||| 2 2 2 ||| |||\n"
                "rouge ||| red ||| 0.5 0.4 0.6 0.3 1 0.6 1 ||| 0-0 ||| 2 2 2 ||| |||\n"
                "rouge ||| scarlet ||| 0.1 0.1 0.2 0.1 2.718282 0.05 1 ||| 0-0 ||| 0 2 0 ||| |||\n"
                "voiture rouge ||| red car ||| 0.1 0.1 0.2 0.1 2.718282 0.1 1 ||| 1-0 0-1 ||| 0 0 0 ||| |||\n")
    (tmp_path / "src").write_text("la maison rouge\nvoiture rouge\nrouge\n")
    (tmp_path / "trace").write_text("the house |0-1| scarlet |2-2|\nred car |0-1|\nred |0-0|\n")
    assert segments("the house |0-1| |2-2| red |3-3|") == [("the house", 0, 1), ("", 2, 2), ("red", 3, 3)]
    out = tmp_path / "usage.json"
    r = CliRunner().invoke(main, ["analyze", "augmented", str(table), str(tmp_path / "trace"), str(tmp_path / "src"),
                                  "-o", str(out)])
    assert r.exit_code == 0, r.output
    import json
    u = json.loads(out.read_text())
    assert (u["table_lines"], u["generated_lines"], u["phrases"], u["generated_phrases_used"]) == (4, 2, 4, 2)
    assert u["sentence_ids"] == [0, 1] and u["distinct_generated_pairs_used"] == 2
    assert {(e["source"], e["target"], e["sentence"]) for e in u["examples"]} == {
        ("rouge", "scarlet", 1), ("voiture rouge", "red car", 2)}
    (tmp_path / "bad").write_text("the house |0-1| scarlet |2-2|\nred car |0-4|\nred |0-0|\n")
    r = CliRunner().invoke(main, ["analyze", "augmented", str(table), str(tmp_path / "bad"), str(tmp_path / "src")])
    assert r.exit_code != 0 and "bad:2" in r.output and "Traceback" not in r.output
    (tmp_path / "plain").write_text("the house scarlet\nred car\nred\n")
    r = CliRunner().invoke(main, ["analyze", "augmented", str(table), str(tmp_path / "plain"), str(tmp_path / "src")])
    assert r.exit_code != 0 and "plain:1" in r.output and "-t" in r.output


def test_a_source_with_a_word_the_network_lacks_gets_no_generated_target(example_table, tiny_model, lex_files,
                                                                         tmp_path):
    """(a) as (b): the network cannot translate a word outside its shortlist, so such a source keeps its lines."""
    table = tmp_path / "table"
    lines = read(example_table)
    lines.append("zzzunseen ||| inconnu ||| 0.5 0.5 0.5 0.5 ||| 0-0 ||| 1 1 1 ||| |||\n")  # last in sort order
    table.write_text("".join(lines))
    out = tmp_path / "augmented"
    r = run_augment(table, tiny_model, out, lex_files, "--few", "5")
    assert r.exit_code == 0, r.output
    added = [line for line in read(out) if f" {math.e:.6f} ||| " in line]
    assert added and not any(line.startswith("zzzunseen ||| ") for line in added)
    assert read(out)[-1].startswith("zzzunseen ||| inconnu ||| 0.5 0.5 0.5 0.5 1 |||")


def test_a_killed_augment_leaves_the_previous_output(example_table, tiny_model, lex_files, tmp_path):
    """SIGTERM in the middle of the run (at the first generation, with lines already written): the output
    that was there stays as it was, and no part file is left beside it."""
    import subprocess
    import sys

    out = tmp_path / "out.gz"
    out.write_bytes(gzip.compress(b"previous\n"))
    code = (
        "import os, signal, sys\n"
        "from moses_rnn.generation import generate\n"
        "orig = generate.Generator.beam_search\n"
        "n = [0]\n"
        "def beam_search(self, *a, **k):\n"
        "    n[0] += 1\n"
        "    if n[0] == 1: os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return orig(self, *a, **k)\n"
        "generate.Generator.beam_search = beam_search\n"
        "from moses_rnn.cli import main\n"
        f"sys.argv = ['moses-rnn', 'augment', {str(example_table)!r}, '-m', {str(tiny_model)!r}, '-o', {str(out)!r},"
        f" '--lex-f2e', {str(lex_files[0])!r}, '--lex-e2f', {str(lex_files[1])!r}, '--few', '3', '--quiet']\n"
        "main()\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 143, p.stderr
    assert gzip.decompress(out.read_bytes()) == b"previous\n"
    assert sorted(x.name for x in tmp_path.iterdir() if x.name.startswith("out")) == ["out.gz"]
