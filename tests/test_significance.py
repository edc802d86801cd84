"""pipelines/significance.py: tests over all MERT tunings of two systems (Clark et al. 2011)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sacrebleu")
from sacrebleu.metrics import BLEU  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipelines"))
import significance as sg  # noqa: E402

SAMPLES = 2000


def _noisy(ref: list[str], keep: float, rng: random.Random) -> list[str]:
    return [" ".join(w if rng.random() < keep else "x" for w in r.split()) for r in ref]


@pytest.fixture(scope="module")
def data():
    """150 reference lines; a baseline tuned three times (each tuning its own errors, half the
    words wrong), a clearly better system, and a system as bad as the baseline (other errors)."""
    rng = random.Random(0)
    words = [f"w{i}" for i in range(50)]
    ref = [" ".join(rng.choices(words, k=12)) for _ in range(150)]
    return {
        "ref": ref,
        "baseline": [_noisy(ref, 0.5, rng) for _ in range(3)],
        "better": [_noisy(ref, 0.9, rng) for _ in range(3)],
        "as_bad": [_noisy(ref, 0.5, rng) for _ in range(3)],
    }


def test_summed_statistics_bleu_equals_sacrebleu(data):
    rng = random.Random(1)
    ref = [f"The Cat, said {w}: \"it's fine\"." for w in data["ref"]]  # case and punctuation: lc + 13a
    outputs = [[h.upper() + (" !" if rng.random() < 0.3 else ".") for h in run] for run in data["baseline"]]
    outputs += [data["ref"], [""] * len(ref), ["w1"] * len(ref), [r.split()[0] + " x y" for r in data["ref"]]]
    for hyps in outputs:
        stats = sg.sentence_statistics(ref, hyps)
        assert stats.shape == (len(ref), 10)
        expected = BLEU(lowercase=True).corpus_score(hyps, [ref]).score
        assert abs(float(sg.bleu_from_statistics(stats.sum(axis=0))) - expected) < 1e-6
    # the vectorised formula against sacrebleu's on arbitrary (also degenerate) statistics
    metric, gen = BLEU(lowercase=True), np.random.default_rng(0)
    totals = gen.integers(0, 30, size=(300, 4))
    totals[:40, 2:] = 0  # orders without any n-gram
    correct = (totals * gen.random((300, 4)) * (gen.random((300, 4)) < 0.7)).astype(int)  # some orders unmatched
    stats = np.concatenate([gen.integers(0, 40, size=(300, 2)), correct, totals], axis=1)
    stats[:20, 0] = 0
    expected = [metric._compute_score_from_stats(list(row)).score for row in stats]
    assert np.allclose(sg.bleu_from_statistics(stats), expected, rtol=0, atol=1e-9)


@pytest.mark.parametrize("exchange", ["sentence", "pairs"])
def test_clearly_better_system_is_significant(data, exchange):
    r = sg.approximate_randomization(data["ref"], data["baseline"], data["better"], SAMPLES, seed=1, exchange=exchange)
    assert r.p_value < 0.05 and r.difference > 10 and r.pooled_difference > 10
    assert r.p_value == 1 / (SAMPLES + 1)  # no shuffle comes near
    assert sg.bootstrap(data["ref"], data["baseline"], data["better"], SAMPLES, seed=1).p_value < 0.05


@pytest.mark.parametrize("exchange", ["sentence", "pairs"])
def test_as_bad_system_is_not_significant(data, exchange):
    r = sg.approximate_randomization(data["ref"], data["baseline"], data["as_bad"], SAMPLES, seed=1, exchange=exchange)
    assert r.p_value > 0.05 and abs(r.difference) < 2
    assert sg.bootstrap(data["ref"], data["baseline"], data["as_bad"], SAMPLES, seed=1).p_value > 0.05


def test_identical_systems_get_p_one(data):
    for test in (sg.approximate_randomization, sg.bootstrap):
        r = test(data["ref"], data["baseline"], data["baseline"], SAMPLES, seed=1)
        assert r.p_value == 1.0 and r.difference == 0.0 and r.pooled_difference == 0.0
    same = [data["baseline"][0]] * 2  # every tuning alike as well: every shuffle ties
    assert sg.approximate_randomization(data["ref"], same, same, 100, exchange="pairs").p_value == 1.0


def test_deterministic_for_a_seed(data):
    args = data["ref"], data["baseline"], data["as_bad"], 500
    assert sg.approximate_randomization(*args, seed=3) == sg.approximate_randomization(*args, seed=3)
    assert sg.bootstrap(*args, seed=3) == sg.bootstrap(*args, seed=3)
    r = sg.approximate_randomization(*args, seed=3)
    assert "samples:500|seed:3|tunings:3+3|" in r.description and r.samples == 500
    assert r.description.startswith("test:stratified-ar|") and "|case:lc|" in r.description
    assert "|tok:13a|" in r.description and "\n" not in r.description


def test_p_value_bounds(data):
    for system in ("better", "as_bad", "baseline"):
        for samples in (1, 9, 200):
            for test in (sg.approximate_randomization, sg.bootstrap):
                r = test(data["ref"], data["baseline"], data[system], samples, seed=5)
                assert 1 / (samples + 1) <= r.p_value <= 1.0
                assert round(r.p_value * (samples + 1)) == pytest.approx(r.p_value * (samples + 1))
    with pytest.raises(ValueError, match="samples"):
        sg.approximate_randomization(data["ref"], data["baseline"], data["better"], 0)


def test_one_tuning_each_is_ordinary_approximate_randomization(data):
    """With one tuning per system the test is sacrebleu's paired AR (up to its random draws and
    its strict > count, which only matters for ties)."""
    from sacrebleu.significance import PairedTest

    ref, base, mine = data["ref"], data["baseline"][0], data["as_bad"][0]
    _, results = PairedTest([("baseline", base), ("system", mine)], {"BLEU": BLEU(lowercase=True)}, [ref],
                            test_type="ar", n_samples=SAMPLES)()
    ours = sg.approximate_randomization(ref, [base], [mine], SAMPLES, seed=2)
    assert abs(ours.p_value - results["BLEU"][1].p_value) < 0.06
    assert ours.difference == pytest.approx(ours.pooled_difference)


def test_unequal_tuning_counts(data):
    base = data["baseline"][:2]
    better, as_bad = data["better"] + data["better"][:1], data["as_bad"] + data["baseline"][2:]
    r = sg.approximate_randomization(data["ref"], base, better, SAMPLES, seed=1)
    assert r.p_value < 0.05 and "tunings:2+4|" in r.description
    assert sg.approximate_randomization(data["ref"], base, as_bad, SAMPLES, seed=1).p_value > 0.05
    assert sg.bootstrap(data["ref"], base, better, SAMPLES, seed=1).p_value < 0.05
    assert sg.bootstrap(data["ref"], base, as_bad, SAMPLES, seed=1).p_value > 0.05
    with pytest.raises(ValueError, match="2 and 4"):
        sg.approximate_randomization(data["ref"], base, better, SAMPLES, exchange="pairs")


def test_many_tunings_path_agrees(data, monkeypatch):
    """Too many tunings to tabulate every division: masks drawn per sentence, same test."""
    args = data["ref"], data["baseline"]
    tabulated = sg.approximate_randomization(*args, data["as_bad"], SAMPLES, seed=1).p_value
    monkeypatch.setattr(sg, "_TABLE_BYTES", 0)
    for exchange in ("sentence", "pairs"):
        assert sg.approximate_randomization(*args, data["better"], SAMPLES, 1, exchange).p_value < 0.05
        assert abs(sg.approximate_randomization(*args, data["as_bad"], SAMPLES, 1, exchange).p_value - tabulated) < 0.06
        assert sg.approximate_randomization(*args, data["baseline"], SAMPLES, 1, exchange).p_value == 1.0


def test_mismatched_line_counts_raise(data):
    ref, base = data["ref"], data["baseline"]
    short = [base[0], base[1][:-1], base[2]]
    for test in (sg.approximate_randomization, sg.bootstrap):
        with pytest.raises(ValueError, match=r"\(150\); tuning 2: 149 lines"):
            test(ref, base, short, 10)
        with pytest.raises(ValueError, match="baseline"):
            test(ref[:-1], base, base, 10)
    with pytest.raises(TypeError, match="list of tunings"):
        sg.approximate_randomization(ref, base[0], base, 10)  # one tuning not wrapped in a list
