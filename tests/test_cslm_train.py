"""CSLM training on the shared loop: recipes, self-normalisation, torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from cslm import modeldir
from cslm.train import RECIPES, NceObjective, NgramObjective, TrainConfig, noise_distribution, train
from cslm.data import heldout_ngrams, scan_corpus
from tests.test_cslm import synthetic_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return synthetic_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt", sentences=300, seed=4)


def test_recipes():
    assert (TrainConfig(recipe="paper").batch_size, TrainConfig(recipe="paper").dtype) == (256, "fp32")
    assert TrainConfig().recipe == "fast" and TrainConfig().batch_size == RECIPES["fast"]["batch_size"]
    assert TrainConfig(batch_size=64).batch_size == 64


def test_summary_reports_ngrams_seen_and_training_time(corpus, tmp_path):
    cfg = TrainConfig(preset="tiny", vocab_size=60, max_epochs=2, valid_fraction=0.05, batch_size=64, device="cpu")
    s = train(str(corpus), str(tmp_path / "m"), cfg, progress=False)
    per_epoch = s["train_ngrams"] // 64
    assert s["epochs"] == 2 and s["steps"] == 2 * per_epoch and s["ngrams_seen"] == 2 * per_epoch * 64
    assert 0 < s["train_seconds"] <= s["seconds"]
    assert [h["step"] for h in s["valid_ppl_history"]] == [per_epoch, 2 * per_epoch]


def test_self_normalisation_pulls_log_z_to_zero(corpus, tmp_path):
    """Devlin et al. (2014): alpha (log Z)^2 makes the unnormalised score a log-probability, nearly."""
    def log_z(alpha):
        out = tmp_path / f"a{alpha}"
        cfg = TrainConfig(preset="tiny", vocab_size=60, max_epochs=4, valid_fraction=0.05, batch_size=32,
                          device="cpu", self_norm=alpha, lr=3e-3)
        train(str(corpus), str(out), cfg, progress=False)
        loaded = modeldir.load(str(out))
        info = scan_corpus(str(corpus), 0.05, 1)
        grams = heldout_ngrams(str(corpus), loaded.vocab, info.heldout_lines, loaded.config.order)
        with torch.no_grad():
            logits = loaded.model(torch.from_numpy(grams[:, :-1].astype(np.int64)))
        return torch.logsumexp(logits, 1).abs().mean().item()

    assert log_z(1.0) < 0.25 * log_z(0.0)


def test_objective_penalty_is_alpha_times_log_z_squared():
    from cslm.model import CSLM, preset_config

    torch.manual_seed(0)
    model = CSLM(preset_config("tiny", 30))
    model.init_weights()
    ctx, y = torch.randint(0, 30, (5, 6)), torch.randint(0, 30, (5,))
    logits = model(ctx)
    lz = torch.logsumexp(logits, 1)
    want = (lz - logits[torch.arange(5), y]).sum() + 0.5 * (lz ** 2).sum()
    assert NgramObjective(model, 0.5)(ctx, y).item() == pytest.approx(want.item(), rel=1e-6)
    assert NgramObjective(model, 0.0)(ctx, y).item() == pytest.approx((lz - logits[torch.arange(5), y]).sum().item(),
                                                                        rel=1e-6)


def test_nce_loss_follows_its_formula():
    """Mnih & Teh (2012): -ln sigmoid(D(w)) - sum_j ln sigmoid(-D(n_j)), D(w) = o_w - ln(k q(w)); the k noise
    words shared by the batch."""
    from cslm.model import CSLM, preset_config

    torch.manual_seed(0)
    model = CSLM(preset_config("tiny", 30))
    model.init_weights()
    ctx, y, noise = torch.randint(0, 30, (5, 6)), torch.randint(0, 30, (5,)), torch.randint(0, 30, (4,))
    log_kq = torch.log(4 * torch.softmax(torch.randn(30), 0))
    logits = model(ctx)
    d_data = logits[torch.arange(5), y] - log_kq[y]
    d_noise = logits[:, noise] - log_kq[noise]
    want = -(torch.log(torch.sigmoid(d_data)).sum() + torch.log(1 - torch.sigmoid(d_noise)).sum())
    assert NceObjective(model, log_kq)(ctx, y, noise).item() == pytest.approx(want.item(), rel=1e-5)


def test_noise_distribution_is_the_training_unigram_distribution():
    from collections import Counter

    from cslm.data import build_vocab

    counts = Counter({"a": 6, "b": 3, "c": 1})  # 10 words in 4 sentences; c falls outside a shortlist of 5
    vocab = build_vocab(counts, 5)
    q = noise_distribution(vocab, counts, 4)
    assert q.sum() == pytest.approx(1.0) and q[vocab.index["<s>"]] == 0
    assert q[vocab.index["a"]] == pytest.approx(6 / 14) and q[vocab.index["</s>"]] == pytest.approx(4 / 14)
    assert q[vocab.unk_id] == pytest.approx(1 / 14)


def _heldout_log_z(corpus, loaded) -> torch.Tensor:
    """ln Z(h) of every held-out n-gram's history (valid_fraction 0.05, seed 1, as the NCE tests train)."""
    info = scan_corpus(str(corpus), 0.05, 1)
    grams = heldout_ngrams(str(corpus), loaded.vocab, info.heldout_lines, loaded.config.order)
    with torch.no_grad():
        return torch.logsumexp(loaded.model(torch.from_numpy(grams[:, :-1].astype(np.int64))), 1)


