"""Significance of a BLEU difference between two systems that were each tuned several times.

MERT is unstable: two tunings of one system (seeds 1, 2, ...) can differ by a BLEU point, and
seed k of one system has nothing to do with seed k of another. A paired test of tuning k
against tuning k (sacrebleu's paired bootstrap over one pair of outputs) therefore compares two
unrelated draws. Clark, Dyer, Lavie & Smith (2011), "Better Hypothesis Testing for Statistical
Machine Translation: Controlling for Optimizer Instability", test all the tunings of both
systems together; their tool MultEval (github.com/jhclark/multeval) does it by approximate
randomization stratified over optimizer runs. `approximate_randomization` is that test;
`bootstrap` resamples both sentences and tunings (a second opinion, cheap to add).

BLEU is the report's: sacrebleu ``BLEU(lowercase=True)`` (13a tokenizer, exp smoothing, one
reference) on detokenized text. Each sentence's sufficient statistics (hypothesis length,
reference length, matches and totals for 1- to 4-grams) are extracted once with sacrebleu;
every resampled corpus is a sum of those rows, scored by `bleu_from_statistics`, a vectorised
copy of sacrebleu's ``BLEU.compute_bleu`` (equal to ``corpus_score`` to ~1e-12).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations, product
from math import comb
from typing import Sequence

import numpy as np

DEFAULT_SEED = 12345  # sacrebleu's default seed for its significance tests
TIE = 1e-9  # BLEU points: resampled differences this close to the observed one count as ties (>=)
_CHUNK = 1 << 21  # cells (samples x sentences [x tunings]) drawn at a time: keeps memory to tens of MB
_TABLE_BYTES = 64 << 20  # largest per-sentence table of admissible pseudo-baseline sums


@dataclass(frozen=True)
class SignificanceResult:
    """p_value: of the null hypothesis that the two systems (tunings included) are the same.
    difference: system minus baseline, mean over tunings of each tuning's corpus BLEU (what the
    report's mean ± sd columns show). pooled_difference: system minus baseline BLEU of all
    tunings pooled into one corpus, the test statistic (MultEval's). samples: shuffles or
    bootstrap samples drawn. description: a one-line signature of the test for the report."""

    p_value: float
    difference: float
    pooled_difference: float
    samples: int
    description: str


def _bleu_metric(reference: Sequence[str]):
    from sacrebleu.metrics import BLEU

    return BLEU(lowercase=True, references=[list(reference)])


def sentence_statistics(reference: Sequence[str], hypotheses: Sequence[str], metric=None) -> np.ndarray:
    """sacrebleu's per-sentence BLEU statistics of `hypotheses` against `reference` (lowercased,
    13a), one row per sentence: [hyp length, ref length, matches 1..4, totals 1..4] (int64).
    `metric`: a ``BLEU`` holding the reference already (saves re-tokenizing it)."""
    if len(hypotheses) != len(reference):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(reference)} reference lines")
    metric = metric if metric is not None else _bleu_metric(reference)
    stats = metric._extract_corpus_statistics(list(hypotheses), None)
    return np.asarray(stats, dtype=np.int64).reshape(len(hypotheses), 2 + 2 * metric.max_ngram_order)


def bleu_from_statistics(stats) -> np.ndarray | float:
    """Corpus BLEU of summed sufficient statistics (last axis as in `sentence_statistics`; any
    leading axes are scored independently; one row gives a float): sacrebleu's
    ``BLEU.compute_bleu`` with exp smoothing, no effective order, vectorised."""
    s = np.asarray(stats, dtype=np.float64)
    order = (s.shape[-1] - 2) // 2
    sys_len, ref_len = s[..., 0], s[..., 1]
    correct, total = s[..., 2:2 + order], s[..., 2 + order:2 + 2 * order]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        shorter = np.exp(1 - ref_len / np.where(sys_len > 0, sys_len, 1.0))
        bp = np.where(sys_len >= ref_len, 1.0, np.where(sys_len > 0, shorter, 0.0))
        zero = correct == 0
        # exp smoothing (mteval-v13a): the k-th order without a match gets 1 / (2^k * total)
        smooth = np.exp2(np.cumsum(zero, axis=-1))
        precisions = np.where(zero, 100.0 / (smooth * total), 100.0 * correct / total)
        logs = np.log(np.where(total > 0, precisions, 1.0))
        score = bp * np.exp(logs.sum(axis=-1) / order)
    # sacrebleu: 0 without any match; an order without any n-gram floors log(0) to -1e10, so 0
    score = np.where(np.any(correct > 0, axis=-1) & np.all(total > 0, axis=-1), score, 0.0)
    return float(score) if score.ndim == 0 else score


def _check_outputs(reference: Sequence[str], baseline, system) -> None:
    if isinstance(reference, str):
        raise TypeError("reference: a list of lines, not one string")
    if not len(reference):
        raise ValueError("the reference has no lines")
    for name, runs in (("baseline", baseline), ("system", system)):
        if isinstance(runs, str) or not len(runs) or any(isinstance(run, str) for run in runs):
            raise TypeError(f"{name}: a list of tunings, each a list of output lines (got {type(runs).__name__}"
                            f"{'' if isinstance(runs, str) or not len(runs) else ' of ' + type(runs[0]).__name__})")
        bad = [(k, len(run)) for k, run in enumerate(runs, 1) if len(run) != len(reference)]
        if bad:
            counts = ", ".join(f"tuning {k}: {n}" for k, n in bad)
            raise ValueError(f"{name} outputs need as many lines as the reference ({len(reference)}); "
                             f"{counts} lines")


def _statistics(reference, baseline, system) -> tuple[np.ndarray, np.ndarray, str]:
    """(baseline stats (K_b, N, d), system stats (K_s, N, d), BLEU signature)."""
    _check_outputs(reference, baseline, system)
    metric = _bleu_metric(reference)
    base = np.stack([sentence_statistics(reference, run, metric) for run in baseline])
    mine = np.stack([sentence_statistics(reference, run, metric) for run in system])
    return base, mine, str(metric.get_signature())


def _observed(base: np.ndarray, mine: np.ndarray) -> tuple[float, float]:
    """(difference of the mean per-tuning BLEU, difference of the pooled BLEU): system - baseline."""
    per_run = [bleu_from_statistics(s.sum(axis=1)) for s in (base, mine)]
    pooled = [bleu_from_statistics(s.sum(axis=(0, 1))) for s in (base, mine)]
    return float(per_run[1].mean() - per_run[0].mean()), pooled[1] - pooled[0]


def _p_value(extreme: int, samples: int) -> float:
    # +1 on both sides (MultEval; Noreen 1989): the observed assignment is one of the shuffles, so
    # the test's false rejection rate is at most its level even for few samples
    return (extreme + 1) / (samples + 1)


def _chunks(samples: int, sentences: int):
    step = max(1, min(samples, _CHUNK // max(1, sentences)))
    for start in range(0, samples, step):
        yield min(step, samples - start)


def _admissible(kb: int, ks: int, exchange: str) -> np.ndarray:
    """The pseudo-baseline's admissible picks among one sentence's K_b + K_s hypotheses (the
    baseline's first), as rows of a bool mask, each row equally likely."""
    m = kb + ks
    if exchange == "sentence":
        picks = combinations(range(m), kb)
    else:  # pairs: one hypothesis of each pair (baseline tuning k, system tuning k)
        picks = (tuple(k + kb * swap for k, swap in enumerate(swaps)) for swaps in product((0, 1), repeat=kb))
    rows = list(picks)
    table = np.zeros((len(rows), m), dtype=bool)
    for j, row in enumerate(rows):
        table[j, list(row)] = True
    return table


def _admissible_count(kb: int, ks: int, exchange: str) -> int:
    return comb(kb + ks, kb) if exchange == "sentence" else 2 ** kb


def _draw_masks(rng: np.random.Generator, n: int, sentences: int, kb: int, ks: int, exchange: str) -> np.ndarray:
    """(n, sentences, K_b + K_s) bool: a uniformly drawn admissible pick per sample and sentence."""
    if exchange == "sentence":
        keys = rng.random((n, sentences, kb + ks))
        kth = np.partition(keys, kb - 1, axis=-1)[..., kb - 1:kb]
        return keys <= kth
    coins = rng.integers(2, size=(n, sentences, kb), dtype=np.int8).astype(bool)
    return np.concatenate([~coins, coins], axis=-1)


def approximate_randomization(reference: Sequence[str], baseline: Sequence[Sequence[str]],
                              system: Sequence[Sequence[str]], samples: int = 10_000,
                              seed: int | None = DEFAULT_SEED, exchange: str = "sentence") -> SignificanceResult:
    """Approximate randomization test of `system` against `baseline` over all their tunings,
    stratified per sentence (Clark et al. 2011; MultEval's ``StratifiedApproximateRandomizationTest``).

    reference: the N reference lines. baseline, system: one list of N output lines per tuning
    (K_b and K_s tunings; they may differ). samples: shuffles. seed: numpy's default_rng seed
    (None: not reproducible).

    The statistic is MultEval's: |BLEU(A) - BLEU(B)|, each the corpus BLEU of all of a system's tunings
    pooled into one corpus (two-sided); strata are sentences; p = (c + 1) / (samples + 1).

    exchange="sentence" (default): under the null hypothesis the K_b + K_s hypotheses of a sentence
    are exchangeable, so each shuffle re-divides them at random, K_b to the pseudo-baseline and K_s
    to the pseudo-system (complementary: none shared, none left out); K_b != K_s is allowed.
    exchange="pairs": MultEval's exchange, a coin per sentence and tuning k between baseline tuning
    k and system tuning k; needs K_b == K_s. c counts shuffles with |difference| >= the observed one
    (less `TIE` for rounding), so identical systems get p = 1. What MultEval does and where this
    departs from it: docs/pipeline.md, "Significance tests".

    Caveat (MultEval's too): shuffles are drawn independently per sentence, so the test is
    conditional on the tunings at hand; a tuning-level effect (one MERT run's weights better on
    every sentence) is not part of its null distribution; more tunings are the only remedy, or
    `bootstrap`, which resamples tunings too (docs/pipeline.md, "Significance tests", measures both).
    """
    if samples < 1:
        raise ValueError(f"samples must be at least 1, not {samples}")
    if exchange not in ("sentence", "pairs"):
        raise ValueError(f"exchange: 'sentence' or 'pairs', not {exchange!r}")
    base, mine, bleu_signature = _statistics(reference, baseline, system)
    kb, ks = len(base), len(mine)
    if exchange == "pairs" and kb != ks:
        raise ValueError(f"exchange='pairs' needs as many baseline as system tunings ({kb} and {ks})")
    difference, pooled_difference = _observed(base, mine)
    observed = abs(pooled_difference)

    n_sent, d = base.shape[1], base.shape[2]
    pool = np.concatenate([base, mine]).transpose(1, 0, 2)  # (N, K_b + K_s, d): one sentence's hypotheses
    total = pool.sum(axis=(0, 1))
    rng = np.random.default_rng(seed)
    extreme = 0
    n_picks = _admissible_count(kb, ks, exchange)
    if n_sent * n_picks * d * 8 <= _TABLE_BYTES:
        # every admissible pseudo-baseline of every sentence, summed once: (d, N * picks); a
        # shuffle is then one uniform index per sentence and a gather
        table = _admissible(kb, ks, exchange)
        sums = np.einsum("pm,nmd->dnp", table.astype(np.int64), pool).reshape(d, n_sent * n_picks)
        sums = sums.astype(np.int32) if total.max() < 2 ** 31 else sums  # halves the gathers' memory traffic
        offsets = np.arange(n_sent, dtype=np.int64) * n_picks
        for n in _chunks(samples, n_sent):
            idx = rng.integers(n_picks, size=(n, n_sent)) + offsets
            pseudo_base = np.stack([row[idx].sum(axis=1) for row in sums], axis=1)  # (n, d)
            diffs = bleu_from_statistics(total - pseudo_base) - bleu_from_statistics(pseudo_base)
            extreme += int(np.count_nonzero(np.abs(diffs) >= observed - TIE))
    else:
        # too many admissible picks to tabulate (many tunings): draw each sentence's pick as a
        # mask and sum by matrix product (exact: integer sums within float's exact range)
        dtype = np.float32 if total.max() < 2 ** 24 else np.float64
        flat = pool.reshape(n_sent * (kb + ks), d).astype(dtype)
        for n in _chunks(samples, n_sent * (kb + ks)):
            masks = _draw_masks(rng, n, n_sent, kb, ks, exchange).reshape(n, -1).astype(dtype)
            pseudo_base = (masks @ flat).astype(np.float64)
            diffs = bleu_from_statistics(total - pseudo_base) - bleu_from_statistics(pseudo_base)
            extreme += int(np.count_nonzero(np.abs(diffs) >= observed - TIE))

    description = (f"test:stratified-ar|stat:pooled-bleu|exchange:{exchange}|count:>=|samples:{samples}|"
                   f"seed:{seed}|tunings:{kb}+{ks}|{bleu_signature}")
    return SignificanceResult(_p_value(extreme, samples), difference, pooled_difference, samples, description)


def bootstrap(reference: Sequence[str], baseline: Sequence[Sequence[str]], system: Sequence[Sequence[str]],
              samples: int = 10_000, seed: int | None = DEFAULT_SEED) -> SignificanceResult:
    """Bootstrap test of `system` against `baseline` resampling both sentences and tunings.

    Each sample draws N sentences with replacement (the same ones for both systems: paired over
    the test set) and, independently for each system, K_b and K_s of its tunings with replacement
    (tunings of different systems are unrelated draws, so they are not paired). The statistic is
    the pooled-BLEU difference of `approximate_randomization` (system - baseline, signed). The
    two-sided p-value tests a zero difference by shifting the bootstrap distribution to the null
    (Efron & Tibshirani 1993, ch. 16; Berg-Kirkpatrick et al. 2012 count d* > 2d, one-sided):
    p = (c + 1) / (samples + 1), c: samples with
    |d* - d| >= |d| (d: observed difference, d*: resampled). Identical systems get p = 1.

    MultEval's bootstrap is no test: it resamples the sentences of each optimizer run of each
    system separately to report s_sel, the standard deviation due to test-set selection. sacrebleu's
    paired bootstrap (`--paired-bs`) centres |d*| on its mean and counts > |d|; it pairs single
    outputs only. With one tuning each, this is the shift-method paired bootstrap over sentences.
    """
    if samples < 1:
        raise ValueError(f"samples must be at least 1, not {samples}")
    base, mine, bleu_signature = _statistics(reference, baseline, system)
    kb, ks = len(base), len(mine)
    difference, pooled_difference = _observed(base, mine)
    n_sent, d = base.shape[1], base.shape[2]
    # sentence counts x statistics summed by matrix product: exact in float32 below 2^24
    bound = n_sent * int(max(base.max(), mine.max()))
    dtype = np.float32 if bound < 2 ** 24 else np.float64
    by_sentence = [s.transpose(1, 0, 2).reshape(n_sent, -1).astype(dtype) for s in (base, mine)]  # (N, K * d)
    rng = np.random.default_rng(seed)
    extreme = 0
    for n in _chunks(samples, n_sent):
        picks = rng.integers(n_sent, size=(n, n_sent)) + np.arange(n)[:, None] * n_sent
        counts = np.bincount(picks.ravel(), minlength=n * n_sent).reshape(n, n_sent).astype(dtype)
        scores = []
        for k, stats in zip((kb, ks), by_sentence):
            runs = np.bincount((rng.integers(k, size=(n, k)) + np.arange(n)[:, None] * k).ravel(),
                               minlength=n * k).reshape(n, k)
            per_run = (counts @ stats).astype(np.float64).reshape(n, k, d)
            scores.append(bleu_from_statistics(np.einsum("sk,skd->sd", runs, per_run)))
        shifted = (scores[1] - scores[0]) - pooled_difference
        extreme += int(np.count_nonzero(np.abs(shifted) >= abs(pooled_difference) - TIE))
    description = (f"test:bootstrap-sentences+tunings|stat:pooled-bleu|count:>=|samples:{samples}|seed:{seed}|"
                   f"tunings:{kb}+{ks}|{bleu_signature}")
    return SignificanceResult(_p_value(extreme, samples), difference, pooled_difference, samples, description)
