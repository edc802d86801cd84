"""Subword units (mtcommon.subword): segmentation, model directories, and the scorer's subword path."""

import io
import json
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from moses_rnn.cli import main
from moses_rnn.formats.phrasetable import read_phrase_table
from moses_rnn.networks import modelio
from moses_rnn.networks.modelbase import preset_config
from moses_rnn.scoring.scorer import PhraseScorer, phrase_keys
from mtcommon.errors import UserError
from mtcommon.modeldir import ModelError
from mtcommon.subword import SubwordVocabulary
from mtcommon.textio import InputError
from mtcommon.vocab import Vocabulary


def table_sides(path):
    pairs = list(read_phrase_table(str(path)))
    return [p.source for p in pairs], [p.target for p in pairs]


@pytest.fixture(scope="module")
def example_units(example_table):
    sources, targets = table_sides(example_table)
    return SubwordVocabulary.train(sources, 300), SubwordVocabulary.train(targets, 300)


def test_units_join_back_to_every_phrase_of_the_example_table(example_table, example_units):
    for vocab, phrases in zip(example_units, table_sides(example_table)):
        ids, lens = vocab.encode_phrases(phrases)
        assert len(lens) == len(phrases) and (lens >= 1).all()
        assert not (ids == vocab.unk_id).any()
        for phrase, row in zip(phrases, np.split(ids, np.cumsum(lens)[:-1])):
            assert vocab.join(row) == phrase
            assert "".join(vocab.units(phrase)).replace("\u2581", " ").strip() == phrase
        # the table's keys (UTF-8 bytes) give the same ids as the phrases
        keys_ids, keys_lens = vocab.encode_keys([p.encode() for p in phrases])
        assert np.array_equal(keys_ids, ids) and np.array_equal(keys_lens, lens)


def test_characters_never_seen_are_spelled_in_bytes_not_unknown(example_units):
    src, _ = example_units
    phrase = "Ωmega ∂x 東京 the"
    ids, lens = src.encode_phrases([phrase])
    assert not (ids == src.unk_id).any()
    assert src.join(ids) == phrase
    assert all("\u2581" not in u[1:] for u in src.units(phrase))  # no unit spans two words


def test_reserved_ids_are_a_shortlists_and_the_model_file_round_trips(tmp_path, example_units):
    src, _ = example_units
    assert (src.index["</s>"], src.unk_id) == (0, 1)
    path = tmp_path / "src.spm"
    src.save(str(path))
    again = SubwordVocabulary.load(str(path))
    assert again.words == src.words and again.checksum() == src.checksum()
    with pytest.raises(InputError, match="bad.spm: not a sentencepiece model"):
        (tmp_path / "bad.spm").write_bytes(b"\x00 not a model")
        SubwordVocabulary.load(str(tmp_path / "bad.spm"))


def test_too_few_units_and_no_text_are_refused():
    with pytest.raises(UserError, match="256 byte units"):
        SubwordVocabulary.train(["a b"], 100)
    with pytest.raises(UserError, match="no text"):
        SubwordVocabulary.train(["", "  "], 300)


# -- the scorer's subword path ------------------------------------------------------------------------------
def word_level_segmentation(phrases, size):
    """A sentencepiece model whose units are whole words (model_type=word): the identity segmentation."""
    import sentencepiece

    out = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(phrases), model_writer=out, model_type="word", vocab_size=size,
        hard_vocab_limit=False, normalization_rule_name="identity", remove_extra_whitespaces=False,
        split_by_whitespace=True, eos_id=0, unk_id=1, bos_id=-1, pad_id=-1, eos_piece="</s>", unk_piece="[UNK]",
        minloglevel=2)
    return SubwordVocabulary(out.getvalue())


@pytest.mark.parametrize("arch", ["encdec", "rnnsearch"])
def test_identity_segmentation_scores_as_the_word_model(example_table, arch):
    sources, targets = table_sides(example_table)
    src_units = word_level_segmentation(sources, 20)  # the rarer words are left unknown
    tgt_units = word_level_segmentation(targets, 25)
    # the word shortlists in the same id order: each unit without its word-start mark
    src_words = Vocabulary(src_units.words[:2] + [u[1:] for u in src_units.words[2:]])
    tgt_words = Vocabulary(tgt_units.words[:2] + [u[1:] for u in tgt_units.words[2:]])
    torch.manual_seed(0)
    model = modelio.build_model(preset_config("tiny", len(src_words), len(tgt_words), arch))
    model.init_weights()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(10.0)  # away from uniform
    cfg = model.config
    word = PhraseScorer(modelio.LoadedModel(model, src_words, tgt_words, cfg, {}))
    sub = PhraseScorer(modelio.LoadedModel(model, src_units, tgt_units, cfg, {}))
    pairs = list(zip(sources, targets))
    a, b = (s.score_keys(*phrase_keys(pairs)).columns(unknown=True) for s in (word, sub))
    assert a[:, 1].sum() > 0  # some words are unknown to both
    np.testing.assert_array_equal(a, b)


