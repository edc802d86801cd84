"""Self-normalised CSLM scoring: premultiplied first layer, o_w without the softmax, ln Z statistics, CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from cslm.apply import perplexity
from cslm.data import scan_corpus, stream_batches
from cslm.engine import Engine
from cslm.model import CSLM, CSLMConfig
from cslm.server import startup_message
from cslm.train import NgramObjective, TrainConfig, train
from mtcommon.vocab import BOS, EOS, UNK, Vocabulary

from test_cslm import cslm_corpus, cslm_model, engine  # noqa: F401 (shared session fixtures)
from test_cslm_server import start_server_process


def peaked_model(seed=0, vocab_size=50, order=4, embed=8, hidden=(16, 12)):
    """A small model with large weights (a peaked distribution, ln Z far from 0) and its vocabulary."""
    torch.manual_seed(seed)
    model = CSLM(CSLMConfig(vocab_size=vocab_size, order=order, embed=embed, hidden=hidden))
    with torch.no_grad():
        for w in model.parameters():
            w.uniform_(-0.8, 0.8)
    vocab = Vocabulary([EOS, BOS, UNK] + [f"v{i}" for i in range(vocab_size - 3)])
    return model.eval(), vocab


def reference(model, grams):
    """float64 o_w and ln Z from the weights, written out as in Sec. 4.1.2 (concatenated projections)."""
    p = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    x = p["embed.weight"][grams[:, :-1]].reshape(len(grams), -1)
    for i in range(len(model.config.hidden)):
        x = np.maximum(0.0, x @ p[f"hidden.{i}.weight"].T + p[f"hidden.{i}.bias"])
    o = x @ p["out.weight"].T + p["out.bias"]
    m = o.max(axis=1, keepdims=True)
    log_z = (m + np.log(np.exp(o - m).sum(axis=1, keepdims=True)))[:, 0]
    return o[np.arange(len(grams)), grams[:, -1]], log_z


def test_first_layer_tables_are_the_split_first_layer():
    """T_p[w] = W1[:, p*E:(p+1)*E] @ embed[w], and relu(b1 + sum_p T_p[w_p]) is the first layer (float64)."""
    model, _ = peaked_model(hidden=(16,))
    model.double()
    E, ctx_len = model.config.embed, model.config.context
    T = model.first_layer_tables(torch.float64)
    assert T.shape == (ctx_len, 50, 16) and T.dtype == torch.float64
    W1, emb = model.hidden[0].weight.detach(), model.embed.weight.detach()
    assert torch.allclose(T[2, 7], W1[:, 2 * E : 3 * E] @ emb[7], atol=1e-14)
    ctx = torch.from_numpy(np.random.default_rng(0).integers(0, 50, size=(200, ctx_len)))
    with torch.no_grad():
        assert torch.allclose(model.features_from_tables(T, ctx), model.features(ctx), atol=1e-12)
    model2, _ = peaked_model()
    model2.double()
    T2 = model2.first_layer_tables(torch.float64)
    with torch.no_grad():
        h = model2.features_from_tables(T2, ctx)
        assert torch.allclose(h, model2.features(ctx), atol=1e-12)  # the later layers too
        tgt = ctx[:, 0]
        o = model2.output_rows(h, tgt)
        assert torch.allclose(o, model2(ctx)[torch.arange(200), tgt], atol=1e-12)


def test_self_normalized_engine_returns_o_w_and_adds_up_to_the_exact_scores():
    model, vocab = peaked_model()
    exact, fast = Engine(model, vocab, "cpu"), Engine(model, vocab, "cpu", normalized=False)
    assert exact.scores == "exact" and fast.scores == "self-normalized"
    rng = np.random.default_rng(0)
    grams = rng.integers(0, 50, size=(300, 4)).astype(np.int32)
    grams[:80, :-1] = grams[0, :-1]  # shared histories take the de-duplicating path
    short = rng.integers(0, 50, size=(20, 2)).astype(np.int32)  # left-padded with <s>
    o = np.concatenate([fast.score_ids(grams)[0], fast.score_ids(short)[0], fast.score_ids(grams[:5])[0]])
    full = np.concatenate([grams, np.concatenate([np.full((20, 2), vocab.index[BOS]), short], axis=1), grams[:5]])
    want_o, want_z = reference(model, full)
    assert want_z.std() > 0.3 and np.abs(want_z).min() > 0.5  # ln Z far from 0 and varying: not self-normalised
    np.testing.assert_allclose(o, want_o, atol=1e-5)

    logp, flags, log_z = exact.score_ids_log_z(full)
    assert np.array_equal(logp, exact.score_ids(full)[0]) and np.array_equal(flags, exact.score_ids(full)[1])
    np.testing.assert_allclose(log_z, want_z, atol=1e-5)
    np.testing.assert_allclose(o - log_z, logp, atol=1e-5)  # self-normalised - ln Z = exact
    np.testing.assert_allclose(o, logp + log_z, atol=1e-5)
    assert np.array_equal(fast.score_ids(full)[1], flags)


def test_self_normalized_scores_do_not_depend_on_the_batch():
    model, vocab = peaked_model(vocab_size=200, order=7, embed=16, hidden=(64, 32))
    fast = Engine(model, vocab, "cpu", normalized=False)
    grams = np.random.default_rng(1).integers(0, 200, size=(500, 7)).astype(np.int32)
    together, _ = fast.score_ids(grams)
    alone = np.concatenate([fast.score_ids(grams[i : i + 1])[0] for i in range(0, 500, 37)])
    assert np.array_equal(alone, together[::37])
    assert np.array_equal(fast.score_ids(grams[::-1])[0], together[::-1])


@pytest.mark.parametrize("capacity", [7, 64, 5000])
def test_the_history_cache_changes_no_score(capacity):
    """Cached last layers give the uncached scores bit for bit, whatever the cache evicts: histories met in
    earlier calls, twice in one call, in calls below and above the engine's de-duplication threshold."""
    model, vocab = peaked_model(vocab_size=200, order=7, embed=16, hidden=(64, 32))
    plain = Engine(model, vocab, "cpu", normalized=False)
    cached = Engine(model, vocab, "cpu", normalized=False)
    cached.cache_histories(capacity)
    rng = np.random.default_rng(capacity)
    histories = rng.integers(0, 200, size=(40, 6))
    for n in [1, 3, 30, 31, 200, 900, 2, 1500]:
        grams = np.concatenate([histories[rng.integers(0, 40, n)], rng.integers(0, 200, (n, 1))], axis=1)
        assert np.array_equal(cached.score_ids(grams)[0], plain.score_ids(grams)[0])
    cache = cached.history_cache
    assert cache.hits > 0 and cache.misses >= 40 and 0 < len(cache) <= min(capacity, 40)
    stored = {tuple(k) for k in cache.keys if k[0] >= 0}
    assert stored <= {tuple(h) for h in histories}  # each row holds one of the histories met


