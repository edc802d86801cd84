"""CSLM: model, streaming data, training/resume, the batched engine, scoring, perplexity, n-best rescoring."""

from __future__ import annotations

import gzip
import itertools
import json
import math
import random
import zlib

import numpy as np
import pytest
import torch

from cslm import modeldir
from cslm.apply import perplexity, rescore_nbest, score_file
from cslm.data import sentence_ngrams, stream_batches, scan_corpus
from cslm.engine import BACKOFF, UNKNOWN, Engine
from cslm.model import CSLM, CSLMConfig, preset_config
from cslm.train import TrainConfig, train
from mtcommon.textio import InputError
from mtcommon.vocab import BOS, EOS, UNK, Vocabulary

WORDS = [f"w{i}" for i in range(120)]


def synthetic_corpus(path, sentences=400, seed=0):
    """Zipf-ish random sentences with some local structure (w_i tends to follow w_{i-1})."""
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) for i in range(len(WORDS))]
    lines = []
    for _ in range(sentences):
        n = rng.randint(3, 12)
        s = [rng.choices(WORDS, weights)[0]]
        while len(s) < n:
            prev = int(s[-1][1:])
            s.append(WORDS[(prev + 1) % len(WORDS)] if rng.random() < 0.5 else rng.choices(WORDS, weights)[0])
        lines.append(" ".join(s))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def cslm_corpus(tmp_path_factory):
    return synthetic_corpus(tmp_path_factory.mktemp("cslm-corpus") / "corpus.txt")


@pytest.fixture(scope="session")
def cslm_model(cslm_corpus, tmp_path_factory):
    """Tiny preset with a 60-word shortlist (so unknown words occur), two epochs."""
    out = tmp_path_factory.mktemp("cslm-model")
    cfg = TrainConfig(preset="tiny", vocab_size=60, max_epochs=2, valid_fraction=0.05, batch_size=64, device="cpu")
    train(str(cslm_corpus), str(out), cfg, progress=False)
    return out


@pytest.fixture(scope="session")
def engine(cslm_model):
    return Engine.load(str(cslm_model), device="cpu")


@pytest.fixture(scope="session")
def unigram_arpa(cslm_corpus, tmp_path_factory):
    """A hand-written ARPA model of the synthetic corpus: unigrams, back-off weights 0, one bigram
    (KenLM needs order >= 2), so P(w | h) = P(w) for every other history."""
    from collections import Counter

    counts = Counter()
    for line in cslm_corpus.read_text().splitlines():
        counts.update(line.split() + [EOS])
    total = sum(counts.values()) + 1
    entries = [(math.log10(c / total), w) for w, c in sorted(counts.items())]
    entries += [(math.log10(1 / total), "<unk>"), (-99.0, BOS)]
    path = tmp_path_factory.mktemp("arpa") / "uni.arpa"
    body = "".join(f"{lp:.6f}\t{w}\t0\n" for lp, w in entries)
    path.write_text(f"\n\\data\\\nngram 1={len(entries)}\nngram 2=1\n\n\\1-grams:\n{body}\n"
                    f"\\2-grams:\n-0.5\t{BOS} w0\n\n\\end\\\n", encoding="utf-8")
    return path


# -- model --------------------------------------------------------------------
def test_paper_preset_matches_section_4_1_2():
    cfg = preset_config("paper")
    model = CSLM(cfg)
    assert (cfg.order, cfg.embed, cfg.hidden, cfg.vocab_size) == (7, 512, (1536, 1024), 15000)
    assert model.hidden[0].in_features == 6 * 512 == 3072
    assert [layer.out_features for layer in model.hidden] == [1536, 1024]
    assert model.out.out_features == 15000
    model.init_weights()
    for p in model.parameters():
        assert float(p.detach().abs().max()) <= 0.01