def test_nce_training_learns_a_self_normalised_model_and_resumes_exactly(corpus, tmp_path):
    """NCE lowers held-out perplexity (measured with the exact softmax), leaves ln Z near 0 without a penalty,
    marks the model self-normalised, and a resumed run draws the noise the uninterrupted one drew."""
    from cslm.engine import Engine

    def cfg(epochs):
        return TrainConfig(preset="tiny", vocab_size=60, max_epochs=epochs, valid_fraction=0.05, batch_size=32,
                           device="cpu", objective="nce", noise_samples=20, lr=3e-3, dtype="fp32", threads=1)

    whole = train(str(corpus), str(tmp_path / "whole"), cfg(4), progress=False)
    history = [h["valid_ppl"] for h in whole["valid_ppl_history"]]
    assert history[-1] < min(history[0], 60)  # learning, and better than uniform over the shortlist
    train(str(corpus), str(tmp_path / "split"), cfg(2), progress=False)
    resumed = train(str(corpus), str(tmp_path / "split"), cfg(4), resume=True, progress=False)
    assert [h["valid_ppl"] for h in resumed["valid_ppl_history"]] == pytest.approx(history, rel=1e-6)

    loaded = modeldir.load(str(tmp_path / "whole"))
    log_z = _heldout_log_z(corpus, loaded)
    # NCE starts from output biases of -ln V (ln Z ~ 0) and, without a penalty, keeps ln Z near 0
    assert log_z.abs().mean().item() < 0.25 * np.log(loaded.config.vocab_size)
    engine = Engine.load(str(tmp_path / "whole"), device="cpu", normalized=False)
    assert engine.trained_self_normalized and engine.self_norm_warning() is None


def test_nce_keeps_words_the_noise_seldom_draws_normalised(corpus, tmp_path):
    """With one noise word an update, most of the shortlist is seldom drawn as noise and keeps the score it
    starts with: NCE starts the output biases at -ln V (Vaswani et al. 2013), so those words start, and stay,
    near probability 1/V instead of near 1 (from biases near 0, ln Z would be near ln V)."""
    cfg = TrainConfig(preset="tiny", vocab_size=60, max_epochs=2, valid_fraction=0.05, batch_size=32,
                      device="cpu", objective="nce", noise_samples=1, lr=3e-3, dtype="fp32", threads=1)
    train(str(corpus), str(tmp_path / "m"), cfg, progress=False)
    loaded = modeldir.load(str(tmp_path / "m"))
    assert loaded.model.out.bias.mean().item() < -0.5 * np.log(loaded.config.vocab_size)
    log_z = _heldout_log_z(corpus, loaded)
    assert log_z.abs().mean().item() < 0.25 * np.log(loaded.config.vocab_size)


@pytest.mark.parametrize("kwargs,message", [
    (dict(objective="nce", self_norm=0.1), "NCE self-normalises by itself"),
    (dict(objective="hinge"), "objective must be one of softmax, nce, not 'hinge'"),
    (dict(objective="nce", noise_samples=0), "--noise-samples must be between 1 and the shortlist's 10000 words, not 0"),
])
def test_nce_options_are_checked(kwargs, message):
    from mtcommon.errors import UserError

    with pytest.raises(UserError, match=message):
        TrainConfig(**kwargs)