def test_the_history_cache_benchmark_compares_equal_scores():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_cslm_selfnorm import history_cache_rates, random_model

    model, vocab = random_model("tiny", None)
    r = history_cache_rates(model.eval(), vocab, rows=16384, repeats=1, requests=5)
    assert r["scores_equal"] and 0.5 < r["hit_rate"] <= 1.0  # every history met before, but for collisions
    assert r["cached_ngrams_per_s"] > 0 and r["uncached_ngrams_per_s"] > 0


def test_the_history_cache_is_for_the_self_normalized_path():
    model, vocab = peaked_model()
    exact = Engine(model, vocab, "cpu")
    exact.cache_histories(100)
    exact.score_ids(np.array([[1, 2, 3, 4]] * 3, np.int32))
    assert exact.history_cache.hits == exact.history_cache.misses == 0  # the softmax needs every output row
    exact.cache_histories(0)
    assert exact.history_cache is None


def test_the_tables_are_built_once_on_first_use():
    model, vocab = peaked_model()
    fast = Engine(model, vocab, "cpu", normalized=False)
    assert fast._tables is None
    fast.score_ids(np.array([[1, 2, 3, 4]], np.int32))
    t = fast.tables
    assert t.shape == (3, 50, 16) and t.dtype == torch.float32
    fast.score_ids(np.array([[4, 3, 2, 1]], np.int32))
    assert fast.tables is t
    assert Engine(model, vocab, "cpu")._tables is None  # the exact path never builds them


def _mean_abs_log_z(model, batches):
    with torch.no_grad():
        return float(torch.cat([torch.logsumexp(model(b[:, :-1]), 1) for b in batches]).abs().mean())