def test_engine_computes_the_model_equation():
    """Engine.score_ids against Sec. 4.1.2 written out in float64 from the weights: the n-1 history
    projections concatenated, rectified layers, then ln P(w|h) = o_w - ln sum_r exp(o_r) (Eq. (2))."""
    torch.manual_seed(0)
    cfg = CSLMConfig(vocab_size=50, order=4, embed=8, hidden=(16, 12))
    model = CSLM(cfg)
    with torch.no_grad():  # weights large enough for a peaked distribution
        for w in model.parameters():
            w.uniform_(-0.8, 0.8)
    vocab = Vocabulary([EOS, BOS, UNK] + [f"v{i}" for i in range(47)])
    eng = Engine(model, vocab, "cpu")
    rng = np.random.default_rng(0)
    grams = rng.integers(0, 50, size=(200, 4)).astype(np.int32)
    grams[:60, :-1] = grams[0, :-1]  # shared histories take the de-duplicating path
    short = rng.integers(0, 50, size=(20, 2)).astype(np.int32)  # left-padded with <s>
    got = np.concatenate([eng.score_ids(grams)[0], eng.score_ids(short)[0]])

    p = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    full = np.concatenate([grams, np.concatenate([np.full((20, 2), vocab.index[BOS]), short], axis=1)])
    x = p["embed.weight"][full[:, :-1]].reshape(len(full), -1)  # (N, 3 * 8), history order kept
    for i in range(len(cfg.hidden)):
        x = np.maximum(0.0, x @ p[f"hidden.{i}.weight"].T + p[f"hidden.{i}.bias"])
    o = x @ p["out.weight"].T + p["out.bias"]
    m = o.max(axis=1, keepdims=True)
    log_z = (m + np.log(np.exp(o - m).sum(axis=1, keepdims=True)))[:, 0]
    want = o[np.arange(len(full)), full[:, -1]] - log_z
    assert want.std() > 0.3  # far from uniform, so a wrong layer or order would show
    np.testing.assert_allclose(got, want, atol=2e-5)
    reordered = full.copy()
    reordered[:, :-1] = reordered[:, -2::-1]  # the same words in another order predict differently
    assert not np.allclose(eng.score_ids(reordered)[0], want, atol=1e-3)


# -- data ---------------------------------------------------------------------
def test_sentence_ngrams_pad_with_bos_and_predict_eos():
    g = sentence_ngrams([5, 6], order=4, bos=1, eos=0)
    assert g.tolist() == [[1, 1, 1, 5], [1, 1, 5, 6], [1, 5, 6, 0]]


def test_one_ngram_builder_for_words_and_ids():
    """Words and ids go through the same padding: the words' n-grams encode to the ids' n-grams."""
    from cslm.ngrams import left_pad

    assert sentence_ngrams(["a", "b"], 3, BOS, EOS) == [[BOS, BOS, "a"], [BOS, "a", "b"], ["a", "b", EOS]]
    vocab = Vocabulary.build({"a": 2, "b": 1}, 10, reserved=(EOS, BOS, UNK))
    for words in (["a"], ["b", "a", "c", "a"], []):
        ids = sentence_ngrams(vocab.encode(words), 4, vocab.index[BOS], vocab.index[EOS])
        assert ids.dtype == np.int32 and ids.tolist() == [vocab.encode(g) for g in sentence_ngrams(words, 4, BOS, EOS)]
    assert left_pad(["a", "b"], 4, BOS) == [BOS, BOS, "a", "b"] and left_pad([7], 1, 1) == [7]


def test_stream_is_a_pure_function_of_seed_and_step(cslm_corpus, engine):
    info = scan_corpus(str(cslm_corpus), 0.05, seed=3)
    args = (str(cslm_corpus), engine.vocab, info.heldout_lines, 7, 32, 3)
    full = list(itertools.islice(stream_batches(*args), 200))  # spans several passes
    resumed = list(itertools.islice(stream_batches(*args, start_step=137), 63))
    assert all(np.array_equal(a, b) for a, b in zip(full[137:], resumed))
    # held-out sentences never reach training
    held = set(info.heldout_lines.tolist())
    assert len(held) == round(400 * 0.05)