def test_cli_refuses_nce_with_a_self_norm_penalty_in_one_line(corpus, tmp_path):
    r = subprocess.run([sys.executable, "-m", "cslm.cli", "train", str(corpus), "-o", str(tmp_path / "m"),
                        "--objective", "nce", "--self-norm", "0.1", "--preset", "tiny", "--quiet"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "NCE self-normalises by itself" in r.stderr and not (tmp_path / "m" / "config.json").exists()


DDP_SCRIPT = textwrap.dedent("""
    import json, sys, torch
    torch.set_num_threads(1)
    from cslm.train import TrainConfig, train
    cfg = TrainConfig(preset="tiny", vocab_size=60, max_epochs=2, valid_fraction=0.05, batch_size=64, device="cpu",
                      threads=1, dtype="fp32", seed=5, lr_schedule="linear")  # every rank steps with the same rate
    s = train(sys.argv[1], sys.argv[2], cfg, progress=False, trace=True)
    if s["rank"] == 0:
        print(json.dumps({k: s[k] for k in ("loss_trace", "best_valid_ppl", "processes", "ngrams_seen")}))
""")


def test_torchrun_two_processes_follow_the_single_process_run(corpus, tmp_path):
    script = tmp_path / "ddp_cslm.py"
    script.write_text(DDP_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def run(*launcher, out):
        p = subprocess.run([*launcher, str(script), str(corpus), str(tmp_path / out)], capture_output=True, text=True,
                           timeout=240, env=env)
        assert p.returncode == 0, p.stderr[-3000:]
        return json.loads(p.stdout.strip().splitlines()[-1])

    one = run(sys.executable, out="one")
    two = run(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", out="two")
    assert two["processes"] == 2 and two["ngrams_seen"] == one["ngrams_seen"]
    assert two["loss_trace"] == pytest.approx(one["loss_trace"], rel=1e-4, abs=1e-5)
    assert two["best_valid_ppl"] == pytest.approx(one["best_valid_ppl"], rel=1e-4)


def test_dropout_acts_in_training_only_and_is_kept_in_the_model_config(corpus, tmp_path):
    from cslm.model import CSLM, CSLMConfig, preset_config
    from mtcommon.errors import UserError

    with pytest.raises(UserError, match=r"`dropout` must be a number in \[0, 1\), not 1.0"):
        CSLMConfig(dropout=1.0)
    with pytest.raises(UserError, match=r"`dropout` must be a number in \[0, 1\), not -0.1"):
        TrainConfig(dropout=-0.1)
    torch.manual_seed(0)
    plain = CSLM(preset_config("tiny", 60))
    plain.init_weights()
    dropped = CSLM(preset_config("tiny", 60, dropout=0.5))
    dropped.load_state_dict(plain.state_dict())
    context = torch.randint(0, 60, (8, 6))
    dropped.train()
    assert not torch.equal(dropped(context), dropped(context))  # a fresh mask each call
    dropped.eval()
    plain.eval()
    assert torch.equal(dropped(context), plain(context))  # scoring sees the whole network

    cfg = TrainConfig(preset="tiny", vocab_size=60, max_epochs=2, valid_fraction=0.05, batch_size=64,
                      device="cpu", dropout=0.2, dtype="fp32", threads=1)
    train(str(corpus), str(tmp_path / "m"), cfg, progress=False)
    assert modeldir.load(str(tmp_path / "m")).config.dropout == 0.2


def test_valid_text_decides_the_best_weights(corpus, tmp_path):
    """With valid_text, held-out perplexity is the exact perplexity of that text's n-grams, and the weights kept
    are those with the lowest of it."""
    from cslm.train import heldout_nll
    from mtcommon.errors import UserError

    dev = synthetic_corpus(tmp_path / "dev.txt", sentences=30, seed=9)
    cfg = TrainConfig(preset="tiny", vocab_size=60, max_epochs=3, valid_fraction=0.05, batch_size=64, device="cpu",
                      dtype="fp32", threads=1, valid_text=str(dev))
    s = train(str(corpus), str(tmp_path / "m"), cfg, progress=False)
    loaded = modeldir.load(str(tmp_path / "m"))
    grams = heldout_ngrams(str(dev), loaded.vocab, None, loaded.config.order)
    assert s["valid_ngrams"] == len(grams) and s["valid_text"] == str(dev)
    nll, n = heldout_nll(loaded.model, grams, "cpu")
    assert np.exp(nll / n) == pytest.approx(s["best_valid_ppl"], rel=1e-4)

    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(UserError, match="empty.txt: no sentence to measure perplexity on"):
        train(str(corpus), str(tmp_path / "e"), TrainConfig(**{**cfg.__dict__, "valid_text": str(empty)}),
              progress=False)
