"""Table 2, Figures 3-5 and the exported vectors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from click.testing import CliRunner

from moses_rnn.analysis.analyze import embedding_map, long_sources, phrase_map, score_scatter, table2
from moses_rnn.cli import main
from moses_rnn.networks.modelio import load_model
from mtcommon.textio import InputError

PNG = b"\x89PNG\r\n\x1a\n"


def line(src: str, tgt: str, p_direct: float, rnn_logp: float, count_src: int) -> str:
    # Moses order p(f|e) lex(f|e) p(e|f) lex(e|f), then the RNN column e^{log p}
    scores = f"0.5 0.1 {p_direct:g} 0.1 {math.exp(rnn_logp):.7g}"
    return f"{src} ||| {tgt} ||| {scores} ||| 0-0 ||| 10 {count_src} 1 ||| |||\n"


@pytest.fixture
def scored_table(tmp_path):
    rows = []
    # frequent long phrases: counts 500, 300, 200
    for src, count in (("at the end of", 500), ("in the light of", 300), ("on the basis of", 200)):
        rows += [line(src, "t1", 0.6, -5.0, count), line(src, "t2", 0.3, -1.0, count),
                 line(src, "t3", 0.05, -2.0, count), line(src, "t4", 0.05, -9.0, count)]
    rows += [line("a very rare long phrase", "r1", 0.5, -3.0, 1), line("a very rare long phrase", "r2", 0.5, -2.0, 1)]
    rows += [line("short one", "s1", 0.9, -1.0, 1000), line("short one", "s2", 0.1, -2.0, 1000)]
    rows += [line("a single target long phrase", "x", 1.0, -1.0, 1)]  # fewer than min_targets
    path = tmp_path / "scored.phrase-table"
    path.write_text("".join(rows), encoding="utf-8")
    return path


def test_table2_splits_by_count_and_ranks_both_columns(scored_table):
    t = table2(str(scored_table), per_group=2)
    assert t.long_sources == 5
    assert [e.source for e in t.frequent] == ["at the end of", "in the light of"]  # the two most frequent
    assert [e.source for e in t.rare] == ["a very rare long phrase"]
    e = t.frequent[0]
    assert [x for x, _ in e.by_tm] == ["t1", "t2", "t3"]  # by p(e|f); ties broken by target
    assert [x for x, _ in e.by_rnn] == ["t2", "t3", "t1"]  # by the RNN column
    assert e.by_rnn[0][1] == pytest.approx(-1.0, abs=1e-6)
    md = t.markdown()
    assert "### Frequent source phrases" in md and "### Rare source phrases" in md
    assert "| at the end of | 500 | t1 (0.6)<br>t2 (0.3)<br>t3 (0.05) | t2 (-1.00)<br>t3 (-2.00)<br>t1 (-5.00) |" in md
    assert "short one" not in md


def test_table2_needs_grouped_table_and_counts(tmp_path):
    ungrouped = tmp_path / "u.pt"
    ungrouped.write_text(line("one two three four", "a", 0.5, -1, 2) + line("five six seven eight", "b", 0.5, -1, 2)
                         + line("one two three four", "c", 0.5, -1, 2), encoding="utf-8")
    with pytest.raises(InputError, match=r"u.pt:3: .*not grouped"):
        table2(str(ungrouped))
    no_counts = tmp_path / "n.pt"
    no_counts.write_text("one two three four ||| a ||| 0.5 0.5 0.5 0.5 0.5\n" * 2, encoding="utf-8")
    with pytest.raises(InputError, match=r"n.pt:1: no counts field"):
        table2(str(no_counts))


def test_scatter_png_and_correlation(scored_table, tmp_path):
    out = tmp_path / "fig3.png"
    r = score_scatter(str(scored_table), str(out), max_points=5, seed=1)
    assert r["pairs"] == 17 and r["points"] == 5
    assert out.read_bytes()[:8] == PNG
    full = score_scatter(str(scored_table), str(out))
    assert -1.0 <= full["pearson"] <= 1.0


def test_rnn_column_found_beside_the_unknown_word_count(tiny_model, example_table, tmp_path):
    """A table scored with --unknown ends in the unknown-word count; the analysis reads the RNN column
    before it, by itself, and refuses a table whose columns it cannot tell apart."""
    from moses_rnn.analysis.analyze import sample_scores
    from moses_rnn.formats.phrasetable import read_phrase_table

    table, scored = tmp_path / "table", tmp_path / "scored.gz"
    table.write_text(example_table.read_text(encoding="utf-8") + "zyx wvu big book ||| zyx grand livre ||| "
                     "0.5 0.4 0.3 0.2 ||| 0-0 1-1 2-2 3-2 ||| 1 1 1 ||| |||\n", encoding="utf-8")
    r = CliRunner().invoke(main, ["score", str(table), "-m", str(tiny_model), "-o", str(scored), "--unknown",
                                  "--quiet", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    rows = [p.scores for p in read_phrase_table(str(scored))]
    assert {len(s) for s in rows} == {6} and rows[-1][5] == pytest.approx(math.exp(3))  # zyx twice, wvu
    x, y, n = sample_scores(str(scored))
    assert n == len(rows)
    assert np.allclose(y, [math.log(s[4]) for s in rows]) and np.allclose(x, [math.log(s[2]) for s in rows])
    t = table2(str(scored), min_words=3, per_group=1, min_targets=2)
    lp = {(p.source, p.target): math.log(p.scores[4]) for p in read_phrase_table(str(scored))}
    entry = (t.frequent + t.rare)[0]
    assert [v for _, v in entry.by_rnn] == pytest.approx([lp[entry.source, w] for w, _ in entry.by_rnn])
    # the table before scoring: its last score is Moses's lex(e|f), not the RNN's
    r = CliRunner().invoke(main, ["analyze", "scatter", str(example_table), "-o", str(tmp_path / "f.png")])
    assert r.exit_code == 1 and "cannot tell which of its 4 scores is the RNN's" in r.output
    assert r.output.count("\n") == 1 and not (tmp_path / "f.png").exists()
    # a column given by hand that holds a count is refused on the first line that is not a probability
    r = CliRunner().invoke(main, ["analyze", "scatter", str(scored), "--rnn-column", "5", "-o", str(tmp_path / "f.png")])
    assert r.exit_code == 1 and f"{scored}:{len(rows)}: score column 5 is 20.0855, more than 1" in r.output


def test_word_map_and_vector_export(tiny_model, tmp_path):
    loaded = load_model(str(tiny_model))
    out, prefix = tmp_path / "fig4.png", tmp_path / "words"
    r = embedding_map(loaded, str(out), words=20, labels=15, vectors=str(prefix))
    assert out.read_bytes()[:8] == PNG
    assert r.points == 20 and 1 <= r.labels <= 15
    vecs = np.loadtxt(f"{prefix}.vectors.tsv", delimiter="\t")
    labels = open(f"{prefix}.labels.tsv", encoding="utf-8").read().splitlines()
    assert vecs.shape == (20, loaded.config.embed) and len(labels) == 20
    assert np.allclose(vecs[0], loaded.model.source_embeddings().weight[loaded.src_vocab.index[labels[0]]].detach(),
                       atol=1e-5)


def test_phrase_map(tiny_model, scored_table, tmp_path):
    assert long_sources(str(scored_table), limit=2) == ["at the end of", "in the light of"]
    out, prefix = tmp_path / "fig5.png", tmp_path / "phrases"
    r = phrase_map(load_model(str(tiny_model)), str(scored_table), str(out), vectors=str(prefix))
    assert r.points == 5 and out.read_bytes()[:8] == PNG
    assert np.loadtxt(f"{prefix}.vectors.tsv", delimiter="\t").shape == (5, load_model(str(tiny_model)).config.hidden)


def test_cli_analyze(scored_table, tmp_path):
    runner = CliRunner()
    md = tmp_path / "table2.md"
    r = runner.invoke(main, ["analyze", "table2", str(scored_table), "-o", str(md), "--per-group", "1"])
    assert r.exit_code == 0, r.output
    assert "at the end of" in md.read_text(encoding="utf-8")
    r = runner.invoke(main, ["analyze", "scatter", str(scored_table), "-o", str(tmp_path / "f3.png")])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["analyze", "table2", str(scored_table), "--rnn-column", "9"])
    assert r.exit_code != 0 and "scored.phrase-table:1" in r.output


def test_training_curves_read_the_checkpoint_history(tiny_model, tmp_path):
    from moses_rnn.analysis.analyze import training_history

    history = training_history(str(tiny_model))  # 60 steps, evaluated every 30 (conftest)
    assert [h.step for h in history] == [30, 60] and all(h.valid_ppl > 1 for h in history)
    out = tmp_path / "curves.png"
    r = CliRunner().invoke(main, ["analyze", "curves", str(tiny_model), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:8] == PNG
    out.unlink()
    r = CliRunner().invoke(main, ["analyze", "curves", str(tiny_model), "-o", str(out), "--x", "updates"])
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:8] == PNG


def test_the_pipeline_report_draws_each_phrase_networks_curve(tiny_model, tmp_path):
    import shutil
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipelines"))
    import plots

    work = tmp_path / "w"
    assert not plots.plot_training(work, str(tmp_path / "none.png"))  # no network trained yet: no picture
    for folder in ("rnn", "rnnsearch"):
        shutil.copytree(tiny_model, work / folder / "model")
    out = tmp_path / "training.png"
    assert plots.plot_training(work, str(out)) and out.read_bytes()[:8] == PNG


def test_a_label_goes_to_the_first_free_corner_or_nowhere():
    from moses_rnn.analysis.analyze import place_label

    frame, size = (0, 0, 200, 100), (30, 10)
    assert place_label((100, 50), size, [], [], frame, gap=4, shift=2) == (102, 52, 132, 62)  # right, above
    right_above = (102, 52, 132, 62)
    assert place_label((100, 50), size, [right_above], [], frame, 4, 2) == (68, 52, 98, 62)  # left, above
    assert place_label((190, 95), size, [], [], frame, 4, 2) == (158, 83, 188, 93)  # at the frame's corner
    # a neighbour's label just right of the free corner's box, less than the gap away: the next corner
    assert place_label((100, 50), size, [(134, 52, 160, 62)], [], frame, 4, 2) == (68, 52, 98, 62)
    # a labelled point may sit right beside a label, not under it
    assert place_label((100, 50), size, [], [(132.5, 50, 134, 52)], frame, 4, 2) == (102, 52, 132, 62)
    assert place_label((100, 50), size, [], [(120, 55, 122, 57)], frame, 4, 2) == (68, 52, 98, 62)
    crowd = [(0, 0, 200, 45), (0, 55, 200, 100)]  # nothing free above or below the point
    assert place_label((100, 50), size, crowd, [], frame, 4, 2) is None


def test_map_labels_never_touch(tmp_path):
    """Words whose points (nearly) coincide, 'the' and 'a' among them: each drawn label is clear of
    every other by at least a few pixels, never run together ('thea'), and the two are both labelled."""
    from moses_rnn.analysis.analyze import labelled_map

    rng = np.random.default_rng(0)
    points = np.concatenate([[[0.0, 0.0], [0.002, 0.0], [0.004, 0.001]], rng.normal(size=(300, 2))])
    labels = ["the", "a", "of"] + [f"w{i}" for i in range(300)]
    drawn = labelled_map(points, labels, str(tmp_path / "map.png"), "map", max_labels=80)
    assert 40 <= len(drawn) <= 80 and (tmp_path / "map.png").read_bytes()[:8] == PNG
    boxes = [box for _, box in drawn]
    assert min(max(b[0] - a[2], a[0] - b[2], b[1] - a[3], a[1] - b[3])
               for i, a in enumerate(boxes) for b in boxes[:i]) >= 3  # pixels
    assert [i for i, _ in drawn[:2]] == [0, 1]  # 'the' and 'a' both labelled, at two corners of their point


def test_every_picture_has_a_title_axis_names_and_a_key(monkeypatch, scored_table, tmp_path):
    """Each figure the analysis draws is read on its own: a title, both axes named, and a legend (or,
    for the alignment's shades of grey, a colour bar with its name)."""
    from moses_rnn.analysis import align, analyze
    from moses_rnn.analysis.align import Alignment, draw_alignment, draw_alignments
    from moses_rnn.analysis.analyze import labelled_map

    figures = []
    for module in (analyze, align):
        monkeypatch.setattr(module, "save_figure", lambda fig, path, dpi=150: figures.append(fig))
    score_scatter(str(scored_table), str(tmp_path / "s.png"))
    labelled_map(np.random.default_rng(0).normal(size=(50, 2)), [f"w{i}" for i in range(50)], str(tmp_path / "m.png"),
                 "word map")
    a = Alignment(["a", "cat"], ["un", "chat", "</s>"], np.full((3, 2), 0.5))
    draw_alignment(a, str(tmp_path / "a.png"))
    draw_alignments([a] * 3, str(tmp_path / "b.png"), ["one", "two", "three"], "several")
    assert len(figures) == 4
    several = figures.pop()  # three panels and an empty fourth, each panel with its colour bar
    assert [ax.get_title() for ax in several.axes[:3]] == ["one", "two", "three"] and several._suptitle.get_text() == "several"
    assert sum(bool(ax.get_xlabel() and ax.get_ylabel()) for ax in several.axes) == 3
    assert len(figures) == 3
    for fig in figures:
        ax = fig.axes[0]
        assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    scatter, word_map, alignment = figures
    assert [t.get_text() for t in scatter.axes[0].get_legend().get_texts()] == ["one phrase pair"]
    assert len(word_map.axes[0].get_legend().get_texts()) == 2
    assert len(alignment.axes) == 2 and "alignment weight" in alignment.axes[1].get_ylabel()  # the colour bar


def test_columns_compare_tables_scored_by_different_models(example_table, tmp_path):
    """`analyze columns`: Pearson r of each column with p(e|f) (as numpy computes it), over all pairs and over
    the shortlist misses the first table's unknown-word column marks; examples where the best targets differ."""
    import math

    import numpy as np

    from moses_rnn.analysis.columns import compare_columns
    from moses_rnn.formats.phrasetable import read_phrase_table

    runner = CliRunner()
    tables = []
    for name, extra in (("words", ["--src-vocab", "12", "--tgt-vocab", "12"]), ("units", ["--subwords", "300"])):
        model = tmp_path / name
        r = runner.invoke(main, ["train", str(example_table), "-o", str(model), "--preset", "tiny", "--max-steps", "4",
                                 "--valid-pairs", "20", "--quiet", *extra])
        assert r.exit_code == 0, r.output
        tables.append(str(tmp_path / f"{name}.gz"))
        r = runner.invoke(main, ["score", str(example_table), "-m", str(model), "-o", tables[-1], "--quiet",
                                 *(["--unknown"] if name == "words" else [])])
        assert r.exit_code == 0, r.output
    result = compare_columns(tables, ["RNN", "subword RNN"], min_words=3, examples=4)
    words, units = list(read_phrase_table(tables[0])), list(read_phrase_table(tables[1]))
    x = np.log([p.scores[2] for p in words])
    ys = [np.log([p.scores[4] for p in words]), np.log([p.scores[4] for p in units])]
    miss = np.array([round(math.log(p.scores[5])) > 0 for p in words])
    assert result.pairs == len(words) == 404 and 0 < miss.sum() < len(words)
    for key, rows in (("all", slice(None)), ("shortlist miss", miss)):
        assert result.groups[key].n == len(x[rows])
        expected = [np.corrcoef(x[rows], y[rows])[0, 1] for y in ys]
        assert result.groups[key].pearson() == pytest.approx(expected, abs=1e-9)
    assert result.examples and all(e.by_column[0][0][0] != e.by_column[1][0][0] for e in result.examples)
    out = tmp_path / "columns.md"
    r = runner.invoke(main, ["analyze", "columns", *tables, "--label", "RNN", "--label", "subword", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "r(subword, p(e\\|f))" in out.read_text()
    # tables that do not hold the same pairs line by line
    r = runner.invoke(main, ["analyze", "columns", tables[0], str(tmp_path / "short.gz")])
    assert r.exit_code != 0
    import gzip

    with gzip.open(tables[1], "rt") as f:
        head = f.readlines()[:100]
    with gzip.open(tmp_path / "short.gz", "wt") as f:
        f.writelines(head)
    r = runner.invoke(main, ["analyze", "columns", tables[0], str(tmp_path / "short.gz")])
    assert r.exit_code != 0 and "short.gz" in r.output and "not the same table" in r.output


def test_learning_stats_of_a_phrase_model(tiny_model):
    """A network trained on a phrase table: its unique pairs and held-out split rebuilt from the table."""
    import math

    from moses_rnn.analysis.learning import learning_stats
    from moses_rnn.networks.modelio import load_model

    meta = load_model(str(tiny_model)).meta
    s = learning_stats(str(tiny_model), sample=50)
    assert s.heldout.pairs == 20 and s.train.pairs == 50 and s.updates == meta["step"] and s.dev is None
    assert s.heldout.per_pair == pytest.approx(math.log(meta["valid_ppl"]) * meta["valid_target_words"] / 20, rel=1e-4)