# -- training -----------------------------------------------------------------
def test_training_writes_a_loadable_model_dir(cslm_model):
    m = modeldir.load(str(cslm_model))
    assert len(m.vocab) == 60 and m.vocab.words[:3] == [EOS, BOS, UNK]
    assert m.meta["valid_ngrams"] > 0
    cfg = json.loads((cslm_model / "config.json").read_text())
    assert cfg["format"] == "cslm"
    assert (cslm_model / "checkpoint.pt").exists() and (cslm_model / "cslm.vocab").exists()


def test_training_learns_and_resume_continues(cslm_corpus, tmp_path):
    cfg = TrainConfig(preset="tiny", vocab_size=60, max_epochs=1, valid_fraction=0.05, batch_size=64, device="cpu")
    first = train(str(cslm_corpus), str(tmp_path), cfg, progress=False)
    cfg.max_epochs = 3
    more = train(str(cslm_corpus), str(tmp_path), cfg, resume=True, progress=False)
    assert more["epochs"] == 3 and len(more["valid_ppl_history"]) == 3
    assert more["valid_ppl_history"][0] == first["valid_ppl_history"][0]
    assert more["best_valid_ppl"] < first["best_valid_ppl"] < 60  # better than uniform over the shortlist


def test_early_stopping_by_patience(cslm_corpus, tmp_path):
    cfg = TrainConfig(preset="tiny", vocab_size=60, max_epochs=50, patience=1, valid_fraction=0.05, batch_size=64,
                      lr=0.5, epoch_ngrams=500, device="cpu")  # a too-large step size stops improving quickly
    res = train(str(cslm_corpus), str(tmp_path), cfg, progress=False)
    assert res["stopped"] == "patience" and res["epochs"] < 50


def test_training_rejects_a_corpus_too_small(tmp_path):
    (tmp_path / "one.txt").write_text("just one sentence\n")
    with pytest.raises(ValueError, match="at least 2"):
        train(str(tmp_path / "one.txt"), str(tmp_path / "m"), TrainConfig(preset="tiny", device="cpu"), progress=False)


def test_bad_utf8_is_reported_with_file_and_line(tmp_path):
    p = tmp_path / "bad.txt"
    p.write_bytes(b"a b c\nd \xff e\n")
    with pytest.raises(InputError, match=r"bad.txt:2"):
        train(str(p), str(tmp_path / "m"), TrainConfig(preset="tiny", device="cpu"), progress=False)


# -- engine -------------------------------------------------------------------
def test_engine_matches_a_direct_softmax(engine):
    rng = np.random.default_rng(0)
    grams = rng.integers(0, len(engine.vocab), size=(300, 7)).astype(np.int32)
    grams[:100, :-1] = grams[0, :-1]  # many n-grams share one history
    logp, flags = engine.score_ids(grams)
    with torch.no_grad():
        ref = torch.log_softmax(engine.model(torch.from_numpy(grams[:, :-1]).long()), -1)
    ref = ref[torch.arange(300), torch.from_numpy(grams[:, -1]).long()].numpy()
    assert np.allclose(logp, ref, atol=1e-5)
    assert np.array_equal(flags, (grams[:, -1] == engine.unk_id).astype(np.uint8))


def test_engine_results_do_not_depend_on_the_batch(engine):
    rng = np.random.default_rng(1)
    grams = rng.integers(0, len(engine.vocab), size=(500, 7)).astype(np.int32)
    together, _ = engine.score_ids(grams)
    alone = np.concatenate([engine.score_ids(grams[i : i + 1])[0] for i in range(0, 500, 37)])
    assert np.array_equal(alone, together[::37])
    assert np.array_equal(engine.score_ids(grams[::-1])[0], together[::-1])


