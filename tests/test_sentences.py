"""Whole sentences: training on a parallel corpus, translating a file, rescoring Moses n-best lists."""

import json
import math

import pytest
import torch
from click.testing import CliRunner

from moses_rnn.cli import main
from moses_rnn.training.train import TrainConfig, read_corpus_pairs, train
from mtcommon.errors import UserError
from mtcommon.checkpoint import Checkpoint

SOURCES = ["the house is small", "the car is red", "a big house", "the red car is new", "my house",
           "a small car", "the new house is big", "this car", "that red house is old", "the old car"]
TARGETS = ["la maison est petite", "la voiture est rouge", "une grande maison", "la voiture rouge est neuve",
           "ma maison", "une petite voiture", "la nouvelle maison est grande", "cette voiture",
           "cette maison rouge est vieille", "la vieille voiture"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    (d / "c.en").write_text("\n".join(SOURCES * 4) + "\n\nword " + "x " * 40 + "\n")
    (d / "c.fr").write_text("\n".join(TARGETS * 4) + "\nun mot\n" + "y\n")
    return str(d / "c.en"), str(d / "c.fr")


def test_corpus_pairs_keep_order_and_duplicates_and_drop_empty_and_long_pairs(corpus):
    sources, targets = read_corpus_pairs(*corpus, max_len=30)
    assert sources == SOURCES * 4 and targets == TARGETS * 4  # the empty line and the 41-word one are left out
    assert len(read_corpus_pairs(*corpus)[0]) == 41


def test_a_corpus_whose_sides_differ_in_length_is_refused(corpus, tmp_path):
    short = tmp_path / "short.fr"
    short.write_text("une ligne\n")
    with pytest.raises(UserError, match="short.fr only 1"):
        read_corpus_pairs(corpus[0], str(short))


def test_training_on_sentences_resumes_exactly(corpus, tmp_path):
    base = dict(preset="tiny", eval_every=5, valid_pairs=4, device="cpu", seed=5, dtype="fp32", batch_size=8,
                corpus=corpus, max_len=30)
    full = train(None, str(tmp_path / "full"), TrainConfig(max_steps=20, **base), progress=False, trace=True)
    train(None, str(tmp_path / "half"), TrainConfig(max_steps=10, **base), progress=False)
    rest = train(None, str(tmp_path / "half"), TrainConfig(max_steps=20, **base), resume=True, progress=False,
                 trace=True)
    assert rest["loss_trace"] == pytest.approx(full["loss_trace"][10:], rel=1e-5)
    a, b = Checkpoint.load(str(tmp_path / "full")).model, Checkpoint.load(str(tmp_path / "half")).model
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), k
    assert full["corpus"] == list(corpus) and full["pairs"] == 40 and full["valid_target_words"] > full["valid_pairs"]


def test_train_takes_a_table_or_a_corpus(corpus, tmp_path, example_table):
    with pytest.raises(UserError, match="not both or neither"):
        train(str(example_table), str(tmp_path / "m"), TrainConfig(corpus=corpus))
    with pytest.raises(UserError, match="--max-len is for sentence pairs"):
        TrainConfig(max_len=30)


