import json
import math

import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from moses_rnn.cli import main
from moses_rnn.networks.modelio import load_model
from moses_rnn.training.train import TrainConfig, train
from mtcommon.checkpoint import Checkpoint


def test_training_lowers_heldout_perplexity(tmp_path, example_table):
    cfg = TrainConfig(preset="tiny", max_steps=150, eval_every=150, valid_pairs=30, device="cpu")
    first = train(str(example_table), str(tmp_path / "a"), TrainConfig(**{**cfg.__dict__, "max_steps": 1}), progress=False)
    done = train(str(example_table), str(tmp_path / "b"), cfg, progress=False)
    assert done["valid_ppl"] < 0.6 * first["valid_ppl"]
    loaded = load_model(str(tmp_path / "b"))
    assert loaded.config.hidden == 32 and len(loaded.src_vocab) == loaded.config.src_vocab
    assert math.isfinite(loaded.meta["valid_ppl"])


def test_resume_continues_exactly(tmp_path, example_table):
    # a dtype given: with 'auto' the two runs might each time their own choice (tests/test_dtype.py resumes that)
    base = dict(preset="tiny", eval_every=10, valid_pairs=20, device="cpu", seed=7, dtype="fp32")
    train(str(example_table), str(tmp_path / "full"), TrainConfig(max_steps=40, **base), progress=False)
    train(str(example_table), str(tmp_path / "half"), TrainConfig(max_steps=20, **base), progress=False)
    assert Checkpoint.load(str(tmp_path / "half")).loop.step == 20
    train(str(example_table), str(tmp_path / "half"), TrainConfig(max_steps=40, **base), resume=True, progress=False)
    a = Checkpoint.load(str(tmp_path / "full")).model
    b = Checkpoint.load(str(tmp_path / "half")).model
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), k


def test_max_minutes_bounds_the_whole_training_across_resumes(tmp_path, example_table):
    """The wall-clock budget is the training's, as max_steps is: a resumed run gets what is left."""
    base = dict(preset="tiny", eval_every=10, valid_pairs=20, device="cpu", seed=7, dtype="fp32")
    train(str(example_table), str(tmp_path / "m"), TrainConfig(max_steps=20, **base), progress=False)
    spent = Checkpoint.load(str(tmp_path / "m")).loop.wall_seconds
    assert spent > 0
    # a budget already spent: the resumed run stops at once, by the clock, at the same step
    done = train(str(example_table), str(tmp_path / "m"), TrainConfig(max_steps=40, max_minutes=spent / 120, **base),
                 resume=True, progress=False)
    assert done["stopped"] == "max_minutes" and done["steps"] == 20
    # a budget left: it goes on, and the time adds up
    done = train(str(example_table), str(tmp_path / "m"), TrainConfig(max_steps=40, max_minutes=60, **base),
                 resume=True, progress=False)
    assert done["stopped"] == "max_steps" and done["steps"] == 40
    assert Checkpoint.load(str(tmp_path / "m")).loop.wall_seconds > spent