def test_the_self_norm_penalty_drives_log_z_toward_zero(cslm_corpus):  # noqa: F811
    """The same short training (tiny sizes, 150 Adam steps), alpha = 0 against alpha = 0.5:
    mean |ln Z| over n-grams stays near ln V without the penalty and shrinks with it."""
    info = scan_corpus(str(cslm_corpus), 0.05, seed=1)
    from cslm.data import build_vocab

    vocab = build_vocab(info.counts, 60)
    stream = stream_batches(str(cslm_corpus), vocab, info.heldout_lines, 4, 64, seed=1)
    batches = [torch.from_numpy(next(stream).astype(np.int64)) for _ in range(160)]
    result = {}
    for alpha in (0.0, 0.5):
        torch.manual_seed(0)
        model = CSLM(CSLMConfig(vocab_size=60, order=4, embed=16, hidden=(32,)))
        model.init_weights()
        objective = NgramObjective(model, alpha)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        for b in batches[:150]:
            loss = objective(b[:, :-1], b[:, -1]) / len(b)
            opt.zero_grad()
            loss.backward()
            opt.step()
        result[alpha] = _mean_abs_log_z(model, batches[150:])
    assert result[0.0] > 2.0  # ~ ln 60 = 4.1 at the start; cross-entropy alone does not move it to 0
    assert result[0.5] < 0.5 * result[0.0] and result[0.5] < 1.0, result


def test_the_self_norm_gradient_points_toward_log_z_zero():
    """One gradient step on alpha (ln Z)^2 alone moves ln Z toward 0, from above and from below."""
    model, _ = peaked_model()
    ctx = torch.from_numpy(np.random.default_rng(0).integers(0, 50, size=(64, 3)))
    tgt = torch.zeros(64, dtype=torch.long)
    for shift in (+3.0, -3.0):
        with torch.no_grad():
            model.out.bias += shift
        before = torch.logsumexp(model(ctx), 1).detach()
        with_pen = NgramObjective(model, 1.0)(ctx, tgt) - NgramObjective(model, 0.0)(ctx, tgt)
        model.zero_grad()
        with_pen.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 1e-3 * p.grad
        after = torch.logsumexp(model(ctx), 1).detach()
        assert float(after.abs().mean()) < float(before.abs().mean())
        with torch.no_grad():
            model.out.bias -= shift


def test_perplexity_with_log_z_statistics(engine, cslm_corpus, tmp_path):  # noqa: F811
    head = tmp_path / "head.txt"
    head.write_text("".join(cslm_corpus.read_text().splitlines(True)[:40]) + "w0 never-seen w1\n")
    res = perplexity(engine, str(head), progress=False, log_z=True)
    plain = perplexity(engine, str(head), progress=False)
    assert res["cslm_ppl"] == plain["cslm_ppl"]
    sents = [line.split() for line in head.read_text().splitlines()]
    lp, fl, lz = map(np.concatenate, zip(*engine.score_sentences_log_z(sents)))
    z = lz.astype(np.float64)
    assert res["log_z"]["ngrams"] == res["tokens"] == len(z)
    assert res["log_z"]["mean"] == pytest.approx(z.mean(), abs=1e-9)
    assert res["log_z"]["sd"] == pytest.approx(z.std(), abs=1e-9)
    assert res["log_z"]["mean_abs"] == pytest.approx(np.abs(z).mean(), abs=1e-9)
    assert res["log_z"]["p5"] <= res["log_z"]["p50"] <= res["log_z"]["p95"]
    o = lp.astype(np.float64) + z
    assert res["cslm_ppl_unnormalized"] == pytest.approx(math.exp(-o.mean()), rel=1e-9)
    # the self-normalised engine's own scores give the same unnormalised perplexity
    fast = Engine(engine.model, engine.vocab, "cpu", normalized=False)
    o2 = np.concatenate([s[0] for s in fast.score_sentences(sents)]).astype(np.float64)
    assert math.exp(-o2.mean()) == pytest.approx(res["cslm_ppl_unnormalized"], rel=1e-5)
    # this tiny model was not trained to be self-normalised: ln Z is far from 0
    assert res["log_z"]["mean_abs"] > 0.5


