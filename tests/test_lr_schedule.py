"""The learning-rate schedule of the shared training loop (mtcommon.trainer.lr_factor), in both trainers."""

import math

import pytest
from click.testing import CliRunner

from mtcommon.checkpoint import Checkpoint
from mtcommon.errors import UserError
from mtcommon.trainer import lr_factor
from tests.test_cslm import synthetic_corpus


@pytest.mark.parametrize("progress,linear,cosine", [
    (0.0, 1.0, 1.0), (0.25, 0.75, (1 + math.cos(math.pi / 4)) / 2), (0.5, 0.5, 0.5), (1.0, 0.0, 0.0),
    (1.5, 0.0, 0.0), (-0.1, 1.0, 1.0),  # progress outside 0..1 is clipped
])
def test_lr_factor_follows_its_formulas(progress, linear, cosine):
    assert lr_factor("constant", progress) == 1.0
    assert lr_factor("linear", progress) == pytest.approx(linear)
    assert lr_factor("cosine", progress) == pytest.approx(cosine)


def test_the_command_lines_offer_the_loops_schedules():
    from mtcommon.cliutil import LR_SCHEDULE
    from mtcommon.trainer import LR_SCHEDULES

    @LR_SCHEDULE
    def command(lr_schedule):
        pass

    assert tuple(command.__click_params__[0].type.choices) == LR_SCHEDULES


def test_an_unknown_schedule_is_refused_by_both_trainers():
    from cslm.train import TrainConfig as NgramConfig
    from moses_rnn.training.train import TrainConfig as PairConfig

    for config in (NgramConfig, PairConfig):
        with pytest.raises(UserError, match="lr_schedule must be one of constant, linear, cosine, not 'step'"):
            config(lr_schedule="step")


def _last_rates(model_dir):
    group = Checkpoint.load(str(model_dir)).optimizer["param_groups"][0]
    return group["lr"], group["initial_lr"]


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
def test_the_cslm_steps_with_the_scheduled_rate_to_the_end_of_its_epochs(schedule, tmp_path):
    """The rate of the last of N updates is lr * factor((N-1)/N): the budget is max_epochs' steps."""
    from cslm.train import TrainConfig, train

    corpus = synthetic_corpus(tmp_path / "c.txt", sentences=120, seed=3)
    cfg = TrainConfig(preset="tiny", vocab_size=60, max_epochs=3, valid_fraction=0.05, batch_size=64, device="cpu",
                      lr=4e-3, lr_schedule=schedule, dtype="fp32", threads=1)
    s = train(str(corpus), str(tmp_path / "m"), cfg, progress=False)
    n = s["steps"]
    assert n >= 6
    lr, initial = _last_rates(tmp_path / "m")
    assert initial == 4e-3
    assert lr == pytest.approx(4e-3 * lr_factor(schedule, (n - 1) / n), rel=1e-9)


def test_a_decaying_schedule_follows_the_clock_when_minutes_bound_the_run(tmp_path, example_table):
    """With --max-minutes the budget is the one reached first: a run cut off by the clock ends near rate 0,
    although it is far from its max_steps."""
    from moses_rnn.training.train import TrainConfig, train

    base = dict(preset="tiny", eval_every=1000, valid_pairs=20, device="cpu", seed=7, dtype="fp32", lr=2e-3,
                lr_schedule="linear")
    s = train(str(example_table), str(tmp_path / "m"), TrainConfig(max_steps=100000, max_minutes=0.05, **base),
              progress=False)
    assert s["stopped"] == "max_minutes" and s["steps"] < 100000
    lr, initial = _last_rates(tmp_path / "m")
    assert initial == 2e-3 and lr < 0.1 * initial  # the last update came after 90% of the three seconds


def test_moses_rnn_train_takes_the_schedule_on_its_command_line(tmp_path, example_table):
    from moses_rnn.cli import main

    r = CliRunner().invoke(main, ["train", str(example_table), "-o", str(tmp_path / "m"), "--preset", "tiny",
                                  "--max-steps", "10", "--eval-every", "10", "--valid-pairs", "20", "--lr", "1e-3",
                                  "--lr-schedule", "linear", "--device", "cpu", "--quiet"])
    assert r.exit_code == 0, r.output
    lr, initial = _last_rates(tmp_path / "m")
    assert initial == 1e-3 and lr == pytest.approx(1e-4)  # the 10th update: 1 - 9/10
