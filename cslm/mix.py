"""The CSLM interpolated with the back-off n-gram model beside it, as Schwenk (2007) deploys it.

Schwenk's continuous-space LM (Computer Speech and Language 21, 2007) is not used alone: its
probabilities are interpolated linearly with those of the back-off LM trained on the same text,
with one weight chosen on development data. With lambda that weight:

    w in the shortlist:    P(w | h) = lambda P_cslm(w | h) + (1 - lambda) P_ngram(w | h)
    w outside it:          P(w | h) = (1 - lambda) P_ngram(w | h) + lambda P_cslm([UNK] | h) P_ngram(w | h) / M(h)

where the network's [UNK] class (every word outside its shortlist) hands its mass to the n-gram
model's distribution over those words, M(h) = sum of P_ngram(v | h) over the v outside the shortlist.
M(h) costs a sum over the whole vocabulary for each history; we leave it out (M(h) := 1). Each
probability of a word outside the shortlist is then a lower bound of the exact one, the total mass is
at most 1, and a perplexity is an upper bound of the normalised model's. On the shortlist's words,
where the project compares the CSLM with KenLM, the two are the same.

The network's history is the n-gram model's (the CSLM's 6 words hold the 5-gram's 4), both starting a
sentence with <s>. The Moses feature does not interpolate: there the CSLM and KenLM are two features
that MERT weighs (a log-linear combination); this mixture is for perplexity, `cslm score` and n-best
rescoring (docs/cslm.md, "Interpolated with KenLM").
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from mtcommon.errors import UserError
from mtcommon.vocab import BOS

from .ngrams import left_pad
from .protocol import BACKOFF, UNKNOWN

if TYPE_CHECKING:
    from .engine import KenLMBackoff

# A backend is what cslm.apply calls one (the in-process Engine or a server's RemoteBackend): `order`,
# score_sentences and score_words. Not imported from there: cslm.apply imports this module.
Backend = Any


def check_weight(weight: float) -> float:
    """The network's weight lambda, in [0, 1]."""
    if not 0.0 <= weight <= 1.0 or math.isnan(weight):
        raise UserError(f"the interpolation weight must be in [0, 1], not {weight}")
    return float(weight)


def mix(logp: np.ndarray, flags: np.ndarray, ngram_logp: np.ndarray, weight: float) -> np.ndarray:
    """Natural-log probabilities of the mixture (module docstring), token by token.

    logp: ln P_cslm of each token, ln P_cslm([UNK] | h) where flags has UNKNOWN (unk mode: a value the
    back-off already replaced, flag BACKOFF, cannot be mixed); ngram_logp: ln P_ngram of the same tokens."""
    if np.any(flags & BACKOFF):
        raise UserError("interpolation needs the network's own [UNK] probabilities: score in unk mode "
                        "(a server started without --kenlm)")
    c, k = logp.astype(np.float64), ngram_logp.astype(np.float64)
    with np.errstate(divide="ignore"):
        lam, rest = np.log(weight), np.log1p(-weight)  # -inf at the ends: the other model alone
        inside = np.logaddexp(lam + c, rest + k)
        # outside: ln P_ngram + ln(1 - lambda + lambda P_cslm([UNK] | h))
        outside = k + np.log((1.0 - weight) + weight * np.exp(c))
    return np.where(flags & UNKNOWN, outside, inside)


def estimate(cslm_logp: np.ndarray, ngram_logp: np.ndarray, tol: float = 1e-7, max_iter: int = 1000
             ) -> tuple[float, int]:
    """The maximum-likelihood lambda of the two-component mixture on these tokens, by EM.

    Each step sets lambda to the mean posterior of the network's component,
    lambda' = mean_i lambda p_i / (lambda p_i + (1 - lambda) q_i); the log-likelihood is concave in
    lambda, so the fixed point is its maximum. Returns (lambda, iterations)."""
    if len(cslm_logp) == 0:
        raise UserError("no tokens to estimate the interpolation weight on")
    d = ngram_logp.astype(np.float64) - cslm_logp.astype(np.float64)  # ln(q_i / p_i)
    lam = 0.5
    for it in range(1, max_iter + 1):
        with np.errstate(over="ignore"):
            post = lam / (lam + (1.0 - lam) * np.exp(d))
        new = float(post.mean())
        if abs(new - lam) < tol:
            return new, it
        lam = new
    return lam, max_iter


class MixedBackend:
    """A Backend (cslm.apply) whose log-probabilities are the mixture's: the network's backend (in unk
    mode, in process or a server) and the n-gram model, with the network's weight `weight`."""

    def __init__(self, inner: Backend, ngram: "KenLMBackoff", weight: float):
        self.inner, self.ngram, self.weight = inner, ngram, check_weight(weight)
        self.order = inner.order

    def score_sentences(self, sentences: Sequence[Sequence[str]], **source) -> list[tuple[np.ndarray, np.ndarray]]:
        """`source`: a joint model's sources and alignments (`Engine.score_sentences`), for the network only."""
        out = []
        for s, (lp, fl) in zip(sentences, self.inner.score_sentences(sentences, **source)):
            k = self.ngram.sentence_logprobs(s)
            out.append((mix(lp, fl, k, self.weight).astype(np.float32), fl))
        return out

    def score_words(self, ngrams: Sequence[Sequence[str]]) -> tuple[np.ndarray, np.ndarray]:
        lp, fl = self.inner.score_words(ngrams)
        k = np.array([self.ngram.logprob(left_pad(g, self.order, BOS)[:-1], g[-1]) for g in ngrams])
        return mix(lp, fl, k, self.weight).astype(np.float32), fl