@pytest.fixture(scope="module")
def sentence_model(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("sentences") / "model"
    r = CliRunner().invoke(main, ["train", "--corpus", *corpus, "--max-len", "30", "-o", str(out), "--preset", "tiny",
                                  "--arch", "rnnsearch", "--max-steps", "30", "--valid-pairs", "4", "--quiet"])
    assert r.exit_code == 0, r.output
    return out


def test_translate_keeps_every_line_in_order(sentence_model, tmp_path):
    lines = ["the house", "", "qqq zzz xxx", "the " * 60, "the red car", ""]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.txt"
    r = CliRunner().invoke(main, ["translate", "-m", str(sentence_model), "-i", str(tmp_path / "in.txt"), "-o",
                                  str(out), "--batch", "2", "--quiet", "--len-ratio", "0.2"])
    assert r.exit_code == 0, r.output
    got = out.read_text().split("\n")[:-1]
    assert len(got) == len(lines)
    assert [bool(g) for g in got] == [bool(line) for line in lines]
    # each line as translated alone gives the same translation: the batching keeps the order
    for line, translation in zip(lines, got):
        if line:
            r = CliRunner().invoke(main, ["translate", line, "-m", str(sentence_model), "--quiet", "--len-ratio", "0.2"])
            assert r.output.strip() == translation


def test_replace_unk_puts_the_attended_source_word(sentence_model, tmp_path):
    from moses_rnn.generation.generate import Generator
    from moses_rnn.generation.translate import translate_lines
    from moses_rnn.networks.modelio import load_model

    gen = Generator(load_model(str(sentence_model)))
    with torch.no_grad():  # a model that writes [UNK] whenever it may
        bias = [p for n, p in gen.model.named_parameters() if n.startswith("output") and n.endswith("bias")][0]
        bias[gen.tgt_vocab.unk_id] += 1000.0
    source = "the qqq house"
    out = tmp_path / "out.txt"
    stats = translate_lines(gen, [source], str(out), replace_unk=True, progress=False, len_ratio=1.0, len_extra=0)
    words = out.read_text().split()
    assert stats.unknown_replaced == len(words) == 3 and set(words) <= set(source.split())
    plain = translate_lines(gen, [source], str(out), progress=False, len_ratio=1.0, len_extra=0)
    assert plain.unknown_replaced == 0 and out.read_text().split() == ["[UNK]"] * 3


def test_replace_unk_needs_attention(tmp_path, tiny_model):
    r = CliRunner().invoke(main, ["translate", "the house", "-m", str(tiny_model), "--replace-unk"])
    assert r.exit_code != 0 and "attention" in r.output


NBEST = ("0 ||| la maison ||| LM0= -10.5 TM0= -1 -2 ||| -5.25\n"
         "0 ||| une maison ||| LM0= -11 TM0= -1 -2 ||| -5.5 ||| 0-0 1-1\n"
         "2 |||  ||| LM0= -3 TM0= 0 0 ||| -1\n"
         "2 ||| la voiture rouge est neuve ||| LM0= -9 TM0= -3 -1 ||| -4.1\n")


def test_rescore_nbest_keeps_every_field_and_adds_one_finite_value(sentence_model, corpus, tmp_path):
    (tmp_path / "nbest").write_text(NBEST)
    out = tmp_path / "rescored"
    r = CliRunner().invoke(main, ["rescore-nbest", str(tmp_path / "nbest"), "-m", str(sentence_model), "--source",
                                  corpus[0], "-o", str(out), "--quiet"])
    assert r.exit_code == 0, r.output
    for before, after in zip(NBEST.splitlines(), out.read_text().splitlines(), strict=True):
        b, a = before.split(" ||| "), after.split(" ||| ")
        assert a[:2] == b[:2] and a[3:] == b[3:]  # id, hypothesis, total and the rest byte for byte
        assert a[2].startswith(b[2] + " RNN0= ")
        value = float(a[2].split("RNN0= ")[1])
        assert math.isfinite(value) and value < 0
    # the value is the scorer's log p(hypothesis | source)
    from moses_rnn.scoring.scorer import PhraseScorer

    expected = PhraseScorer.from_dir(str(sentence_model), device="cpu").score([(SOURCES[0], "la maison")])[0]
    assert float(out.read_text().splitlines()[0].split("RNN0= ")[1].split()[0]) == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("line,message", [("0 ||| x ||| y\n", "nbest:2: not a Moses n-best line"),
                                          ("x ||| y ||| z ||| 1\n", "nbest:2: not a Moses n-best line"),
                                          ("99 ||| x ||| y ||| 1\n", "nbest:2: sentence id 99")])
def test_a_bad_nbest_line_is_named(sentence_model, corpus, tmp_path, line, message):
    (tmp_path / "nbest").write_text(NBEST.splitlines(keepends=True)[0] + line)
    out = tmp_path / "rescored"
    r = CliRunner().invoke(main, ["rescore-nbest", str(tmp_path / "nbest"), "-m", str(sentence_model), "--source",
                                  corpus[0], "-o", str(out), "--quiet"])
    assert r.exit_code != 0 and message in r.output and "Traceback" not in r.output
    assert not out.exists()


def test_learning_stats_rebuild_the_trainers_split(sentence_model, corpus, tmp_path):
    """Table 2's numbers: the held-out NLL computed again equals the one the trainer saved the model on
    (so the held-out pairs are the trainer's), the train sample is drawn from the other pairs, and the
    dev NLL is the mean of -log p over the dev pairs."""
    import json

    from moses_rnn.analysis.learning import learning_stats
    from moses_rnn.networks.modelio import load_model
    from moses_rnn.scoring.scorer import PhraseScorer

    meta = load_model(str(sentence_model)).meta
    s = learning_stats(str(sentence_model), dev=corpus, sample=10)
    saved = math.log(meta["valid_ppl"]) * meta["valid_target_words"] / meta["valid_pairs"]
    assert s.heldout.pairs == 4 and s.heldout.per_pair == pytest.approx(saved, rel=1e-4)
    assert s.train.pairs == 10 and s.train_pairs == 36 and s.updates == meta["step"] == 30
    seen = Checkpoint.load(str(sentence_model)).loop.history[-1].examples_seen
    assert s.epochs == pytest.approx(seen / 36) and seen >= 30  # the rows of the batches up to the saved step
    assert s.hours is not None and 0 < s.hours < 1 and s.device.startswith("cpu")
    sources, targets = read_corpus_pairs(*corpus)
    lp = PhraseScorer.from_dir(str(sentence_model), device="cpu").score(list(zip(sources, targets)))
    assert s.dev.pairs == 41 and s.dev.per_pair == pytest.approx(-lp.mean(), rel=1e-5)

    out = tmp_path / "t2.json"
    r = CliRunner().invoke(main, ["analyze", "learning", str(sentence_model), "--label", "net", "--sample", "10",
                                  "-o", str(out)])
    assert r.exit_code == 0, r.output
    rows = json.loads(out.read_text())
    assert rows[0]["label"] == "net" and rows[0]["dev"] is None
    assert rows[0]["heldout"]["per_pair"] == pytest.approx(s.heldout.per_pair, rel=1e-6)
    r = CliRunner().invoke(main, ["analyze", "learning", str(sentence_model), "--sample", "10"])
    assert r.exit_code == 0 and "| model | 30 |" in r.output


def test_learning_stats_refuse_a_corpus_changed_since_training(sentence_model, corpus, tmp_path):
    import shutil

    from moses_rnn.analysis.learning import learning_stats

    copy = tmp_path / "model"
    shutil.copytree(sentence_model, copy)
    config = json.loads((copy / "config.json").read_text())
    (tmp_path / "c.en").write_text("one more line\n" + open(corpus[0]).read())
    (tmp_path / "c.fr").write_text("une ligne de plus\n" + open(corpus[1]).read())
    config["meta"]["corpus"] = [str(tmp_path / "c.en"), str(tmp_path / "c.fr")]
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="trained on 40 pairs, but its data now has 41"):
        learning_stats(str(copy), sample=5)