def test_the_softmax_in_blocks_of_histories_gives_the_whole_chunks_scores(cslm_model):
    """`Engine._chunk` on a CPU: the output layer and ln Z a block of `softmax_rows` histories at a time, each
    block's n-grams gathered from it; blocks of 40 (and a short last one joined to the one before) against one."""
    whole, blocks = (Engine.load(str(cslm_model), device="cpu") for _ in range(2))
    whole.softmax_rows, blocks.softmax_rows = None, 40
    rng = np.random.default_rng(2)
    hist = rng.integers(0, len(whole.vocab), size=(230, 6))
    grams = np.concatenate([np.repeat(hist, 3, axis=0), rng.integers(0, len(whole.vocab), (690, 1))], axis=1)
    grams = grams[rng.permutation(len(grams))].astype(np.int32)  # 230 histories, 3 n-grams each
    for a, b in zip(whole.score_ids_log_z(grams), blocks.score_ids_log_z(grams)):
        assert np.allclose(a, b, atol=1e-5)
    assert np.allclose(whole.score_ids(grams)[0], blocks.score_ids(grams)[0], atol=1e-5)
    assert np.allclose(whole.score_ids(grams[:5])[0], blocks.score_ids(grams[:5])[0], atol=1e-5)


def test_short_ngrams_are_left_padded_with_bos(engine):
    ids = engine.vocab.encode(["w0", "w1"])
    short, _ = engine.score_ids(np.array([ids]))
    full, _ = engine.score_ids(np.array([[engine.bos_id] * 5 + ids]))
    assert short[0] == full[0]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.score_ids(np.array([[len(engine.vocab)]]))
    with pytest.raises(ValueError, match="1 <= n <= 7"):
        engine.score_ids(np.zeros((2, 8), np.int32))


def test_unknown_words_in_unk_mode(engine):
    (lp, fl), = engine.score_sentences([["w0", "never-seen", "w1"]])
    assert fl.tolist() == [0, UNKNOWN, 0, 0]
    unk, _ = engine.score_words([[BOS] * 5 + ["w0", UNK]])
    assert lp[1] == unk[0]  # an unknown word costs ln P([UNK] | h)


def test_backoff_mode_uses_kenlm_for_unknown_words(cslm_model, unigram_arpa):
    pytest.importorskip("kenlm", reason="back-off mode needs the optional kenlm package")
    eng = Engine.load(str(cslm_model), device="cpu", kenlm=str(unigram_arpa))
    rare = next(w for w in reversed(WORDS) if w not in eng.vocab)
    (lp, fl), = eng.score_sentences([["w0", rare, "w1"]])
    assert fl.tolist() == [0, UNKNOWN | BACKOFF, 0, 0]
    assert lp[1] == pytest.approx(eng.backoff.logprob([BOS, "w0"], rare))
    assert lp[1] == pytest.approx(math.log(10) * eng.backoff.model.score(rare, bos=False, eos=False), rel=1e-5)
    plain = Engine.load(str(cslm_model), device="cpu")
    (lp0, _), = plain.score_sentences([["w0", rare, "w1"]])
    assert lp0[0] == lp[0] and lp0[2] == lp[2]  # shortlist words keep their CSLM values