@pytest.fixture(scope="module")
def selfnorm_model(cslm_corpus, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("cslm-sn")
    cfg = TrainConfig(preset="tiny", vocab_size=60, max_epochs=1, valid_fraction=0.05, batch_size=64, device="cpu",
                      self_norm=0.5)
    train(str(cslm_corpus), str(out), cfg, progress=False)
    return out


def _cli(*args):
    from click.testing import CliRunner

    from cslm.cli import main

    return CliRunner().invoke(main, [str(a) for a in args])


def test_cli_score_self_normalized(cslm_model, selfnorm_model, tmp_path):  # noqa: F811
    grams = tmp_path / "g.txt"
    grams.write_text("w0 w1 w2\nw3\n<s> w5 w1 w0 w2 w2 w4\n")
    out = tmp_path / "o.txt"
    r = _cli("score", cslm_model, grams, "--ngrams", "--self-normalized", "-o", out, "--device", "cpu", "--quiet")
    assert r.exit_code == 0, r.output
    warning = [line for line in r.stderr.splitlines() if "warning" in line]
    assert len(warning) == 1 and warning[0].startswith(f"cslm: warning: {cslm_model} was trained without "
                                                       "self-normalisation (self_norm = 0)"), r.stderr
    fast = Engine.load(str(cslm_model), device="cpu", normalized=False)
    want, _ = fast.score_words([line.split() for line in grams.read_text().splitlines()])
    assert [float(line.split("\t")[0]) for line in out.read_text().splitlines()] == pytest.approx(want, abs=1e-6)
    exact = tmp_path / "e.txt"
    r = _cli("score", cslm_model, grams, "--ngrams", "-o", exact, "--device", "cpu", "--quiet")
    assert r.exit_code == 0 and "warning" not in r.stderr  # the exact default: no warning
    assert exact.read_text() != out.read_text()

    r = _cli("score", selfnorm_model, grams, "--ngrams", "--self-normalized", "-o", out, "--device", "cpu",
             "--quiet")
    assert r.exit_code == 0 and "warning" not in r.stderr, r.output  # trained with self_norm 0.5
    r = _cli("score", "--server", "127.0.0.1:1", grams, "--self-normalized", "--quiet")
    assert r.exit_code == 2 and "--self-normalized belongs to the server" in r.output


def test_cli_eval_log_z(selfnorm_model, cslm_corpus, tmp_path):  # noqa: F811
    r = _cli("eval", selfnorm_model, cslm_corpus, "--log-z", "--device", "cpu", "--quiet")
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert set(res["log_z"]) >= {"mean", "sd", "p5", "p50", "p95", "mean_abs"}
    assert res["cslm_ppl_unnormalized"] > 0 and res["train_self_norm"] == 0.5
    r = _cli("eval", selfnorm_model, cslm_corpus, "--device", "cpu", "--quiet")
    assert "log_z" not in json.loads(r.stdout)


def test_cli_serve_self_normalized(cslm_model, tmp_path):  # noqa: F811
    from cslm.client import Client

    proc, port = start_server_process(cslm_model, tmp_path, "--self-normalized", "--threads", "1")
    try:
        fast = Engine.load(str(cslm_model), device="cpu", normalized=False)
        fast.use_evaluator("auto", None)  # the server's choice: the C++ evaluator where it is built
        grams = np.random.default_rng(3).integers(0, len(fast.vocab), size=(300, 7)).astype(np.int32)
        with Client("127.0.0.1", port) as c:
            lp, fl = c.score(grams)
            stats = c.stats()
        assert np.array_equal(lp, fast.score_ids(grams)[0])
        exact = Engine.load(str(cslm_model), device="cpu").score_ids(grams)[0]
        assert not np.allclose(lp, exact, atol=1e-3)
        assert stats["model"]["scores"] == "self-normalized"
    finally:
        proc.terminate()
        proc.wait(30)
    err = proc.stderr.read()
    lines = err.splitlines()
    assert lines[0].startswith(f"cslm: warning: {cslm_model} was trained without self-normalisation"), err
    device = "device cpu" if fast.native is None else f"device cpu, the C++ evaluator ({fast.native.kernels} kernels)"
    assert lines[1].startswith(f"cslm: serving {cslm_model} on 127.0.0.1:{port} (order 7, 60 words, mode unk, "
                               f"{device}; self-normalized scores o_w, no softmax"), err


def test_startup_message_of_the_exact_server_is_unchanged(engine):  # noqa: F811
    assert startup_message(engine, "h", 1) == "cslm: serving on h:1 (order 7, 60 words, mode unk, device cpu)"


def test_cli_serve_int8_needs_the_cpp_evaluator(cslm_model):  # noqa: F811
    """--precision int8 is the C++ evaluator's: with torch, or with exact scores, one line and exit 1."""
    for extra, why in ((["--self-normalized", "--evaluator", "torch"], "--precision int8 is the C++ evaluator's"),
                       ([], "--precision int8 does not apply")):
        r = subprocess.run([sys.executable, "-m", "cslm.cli", "serve", str(cslm_model), "--port", "0",
                            "--precision", "int8", *extra], capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and r.stdout == "", r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and why in r.stderr, r.stderr