def test_align_draws_several_lines_of_a_file(sentence_model, corpus, tmp_path):
    """--input: the lines asked for (or the first 4 of 10-20 words), with the given targets or the model's
    translations, in one PNG; a bad line number or a target file of another length is one line naming it."""
    from moses_rnn.analysis.align import pick_lines

    assert pick_lines(["a " * 9, "b " * 10, "c " * 20, "d " * 21, "e " * 12, "f " * 15, "g " * 11], 3) == [1, 2, 4]
    out = tmp_path / "a.png"
    for extra in (["--lines", "1,3", "--targets", corpus[1]], ["--lines", "2"]):
        r = CliRunner().invoke(main, ["align", "-m", str(sentence_model), "-i", corpus[0], "-o", str(out), *extra])
        assert r.exit_code == 0, r.output
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        out.unlink()
    r = CliRunner().invoke(main, ["align", "-m", str(sentence_model), "-i", corpus[0], "-o", str(out),
                                  "--lines", "99"])
    assert r.exit_code != 0 and "has 42 lines, not line 99" in r.output and not out.exists()
    short = tmp_path / "short.fr"
    short.write_text("une ligne\n")
    r = CliRunner().invoke(main, ["align", "-m", str(sentence_model), "-i", corpus[0], "-o", str(out),
                                  "--lines", "1", "--targets", str(short)])
    assert r.exit_code != 0 and "short.fr has 1 lines" in r.output and not out.exists()
    r = CliRunner().invoke(main, ["align", "-m", str(sentence_model), "-o", str(out)])
    assert r.exit_code != 0 and "give SOURCE [TARGET], or --input FILE" in r.output