# -- text tools -----------------------------------------------------------------
def test_score_file_sentences_and_ngrams(engine, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("w0 w1 w2\nw3 zzz\n")
    out = tmp_path / "out.txt"
    res = score_file(engine, str(text), str(out), per_word=True, progress=False)
    rows = [line.split("\t") for line in out.read_text().splitlines()]
    assert res["lines"] == 2 and res["tokens"] == 7 and res["unknown"] == 1
    assert rows[1][1:3] == ["1", "3"]
    per_word = [float(x) for x in rows[0][3].split()]
    assert float(rows[0][0]) == pytest.approx(sum(per_word), abs=1e-5)
    grams = tmp_path / "g.txt"
    grams.write_text("<s> <s> <s> <s> <s> <s> w0\nw0\n")
    score_file(engine, str(grams), str(out), ngrams=True, progress=False)
    a, b = out.read_text().splitlines()
    assert a == b and a.split("\t")[0] == f"{per_word[0]:.6f}"
    grams.write_text("w0 w1 w2 w3 w4 w5 w6 w7\n")
    with pytest.raises(InputError, match="g.txt:1"):
        score_file(engine, str(grams), str(out), ngrams=True, progress=False)


def test_perplexity_and_kenlm_side_by_side(engine, cslm_corpus, unigram_arpa, tmp_path):
    head = tmp_path / "head.txt"
    head.write_text("".join(cslm_corpus.read_text().splitlines(True)[:50]))
    res = perplexity(engine, str(head), progress=False)
    assert 1 < res["cslm_ppl"] < 60 and res["tokens"] > 50
    pytest.importorskip("kenlm", reason="the KenLM comparison needs the optional kenlm package")
    res = perplexity(engine, str(head), kenlm=str(unigram_arpa), progress=False)
    assert res["kenlm_ppl"] > 1 and res["kenlm_order"] == 2


def test_mixture_follows_its_formula_and_em_finds_the_best_weight():
    """cslm.mix: lambda p + (1 - lambda) q on the shortlist; q (1 - lambda + lambda p_unk) outside it;
    EM's weight maximises the likelihood (no grid point does better)."""
    from cslm.mix import estimate, mix

    lp = np.log(np.array([0.2, 0.01, 0.3]))
    q = np.log(np.array([0.05, 0.04, 0.001]))
    fl = np.array([0, 0, UNKNOWN], np.uint8)
    m = np.exp(mix(lp, fl, q, 0.25))
    assert m[0] == pytest.approx(0.25 * 0.2 + 0.75 * 0.05)
    assert m[1] == pytest.approx(0.25 * 0.01 + 0.75 * 0.04)
    assert m[2] == pytest.approx(0.001 * (0.75 + 0.25 * 0.3))
    assert np.allclose(mix(lp, fl, q, 1.0)[:2], lp[:2]) and np.allclose(mix(lp, fl, q, 0.0), q)
    rng = np.random.default_rng(0)
    c, k = np.log(rng.uniform(1e-4, 1, 500)), np.log(rng.uniform(1e-4, 1, 500))
    lam, _ = estimate(c, k)
    ll = lambda w: np.logaddexp(np.log(w) + c, np.log1p(-w) + k).sum()  # noqa: E731
    assert 0 < lam < 1 and all(ll(lam) >= ll(w) - 1e-9 for w in np.linspace(0.01, 0.99, 99))
    with pytest.raises(Exception, match="unk mode"):
        mix(lp, np.array([0, 0, UNKNOWN | BACKOFF], np.uint8), q, 0.5)


def test_mixed_backend_perplexity_and_weight(engine, cslm_corpus, unigram_arpa, tmp_path):
    """The mixture's sentences and n-grams agree; perplexity(mix_weight) reports what MixedBackend scores;
    estimate_mix_weight's mixture beats both models on the text it was estimated on."""
    pytest.importorskip("kenlm", reason="interpolation needs the optional kenlm package")
    from cslm.engine import KenLMBackoff
    from cslm.apply import estimate_mix_weight
    from cslm.mix import MixedBackend

    lm = KenLMBackoff(str(unigram_arpa))
    rare = next(w for w in reversed(WORDS) if w not in engine.vocab)
    mixed = MixedBackend(engine, lm, 0.6)
    s = ["w0", rare, "w1", "w2"]
    (lp, fl), = mixed.score_sentences([s])
    (c, _), = engine.score_sentences([s])
    k = lm.sentence_logprobs(s)
    assert lp[0] == pytest.approx(math.log(0.6 * math.exp(c[0]) + 0.4 * math.exp(k[0])), rel=1e-5)
    assert fl[1] == UNKNOWN and lp[1] == pytest.approx(k[1] + math.log(0.4 + 0.6 * math.exp(c[1])), rel=1e-5)
    grams = [s[: i + 1] for i in range(len(s))] + [s + [EOS]]
    glp, _ = mixed.score_words(grams)
    assert np.allclose(glp, lp, atol=1e-5)
    head = tmp_path / "head.txt"
    head.write_text("".join(cslm_corpus.read_text().splitlines(True)[:50]))
    est = estimate_mix_weight(engine, lm, str(head))
    assert 0 < est["weight"] < 1
    assert est["mix_ppl_in_shortlist"] < min(est["cslm_ppl_in_shortlist"], est["kenlm_ppl_in_shortlist"])
    res = perplexity(engine, str(head), kenlm=lm, mix_weight=est["weight"], progress=False)
    assert res["mix_ppl_in_shortlist"] == pytest.approx(est["mix_ppl_in_shortlist"], rel=1e-6)
    alone = perplexity(mixed.__class__(engine, lm, est["weight"]), str(head), progress=False)
    assert alone["cslm_ppl"] == pytest.approx(res["mix_ppl"], rel=1e-5)


def test_cli_mix_and_its_one_line_errors(cslm_model, cslm_corpus, unigram_arpa, tmp_path):
    pytest.importorskip("kenlm", reason="interpolation needs the optional kenlm package")
    from click.testing import CliRunner

    from cslm.cli import main

    run = lambda *a: CliRunner().invoke(main, [str(x) for x in a])  # noqa: E731
    r = run("mix", cslm_model, cslm_corpus, "--kenlm", unigram_arpa, "--device", "cpu")
    assert r.exit_code == 0, r.output
    weight = json.loads(r.output)["weight"]
    r = run("eval", cslm_model, cslm_corpus, "--kenlm", unigram_arpa, "--mix", weight, "--device", "cpu", "--quiet")
    assert r.exit_code == 0 and json.loads(r.output)["mix_weight"] == weight
    out = tmp_path / "s.txt"
    r = run("score", cslm_model, cslm_corpus, "--kenlm", unigram_arpa, "--mix", 0.5, "-o", out, "--quiet")
    assert r.exit_code == 0, r.output
    assert len(out.read_text().splitlines()) == len(cslm_corpus.read_text().splitlines())
    for args, message in ((("eval", cslm_model, cslm_corpus, "--mix", 0.5), "--mix needs --kenlm"),
                          (("eval", cslm_model, cslm_corpus, "--kenlm", unigram_arpa, "--mix", 0.5, "--backoff"),
                           "not with --backoff"),
                          (("score", cslm_model, cslm_corpus, "--kenlm", unigram_arpa, "--mix", 2), "0<=x<=1")):
        r = run(*args)
        assert r.exit_code != 0 and message in r.output


def test_rescore_nbest_appends_a_feature_in_moses_format(engine, tmp_path):
    nbest = tmp_path / "nbest.txt"
    nbest.write_text(
        "0 ||| w0 w1 w2 ||| LM0= -10.5 TM0= -1 -2 ||| -3.25\n"
        "0 ||| w0 zzz ||| LM0= -11 TM0= -1 -3 ||| -4.5 ||| 0-0 1-1\n"
    )
    out = tmp_path / "out.nbest"
    rescore_nbest(engine, str(nbest), str(out), progress=False)
    lines = out.read_text().splitlines()
    f = lines[0].split(" ||| ")
    (lp, _), = engine.score_sentences([["w0", "w1", "w2"]])
    assert f[2] == f"LM0= -10.5 TM0= -1 -2 CSLM0= {float(np.sum(lp, dtype=np.float64)):.6f} 0"
    assert f[3] == "-3.25"
    g = lines[1].split(" ||| ")
    assert g[2].endswith(" 1") and g[4] == "0-0 1-1"
    nbest.write_text("garbage line\n")
    with pytest.raises(InputError, match="nbest.txt:1"):
        rescore_nbest(engine, str(nbest), str(out), progress=False)


def test_cli_train_eval_score(cslm_corpus, tmp_path):
    from click.testing import CliRunner

    from cslm.cli import main

    run = lambda *a: CliRunner().invoke(main, [str(x) for x in a])  # noqa: E731
    model = tmp_path / "m"
    r = run("train", cslm_corpus, "-o", model, "--preset", "tiny", "--vocab-size", "60", "--max-epochs", "1",
            "--valid-fraction", "0.05", "--device", "cpu", "--quiet")
    assert r.exit_code == 0, r.output
    r = run("eval", model, cslm_corpus, "--device", "cpu", "--quiet")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["cslm_ppl"] > 1
    r = run("score", model, tmp_path / "missing.txt", "--quiet")
    assert r.exit_code != 0 and "missing.txt" in r.output


@pytest.fixture
def cut_corpus(cslm_corpus, tmp_path):
    data = gzip.compress(cslm_corpus.read_bytes())
    cut = tmp_path / "cut.txt.gz"
    cut.write_bytes(data[: len(data) // 2])
    return cut


@pytest.mark.parametrize("command", ["score", "eval", "train"])
def test_cli_names_a_truncated_gzip_corpus(cslm_model, cut_corpus, tmp_path, command):
    from click.testing import CliRunner

    from cslm.cli import main

    out = tmp_path / "out.txt"
    out.write_text("previous\n")
    args = {"score": ["score", cslm_model, cut_corpus, "-o", out, "--device", "cpu", "--quiet"],
            "eval": ["eval", cslm_model, cut_corpus, "--device", "cpu", "--quiet"],
            "train": ["train", cut_corpus, "-o", tmp_path / "m", "--preset", "tiny", "--device", "cpu", "--quiet"]}
    r = CliRunner().invoke(main, [str(a) for a in args[command]])
    assert r.exit_code == 1 and "Aborted" not in r.output, r.output
    good = zlib.decompressobj(wbits=31).decompress(cut_corpus.read_bytes()).count(b"\n")  # the lines gzip -dc gives
    assert r.output.strip().splitlines()[-1] == f"Error: {cut_corpus}: truncated gzip stream after line {good}", \
        r.output
    assert out.read_text() == "previous\n" and sorted(p.name for p in tmp_path.iterdir() if p.name != "m") == [
        "cut.txt.gz", "out.txt"]


def test_cli_refuses_the_other_tools_model_dir(cslm_model, tiny_model, example_table, cslm_corpus, tmp_path):
    from click.testing import CliRunner

    from cslm.cli import main as cslm_main
    from moses_rnn.cli import main as rnn_main

    r = CliRunner().invoke(cslm_main, ["score", str(tiny_model), str(cslm_corpus), "--quiet"])
    assert r.exit_code == 1 and (f"Error: {tiny_model} is an RNN phrase-scorer model directory (made by `moses-rnn "
                                 "train`); cslm needs a CSLM language-model one (made by `cslm train`)") in r.output
    r = CliRunner().invoke(cslm_main, ["eval", str(tiny_model), str(cslm_corpus), "--quiet"])
    assert r.exit_code == 1 and "cslm needs a CSLM language-model one" in r.output
    r = CliRunner().invoke(rnn_main, ["score", str(example_table), "-m", str(cslm_model), "-o", str(tmp_path / "o.gz")])
    assert r.exit_code == 1 and (f"Error: {cslm_model} is a CSLM language-model model directory (made by `cslm "
                                 "train`); moses-rnn needs an RNN phrase-scorer one") in r.output
    assert not (tmp_path / "o.gz").exists()


def test_cli_eval_of_an_empty_text_is_an_error_not_perplexity_1(cslm_model, tmp_path):
    from click.testing import CliRunner

    from cslm.cli import main

    (tmp_path / "empty.txt").write_text("")
    r = CliRunner().invoke(main, ["eval", str(cslm_model), str(tmp_path / "empty.txt"), "--quiet"])
    assert r.exit_code == 1 and "empty.txt: no sentences to evaluate" in r.output


def test_cli_score_without_text_does_not_wait_on_a_terminal(cslm_model):
    import os
    import pty
    import subprocess
    import sys

    leader, follower = pty.openpty()
    try:
        r = subprocess.run([sys.executable, "-m", "cslm.cli", "score", str(cslm_model)], stdin=follower,
                           capture_output=True, text=True, timeout=60)
    finally:
        os.close(leader)
        os.close(follower)
    assert r.returncode == 2 and "no TEXT given and stdin is a terminal" in r.stderr, r.stderr


def test_real_french_slice(shared_data, tmp_path):
    """A few hundred real sentences, gzip input: trains, and beats the uniform distribution."""
    src = shared_data / "en-fr-moses" / "train.tok.fr"
    corpus = tmp_path / "fr.txt.gz"
    with open(src, "rb") as f, gzip.open(corpus, "wb") as g:
        g.writelines(itertools.islice(f, 600))
    cfg = TrainConfig(preset="tiny", vocab_size=500, max_epochs=2, valid_fraction=0.05, batch_size=64, device="cpu")
    res = train(str(corpus), str(tmp_path / "m"), cfg, progress=False)
    assert res["best_valid_ppl"] < 500


def test_cpu_threads_follow_the_model_size(monkeypatch):
    """One rule for both networks: a model below the `small` preset runs on one CPU thread, `small`
    and up on every core (the CSLM's config gives its layer widths as a tuple)."""
    from moses_rnn.networks.modelbase import preset_config as rnn_config
    from mtcommon.runtime import configure_threads, cpu_count

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cpu, before = torch.device("cpu"), torch.get_num_threads()
    try:
        for config in (preset_config("tiny"), rnn_config("tiny")):
            assert configure_threads(cpu, None, config) == 1 == torch.get_num_threads()
        for config in (preset_config("small"), preset_config("paper"), rnn_config("small")):
            assert configure_threads(cpu, None, config) == cpu_count() == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device"))])
def test_a_calls_arrays_go_to_the_device_in_one_transfer_and_come_back(device):
    """`upload`: int64 views of one transfer, whatever the arrays' integer types and shapes (an empty one
    included); on the CPU a single int64 array is not copied. `download`: the values back as numpy."""
    from mtcommon.runtime import download, upload

    dev = torch.device(device)
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    b = np.array([7, -1, 5], dtype=np.int64)
    c = np.empty(0, dtype=np.intp)
    got = upload([a, b, c], dev)
    assert [t.shape for t in got] == [(3, 4), (3,), (0,)] and all(t.dtype == torch.int64 for t in got)
    assert all(t.device.type == device for t in got)
    assert np.array_equal(download(got[0]), a) and np.array_equal(download(got[1]), b) and download(got[2]).size == 0
    (alone,) = upload([b], dev)
    assert np.array_equal(download(alone * 2), b * 2)
    if device == "cpu":
        assert np.shares_memory(alone.numpy(), b)
    values = np.array([-1.0, -0.5, 0.0, 0.25, 1.0], dtype=np.float32)
    back = download(torch.from_numpy(values).to(dev))
    assert isinstance(back, np.ndarray) and back.dtype == np.float32 and np.array_equal(back, values)


def test_omp_num_threads_sets_the_default(monkeypatch):
    """OMP_NUM_THREADS, which a scheduler or make recipe sets for every OpenMP program, is the default
    count for inference and training alike; --threads still wins; under torchrun (which sets it to 1
    unless told) the ranks share the cores instead; a value that is not a count is one error."""
    from mtcommon.errors import UserError
    from mtcommon.runtime import choose_threads, configure_threads, cpu_count

    cpu, before = torch.device("cpu"), torch.get_num_threads()
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        assert configure_threads(cpu, None, preset_config("small")) == 3 == torch.get_num_threads()
        assert configure_threads(cpu, None, preset_config("tiny")) == 3
        assert configure_threads(cpu, 2, preset_config("small")) == 2
        assert choose_threads(cpu, None, big=True) == 3 and choose_threads(cpu, None, big=False) == 3
        assert choose_threads(cpu, None, big=True, local_world=2) == max(1, cpu_count() // 2)
        monkeypatch.setenv("OMP_NUM_THREADS", "2,1")  # OpenMP's per-level list: the first level counts
        assert configure_threads(cpu, None, preset_config("small")) == 2
        for bad in ("0", "x", "-1"):
            monkeypatch.setenv("OMP_NUM_THREADS", bad)
            with pytest.raises(UserError, match=f"OMP_NUM_THREADS={bad}: not a positive thread count"):
                configure_threads(cpu, None, preset_config("small"))
        monkeypatch.setenv("OMP_NUM_THREADS", "")
        assert choose_threads(cpu, None, big=True) is None  # unset or empty: tuned while training
    finally:
        torch.set_num_threads(before)