@pytest.fixture(scope="module")
def subword_model(example_table, tmp_path_factory):
    out = tmp_path_factory.mktemp("subword") / "model"
    r = CliRunner().invoke(main, ["train", str(example_table), "-o", str(out), "--preset", "tiny", "--subwords", "300",
                                  "--max-steps", "40", "--eval-every", "20", "--valid-pairs", "20", "--quiet"])
    assert r.exit_code == 0, r.output
    return out


def test_a_subword_model_directory_records_its_segmentation(subword_model):
    cfg = json.loads((subword_model / "config.json").read_text())["model"]
    assert cfg["segmentation"] == "sentencepiece"
    assert not (subword_model / "src.vocab").exists()
    loaded = modelio.load_model(str(subword_model))
    assert isinstance(loaded.src_vocab, SubwordVocabulary)
    assert loaded.src_vocab.checksum() == cfg["src_sha256"] and len(loaded.tgt_vocab) == cfg["tgt_vocab"] <= 300


def test_a_subword_model_scores_every_pair_without_unknowns(subword_model):
    scorer = PhraseScorer.from_dir(str(subword_model), device="cpu")
    pairs = [("the house", "la maison"), ("Ωmega house", "東京 maison")]
    f = scorer.score_keys(*phrase_keys(pairs)).columns(unknown=True)
    assert np.isfinite(f[:, 0]).all() and (f[:, 0] < 0).all()
    assert (f[:, 1] == 0).all()
    # log p(target | source) is the sum over the target's units and </s>
    ids, lens = scorer.tgt_vocab.encode_phrases(["la maison"])
    first = scorer.score_keys(*phrase_keys(pairs[:1]))
    assert first.symbols[0] == lens[0] + 1
    assert first.columns(normalize=True)[0, 0] == pytest.approx(f[0, 0] / (lens[0] + 1))


def cli_error(args):
    r = CliRunner().invoke(main, args)
    assert r.exit_code != 0
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in r.output, r.output
    return lines[0]


@pytest.mark.parametrize("damage", ["missing", "other", "garbage"])
def test_a_missing_or_different_segmentation_is_a_one_line_error(subword_model, example_table, tmp_path, damage):
    broken = tmp_path / "model"
    shutil.copytree(subword_model, broken)
    spm = broken / "tgt.spm"
    if damage == "missing":
        spm.unlink()
    elif damage == "other":  # a valid model, but not the one the network was trained with
        shutil.copy(broken / "src.spm", spm)
    else:
        spm.write_bytes(b"\x0a\x05hello")
    message = cli_error(["score", str(example_table), "-m", str(broken), "-o", str(tmp_path / "out.gz"), "--quiet"])
    assert "tgt.spm" in message
    assert {"missing": "missing", "other": "not the segmentation", "garbage": "sentencepiece"}[damage] in message
    assert not (tmp_path / "out.gz").exists()
    with pytest.raises(ModelError if damage != "garbage" else InputError, match="tgt.spm"):
        modelio.load_model(str(broken))


def test_subwords_learned_on_a_corpus(example_table, tmp_path):
    sources, targets = table_sides(example_table)
    (tmp_path / "c.en").write_text("\n".join(sources) + "\n")
    (tmp_path / "c.fr").write_text("\n".join(targets) + "\n")
    out = tmp_path / "model"
    r = CliRunner().invoke(main, ["train", str(example_table), "-o", str(out), "--preset", "tiny", "--subwords", "400",
                                  "--subword-corpus", str(tmp_path / "c.en"), str(tmp_path / "c.fr"),
                                  "--max-steps", "2", "--valid-pairs", "20", "--quiet"])
    assert r.exit_code == 0, r.output
    assert modelio.load_model(str(out)).config.src_vocab <= 400


def test_subword_options_that_conflict_are_refused(example_table, tmp_path):
    out = str(tmp_path / "m")
    assert "--src-vocab" in cli_error(["train", str(example_table), "-o", out, "--subwords", "300", "--src-vocab", "50"])
    assert "--subwords" in cli_error(["train", str(example_table), "-o", out, "--subword-corpus",
                                      str(example_table), str(example_table)])


def test_a_word_config_with_a_checksum_is_invalid():
    with pytest.raises(UserError, match="src_sha256"):
        preset_config("tiny").__class__(src_sha256="ab")
    with pytest.raises(UserError, match="segmentation"):
        preset_config("tiny").__class__(segmentation="chars")
