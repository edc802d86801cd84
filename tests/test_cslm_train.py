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
from cslm.train import RECIPES, NgramObjective, TrainConfig, train
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


DDP_SCRIPT = textwrap.dedent("""
    import json, sys, torch
    torch.set_num_threads(1)
    from cslm.train import TrainConfig, train
    cfg = TrainConfig(preset="tiny", vocab_size=60, max_epochs=2, valid_fraction=0.05, batch_size=64, device="cpu",
                      threads=1, dtype="fp32", seed=5)
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