def test_cli_train_and_model_dir_layout(tmp_path, example_table):
    out = tmp_path / "m"
    r = CliRunner().invoke(main, ["train", str(example_table), "-o", str(out), "--preset", "tiny", "--max-steps", "5",
                                  "--eval-every", "5", "--valid-pairs", "10", "--quiet", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors", "src.vocab", "tgt.vocab", "checkpoint.pt"}
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model"]["arch"] == "encdec" and cfg["meta"]["step"] == 5
    assert set(load_file(str(out / "model.safetensors"))) == set(load_model(str(out)).model.state_dict())
    torch.load(str(out / "checkpoint.pt"), weights_only=True)  # no pickled code


# -- recipes, batching, sampled softmax, threads, torchrun ---------------------------------------------------------
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from moses_rnn.networks.modelbase import preset_config
from moses_rnn.networks.modelio import build_model
from moses_rnn.training.train import (RECIPES, BucketedBatches, PairObjective, load_corpus, read_unique_pairs,
                             sampled_candidates, build_vocabularies)
from mtcommon.runtime import ThreadTuner, choose_threads
from mtcommon.vocab import EOS


def test_paper_recipe_is_the_papers_training():
    cfg = TrainConfig(recipe="paper")
    assert (cfg.batch_size, cfg.optimizer, cfg.lr, cfg.rho, cfg.eps) == (64, "adadelta", 1.0, 0.95, 1e-6)
    assert (cfg.sampled_softmax, cfg.bucket, cfg.dtype, cfg.clip) == (0, False, "fp32", 0.0)
    fast = TrainConfig(batch_size=128)  # a field given explicitly wins over the recipe's
    assert fast.recipe == "fast" and fast.batch_size == 128 and fast.sampled_softmax == RECIPES["fast"]["sampled_softmax"]
    with pytest.raises(ValueError, match="unknown recipe"):
        TrainConfig(recipe="quick")


@pytest.mark.parametrize("recipe", ["paper", "fast"])
def test_resume_is_exact_for_each_recipe(tmp_path, example_table, recipe):
    base = dict(preset="tiny", recipe=recipe, batch_size=32, eval_every=10, valid_pairs=20, device="cpu", seed=3,
                sampled_softmax=64 if recipe == "fast" else None, dtype="fp32")
    full = train(str(example_table), str(tmp_path / "full"), TrainConfig(max_steps=30, **base), progress=False,
                 trace=True)
    train(str(example_table), str(tmp_path / "half"), TrainConfig(max_steps=15, **base), progress=False)
    rest = train(str(example_table), str(tmp_path / "half"), TrainConfig(max_steps=30, **base), resume=True,
                 progress=False, trace=True)
    assert rest["loss_trace"] == pytest.approx(full["loss_trace"][15:], rel=1e-5)
    a, b = Checkpoint.load(str(tmp_path / "full")).model, Checkpoint.load(str(tmp_path / "half")).model
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), k


def test_summary_reports_the_training_rate(tmp_path, example_table):
    s = train(str(example_table), str(tmp_path / "m"), TrainConfig(preset="tiny", batch_size=16, max_steps=12,
              eval_every=6, valid_pairs=10, device="cpu"), progress=False)
    assert s["pairs_seen"] == 12 * 16 and 0 < s["train_seconds"] <= s["seconds"]
    assert [h["step"] for h in s["valid_ppl_history"]] == [6, 12]
    assert s["valid_ppl_history"][-1]["valid_ppl"] == s["valid_ppl"]


def test_vectorised_corpus_matches_pair_by_pair_encoding(example_table):
    sources, targets = read_unique_pairs(str(example_table))
    sv, tv = build_vocabularies(str(example_table), 60, 60)
    corpus = load_corpus(str(example_table), sv, tv)
    assert len(corpus) == len(set(zip(sources, targets))) == len(sources)
    for i in range(0, len(sources), 37):
        assert corpus.src[corpus.src_off[i] : corpus.src_off[i + 1]].tolist() == sv.encode(sources[i].split())
        assert corpus.tgt[corpus.tgt_off[i] : corpus.tgt_off[i + 1]].tolist() == tv.encode(targets[i].split()) + [
            tv.index[EOS]]
    src, src_mask, tgt, tgt_mask = corpus.batch(np.array([0, 5, 9]), torch.device("cpu"))
    assert src_mask.sum(1).tolist() == corpus.src_len[[0, 5, 9]].tolist()
    assert tgt[1, : int(tgt_mask[1].sum())].tolist() == corpus.tgt[corpus.tgt_off[5] : corpus.tgt_off[6]].tolist()


def test_bucketed_batches_cover_each_epoch_once_with_equal_lengths(example_table):
    sv, tv = build_vocabularies(str(example_table), 60, 60)
    corpus = load_corpus(str(example_table), sv, tv)
    train_idx = np.arange(len(corpus))
    order = BucketedBatches(corpus, train_idx, batch_size=16, seed=5, chunk=8)
    epoch = [order(s) for s in range(order.per_epoch)]
    seen = np.concatenate(epoch)
    assert len(seen) == len(set(seen.tolist())) == order.per_epoch * 16
    uniform = sum(len(set(zip(corpus.src_len[b], corpus.tgt_len[b]))) == 1 for b in epoch)
    assert uniform >= len(epoch) // 2  # most batches are of one length; a length group may end inside a batch
    again = BucketedBatches(corpus, train_idx, batch_size=16, seed=5, chunk=8)
    assert np.array_equal(again(order.per_epoch + 3), order(order.per_epoch + 3))  # a function of (seed, step)
    assert not np.array_equal(order(order.per_epoch), epoch[0])  # each epoch is a new order


def test_sampled_candidates_hold_the_batch_targets():
    targets = np.array([5, 9, 9, 200, 7])
    cand, log_q = sampled_candidates(targets, 1000, 64, seed=1, step=4)
    assert len(cand) == len(log_q) == 64 and np.all(np.diff(cand) > 0) and set(targets) <= set(cand.tolist())
    # batch words are always in (log q = 0); the 60 others were drawn from the 996 remaining words
    assert np.all(log_q[np.isin(cand, targets)] == 0)
    assert np.allclose(log_q[~np.isin(cand, targets)], np.log(60 / 996))
    again, _ = sampled_candidates(targets, 1000, 64, seed=1, step=4)
    assert np.array_equal(cand, again) and not np.array_equal(cand, sampled_candidates(targets, 1000, 64, 1, 5)[0])
    assert np.array_equal(sampled_candidates(targets, 50, 64, 1, 1)[0], np.arange(50))  # a subset as large as V is V


def test_importance_weighted_normaliser_is_unbiased():
    """E over draws of sum_{V'} exp(l - log q) equals the full normaliser Z (Jean et al. 2015, Sec. 3.1)."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=300)
    targets = np.array([3, 17, 40])
    estimates = []
    for step in range(3000):
        cand, log_q = sampled_candidates(targets, 300, 30, seed=2, step=step)
        estimates.append(np.exp(logits[cand] - log_q).sum())
    assert np.mean(estimates) == pytest.approx(np.exp(logits).sum(), rel=0.02)


def test_sampled_objective_over_the_whole_shortlist_is_the_full_softmax():
    torch.manual_seed(0)
    model = build_model(preset_config("tiny", 30, 40))
    model.init_weights()
    src = torch.randint(3, 30, (4, 3))
    tgt = torch.randint(3, 40, (4, 5))
    mask_s, mask_t = torch.ones_like(src, dtype=torch.bool), torch.ones_like(tgt, dtype=torch.bool)
    mask_t[1, 3:] = False
    obj = PairObjective(model)
    full = obj(src, mask_s, tgt, mask_t)
    assert full.item() == pytest.approx(-model(src, mask_s, tgt, mask_t).sum().item(), rel=1e-5)
    everything = torch.arange(40)
    assert obj(src, mask_s, tgt, mask_t, everything, torch.zeros(40), tgt).item() == pytest.approx(full.item(), rel=1e-5)
    sub = torch.unique(torch.cat([tgt.flatten(), torch.tensor([3, 4])]))
    pos = torch.searchsorted(sub, tgt)
    assert obj(src, mask_s, tgt, mask_t, sub, torch.zeros(len(sub)), pos).item() < full.item()  # fewer competitors


def test_thread_tuner_keeps_the_fastest_count():
    tuner = ThreadTuner(torch.device("cpu"), None, period=100, trial=3, warmup=2, cores=4)
    assert tuner.active and tuner.candidates == [1, 2, 4]
    cost = {1: 3.0, 2: 1.0, 4: 5.0}  # four threads beside a busy neighbour: slowest
    try:
        for step in range(20):
            tuner.before_step(step)
            tuner.after_step(cost[torch.get_num_threads()])
        assert tuner.current == 2 and tuner.decisions == [(10, 2)]
    finally:
        torch.set_num_threads(1)
    assert not ThreadTuner(torch.device("cpu"), 3).active  # a count the user gave is kept
    assert choose_threads(torch.device("cpu"), None, big=False) == 1
    assert choose_threads(torch.device("cpu"), 5) == 5


DDP_SCRIPT = textwrap.dedent("""
    import json, sys, torch
    torch.set_num_threads(1)
    from moses_rnn.training.train import TrainConfig, train
    cfg = TrainConfig(preset="tiny", recipe=sys.argv[3], batch_size=32, max_steps=12, eval_every=6, valid_pairs=20,
                      device="cpu", threads=1, seed=2, dtype="fp32", sampled_softmax=64 if sys.argv[3] == "fast" else None)
    s = train(sys.argv[1], sys.argv[2], cfg, progress=False, trace=True)
    if s["rank"] == 0:
        print(json.dumps({k: s[k] for k in ("loss_trace", "valid_ppl", "processes", "pairs_seen")}))
""")


@pytest.mark.parametrize("recipe", ["paper", "fast"])
def test_torchrun_two_processes_follow_the_single_process_run(tmp_path, example_table, recipe):
    script = tmp_path / "ddp_train.py"
    script.write_text(DDP_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def run(*launcher, out):
        p = subprocess.run([*launcher, str(script), str(example_table), str(tmp_path / out), recipe],
                           capture_output=True, text=True, timeout=240, env=env)
        assert p.returncode == 0, p.stderr[-3000:]
        return json.loads(p.stdout.strip().splitlines()[-1])

    one = run(sys.executable, out="one")
    two = run(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", out="two")
    assert (one["processes"], two["processes"]) == (1, 2) and one["pairs_seen"] == two["pairs_seen"] == 12 * 32
    assert two["loss_trace"] == pytest.approx(one["loss_trace"], rel=1e-4, abs=1e-5)
    assert two["valid_ppl"] == pytest.approx(one["valid_ppl"], rel=1e-4)


def test_thread_tuner_tries_again_when_a_neighbour_slows_it_down():
    tuner = ThreadTuner(torch.device("cpu"), None, period=10**6, trial=2, warmup=0, cores=2)
    cost = {1: 2.0, 2: 1.0}
    try:
        for step in range(4):  # the first trial: 2 threads are faster
            tuner.before_step(step)
            tuner.after_step(cost[torch.get_num_threads()])
        assert tuner.current == 2
        cost = {1: 2.0, 2: 9.0}  # a neighbour takes a core: two threads now wait on each other
        for step in range(4, 30):
            tuner.before_step(step)
            tuner.after_step(cost[torch.get_num_threads()])
        assert tuner.current == 1 and len(tuner.decisions) == 2
    finally:
        torch.set_num_threads(1)
