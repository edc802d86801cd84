"""`--dtype auto`: the probe's decision (`runtime.probe_dtype`) on injected timings, and runs whose dtype it
chose equal to runs given that dtype explicitly (training, resume, scoring), on any CPU."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from mtcommon import runtime, trainer
from mtcommon.errors import UserError
from mtcommon.checkpoint import Checkpoint

BF16, FP32 = torch.bfloat16, None
CPU = torch.device("cpu")


class FakeWork:
    """A probe step that takes `cost[amp]` seconds of a fake clock, recording which dtypes it ran under."""

    def __init__(self, cost: dict, inner=None):
        self.cost, self.inner, self.now, self.calls = cost, inner, 0.0, []

    def __call__(self, amp):
        if self.inner is not None:
            self.inner(amp)
        self.calls.append(amp)
        self.now += self.cost[amp]

    def clock(self) -> float:
        return self.now


def probe(work: FakeWork, dtype: str = "auto", device=CPU, **kw):
    return runtime.probe_dtype(device, dtype, work, clock=work.clock, quiet=kw.pop("quiet", True), **kw)


@pytest.fixture
def native(monkeypatch):
    """This CPU with native bfloat16 (the probe runs), whatever the test machine has."""
    monkeypatch.setattr(runtime, "cpu_has_bf16", lambda: True)


# -- the decision ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cost, want", [({FP32: 1 / 32, BF16: 1 / 16}, FP32), ({FP32: 1 / 16, BF16: 1 / 32}, BF16),
                                        ({FP32: 1 / 32, BF16: 1 / 32}, FP32)])  # a tie keeps float32 (exact sums)
def test_auto_picks_the_faster_after_a_warm_up_of_each(native, cost, want):
    work = FakeWork(cost)
    assert probe(work) is want
    assert work.calls[:2] == [FP32, BF16]  # the warm-up, untimed
    rounds = work.calls[2:]
    assert len(rounds) == 2 * 5 and rounds.count(FP32) == rounds.count(BF16) == 5  # interleaved rounds


def test_medians_not_means_decide(native):
    """One slow outlier of bf16 (a neighbour's burst) does not make it lose."""
    times = {FP32: iter([0] + [1 / 32] * 5), BF16: iter([0, 1 / 64, 1 / 64, 8, 1 / 64, 1 / 64])}

    class Outlier(FakeWork):
        def __call__(self, amp):
            self.calls.append(amp)
            self.now += next(times[amp])

    assert probe(Outlier({}), budget=100) is BF16


def test_the_budget_bounds_the_rounds_but_one_is_always_timed(native):
    slow = FakeWork({FP32: 0.6, BF16: 0.5})
    assert probe(slow, budget=2.0) is BF16
    assert len(slow.calls) == 4  # warm-up and one round: another would pass the 2 s
    fast = FakeWork({FP32: 0.01, BF16: 0.02})
    assert probe(fast, budget=2.0, repeats=3) is FP32 and len(fast.calls) == 2 + 2 * 3


def test_no_probe_without_native_bf16(monkeypatch):
    monkeypatch.setattr(runtime, "cpu_has_bf16", lambda: False)
    work = FakeWork({FP32: 1.0, BF16: 0.1})
    assert probe(work) is FP32 and work.calls == []


@pytest.mark.parametrize("has_bf16", [True, False])
def test_an_explicit_dtype_is_never_probed(monkeypatch, has_bf16):
    monkeypatch.setattr(runtime, "cpu_has_bf16", lambda: has_bf16)
    work = FakeWork({FP32: 1.0, BF16: 0.1})
    assert probe(work, "fp32") is FP32
    if has_bf16:
        assert probe(work, "bf16") is BF16
    else:
        with pytest.raises(UserError, match="--dtype bf16 asked for, but this CPU has no native bfloat16"):
            probe(work, "bf16")
    assert work.calls == []


@pytest.mark.parametrize("has_bf16", [True, False])
def test_a_gpu_keeps_the_rule_without_timing(monkeypatch, has_bf16):
    monkeypatch.setattr(runtime, "native_bf16", lambda device: has_bf16)
    work = FakeWork({FP32: 0.01, BF16: 1.0})
    assert probe(work, device=torch.device("cuda")) is (BF16 if has_bf16 else FP32) and work.calls == []


def test_processes_decide_together(monkeypatch):
    """Under torchrun the medians are summed over the processes; one without native bfloat16 takes no
    time but votes float32 infinitely faster."""
    monkeypatch.setattr(runtime, "cpu_has_bf16", lambda: True)
    others = [0.10, 0.01]  # another process where bf16 is far faster
    seen = []

    def combine(medians):
        seen.append(list(medians))
        return [a + b for a, b in zip(medians, others)]

    assert probe(FakeWork({FP32: 0.03, BF16: 0.04}), combine=combine) is BF16  # 0.13 against 0.05
    assert seen == [[pytest.approx(0.03), pytest.approx(0.04)]]
    monkeypatch.setattr(runtime, "cpu_has_bf16", lambda: False)
    work = FakeWork({FP32: 1.0, BF16: 0.1})
    assert probe(work, combine=combine) is FP32 and work.calls == [] and seen[-1] == [0.0, math.inf]


def test_the_choice_and_both_times_in_one_line_unless_quiet(native, capsys):
    probe(FakeWork({FP32: 0.0312, BF16: 0.0405}), what="a training step", quiet=False)
    err = capsys.readouterr().err
    assert err == "--dtype auto: fp32, the faster here (a training step: fp32 31.2 ms, bf16 40.5 ms, medians of 5)\n"
    probe(FakeWork({FP32: 0.0312, BF16: 0.0405}))
    assert capsys.readouterr().err == ""


# -- runs: the chosen dtype's run is the explicit run ---------------------------------------------------------
def force(monkeypatch, choice):
    """Make `--dtype auto` choose `choice` on any CPU, through fake timings of the callers' real steps;
    returns the dtypes the steps ran under."""
    from moses_rnn.scoring import scorer

    real = runtime.probe_dtype
    calls: list = []

    def forced(device, dtype, step, **kw):
        work = FakeWork({choice: 1.0, (BF16 if choice is FP32 else FP32): 2.0}, inner=step)
        try:
            return real(device, dtype, work, clock=work.clock, **kw)
        finally:
            calls.extend(work.calls)

    monkeypatch.setattr(runtime, "cpu_has_bf16", lambda: True)
    for module in (trainer, scorer):
        monkeypatch.setattr(module, "probe_dtype", forced)
    return calls


def rnn_run(table, out, dtype, steps=6, resume=False):
    from moses_rnn.training.train import TrainConfig, train

    cfg = TrainConfig(preset="tiny", batch_size=16, sampled_softmax=64, max_steps=steps, eval_every=3,
                      valid_pairs=10, device="cpu", threads=1, seed=4, dtype=dtype)
    return train(str(table), str(out), cfg, resume=resume, progress=False)


def cslm_run(corpus, out, dtype, resume=False):
    from cslm.train import TrainConfig, train

    cfg = TrainConfig(preset="tiny", vocab_size=40, batch_size=32, max_epochs=2, epoch_ngrams=96,
                      valid_fraction=0.05, device="cpu", threads=1, seed=4, dtype=dtype)
    return train(str(corpus), str(out), cfg, resume=resume, progress=False)


def same_weights(a, b) -> bool:
    wa, wb = Checkpoint.load(str(a)).model, Checkpoint.load(str(b)).model
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    r = random.Random(1)
    path = tmp_path_factory.mktemp("dtype-corpus") / "corpus.txt"
    path.write_text("".join(" ".join(f"w{r.randrange(50)}" for _ in range(r.randint(3, 9))) + "\n"
                            for _ in range(150)), encoding="utf-8")
    return path


@pytest.mark.parametrize("choice", [FP32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("net", ["rnn", "cslm"])
def test_training_with_the_chosen_dtype_equals_the_explicit_run(monkeypatch, tmp_path, example_table, corpus, net,
                                                                choice):
    """The probe's forward and backward passes over the first batch change nothing: the weights after the
    run (and the CSLM's n-gram stream, which the probe's batch is not drawn from twice) are the explicit run's."""
    run = (lambda out, dtype: rnn_run(example_table, out, dtype)) if net == "rnn" else \
        (lambda out, dtype: cslm_run(corpus, out, dtype))
    calls = force(monkeypatch, choice)
    auto = run(tmp_path / "auto", "auto")
    assert calls.count(FP32) >= 2 and calls.count(BF16) >= 2  # it did probe, with real steps
    name = runtime.dtype_name(choice)
    assert auto["dtype"] == name and Checkpoint.load(str(tmp_path / "auto")).train_config["dtype"] == name
    explicit = run(tmp_path / "explicit", name)
    assert same_weights(tmp_path / "auto", tmp_path / "explicit")
    assert [(h["step"], h["valid_ppl"]) for h in auto["valid_ppl_history"]] == \
        [(h["step"], h["valid_ppl"]) for h in explicit["valid_ppl_history"]]


def test_a_resumed_run_keeps_the_dtype_it_chose(monkeypatch, tmp_path, example_table):
    force(monkeypatch, BF16)
    rnn_run(example_table, tmp_path / "run", "auto", steps=3)
    calls = force(monkeypatch, FP32)  # a probe now would choose float32
    done = rnn_run(example_table, tmp_path / "run", "auto", steps=6, resume=True)
    assert calls == [] and done["dtype"] == "bf16"
    rnn_run(example_table, tmp_path / "explicit", "bf16", steps=6)
    assert same_weights(tmp_path / "run", tmp_path / "explicit")  # as if never interrupted
    # bf16 or fp32 given again on resume wins (a run moved to other hardware)
    assert rnn_run(example_table, tmp_path / "run", "fp32", steps=8, resume=True)["dtype"] == "fp32"


def test_resuming_bf16_where_it_is_not_native_says_what_to_do(monkeypatch, tmp_path, example_table):
    force(monkeypatch, BF16)
    rnn_run(example_table, tmp_path / "run", "auto", steps=3)
    monkeypatch.setattr(runtime, "cpu_has_bf16", lambda: False)
    with pytest.raises(UserError, match=r"no native bfloat16 .*computes in bf16: resume it with --dtype fp32"):
        rnn_run(example_table, tmp_path / "run", "auto", steps=6, resume=True)


@pytest.mark.parametrize("choice", [FP32, BF16], ids=["fp32", "bf16"])
def test_scoring_with_the_chosen_dtype_equals_the_explicit_scorer(monkeypatch, tiny_model, choice):
    from moses_rnn.scoring.scorer import PROBE_PAIRS, PhraseScorer

    r = random.Random(2)
    words = [w for w in PhraseScorer.from_dir(str(tiny_model), device="cpu").src_vocab.words[2:40]]
    pairs = [(" ".join(r.choices(words, k=r.randint(1, 4))), " ".join(r.choices(words, k=r.randint(1, 4))))
             for _ in range(PROBE_PAIRS + 300)]
    calls = force(monkeypatch, choice)
    auto = PhraseScorer.from_dir(str(tiny_model), device="cpu", dtype="auto")
    got = auto.score(pairs)  # the first call settles the dtype on its pairs
    assert len(calls) >= 4 and auto.dtype == auto.compute_dtype == runtime.dtype_name(choice)
    explicit = PhraseScorer.from_dir(str(tiny_model), device="cpu", dtype=runtime.dtype_name(choice))
    assert np.array_equal(got, explicit.score(pairs))
    assert (auto.distinct_sources, auto.encoder_tokens, auto.decoder_nodes) == \
        (explicit.distinct_sources, explicit.encoder_tokens, explicit.decoder_nodes)  # the probe's are not counted


@pytest.mark.parametrize("choice", [FP32, BF16], ids=["fp32", "bf16"])
def test_score_table_with_the_chosen_dtype_writes_the_explicit_bytes(monkeypatch, tmp_path, example_table,
                                                                     tiny_model, choice):
    """The choice is made on the first window before worker processes start, and they are given it (where
    this CPU lacks native bfloat16 a worker could not run bf16, so the bf16 case runs in one process there)."""
    from moses_rnn.cli import main

    real_native = runtime.cpu_has_bf16()
    calls = force(monkeypatch, choice)
    workers = "2" if choice is FP32 or real_native else "1"
    name = runtime.dtype_name(choice)
    outs = {}
    for dtype in ("auto", name):
        outs[dtype] = tmp_path / f"{dtype}.gz"
        r = CliRunner().invoke(main, ["score", str(example_table), "-m", str(tiny_model), "-o", str(outs[dtype]),
                                      "--device", "cpu", "--dtype", dtype, "--workers", workers, "--window", "128",
                                      "--quiet"])
        assert r.exit_code == 0, r.output
        assert f"on cpu, {name} (" in r.output
    assert len(calls) >= 4
    assert outs["auto"].read_bytes() == outs[name].read_bytes()
