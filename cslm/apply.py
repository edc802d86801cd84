"""Scoring text with a CSLM: sentence and n-gram files, perplexity, Moses n-best lists.

Every function takes a `Backend`: the in-process `cslm.engine.Engine`, or a `RemoteBackend`
asking a running `cslm serve`. Both return bit-identical numbers on the CPU
(see engine.py), which the tests check.
"""

from __future__ import annotations

import math
from typing import Iterator, Protocol, Sequence, TYPE_CHECKING

import numpy as np
from tqdm import tqdm

from mtcommon import nbest
from mtcommon.batching import batches
from mtcommon.errors import UserError
from mtcommon.finite import check_finite
from mtcommon.textio import InputError, iter_lines
from mtcommon.outputs import atomic_output

from .client import RemoteBackend  # the Backend over a server (__all__)
from .data import SourceSide, affiliations, decoder_affiliations, iter_sentences
from .protocol import BACKOFF, UNKNOWN

if TYPE_CHECKING:  # the engine (and torch) is only imported when scoring in process
    from .engine import KenLMBackoff


class Backend(Protocol):
    order: int

    def score_sentences(self, sentences: Sequence[Sequence[str]]) -> list[tuple[np.ndarray, np.ndarray]]: ...

    def score_words(self, ngrams: Sequence[Sequence[str]]) -> tuple[np.ndarray, np.ndarray]: ...


def _sentence_windows(path: str, size: int, source: str | None, alignment: str | None
                      ) -> Iterator[tuple[list[list[str]], dict]]:
    """The sentences of `path`, `size` at a time, with what `score_sentences` needs beside them: nothing for
    a target-only model; a joint model's source sentences and alignments (`cslm.data.iter_sentences`: the
    three files read in step, a bad line an InputError naming its file and line)."""
    side = SourceSide(source, alignment) if source is not None or alignment is not None else None
    if side is not None and (source is None or alignment is None):
        raise UserError("a joint model scores a target text with --source and --alignment together: give both")
    for window in batches(iter_sentences(path, side), size):
        yield _split(window, side)


def _split(window: list, side) -> tuple[list[list[str]], dict]:
    sents = [words for _, words, _, _ in window]
    if side is None:
        return sents, {}
    return sents, {"sources": [src for _, _, src, _ in window], "alignments": [links for _, _, _, links in window]}


def format_logprob(x: float) -> str:
    """A log-probability as `cslm score` writes it: six decimals."""
    return f"{x:.6f}"


def score_file(backend: Backend, path: str, output: str, ngrams: bool = False, per_word: bool = False,
               window: int = 2000, progress: bool = True, source: str | None = None,
               alignment: str | None = None) -> dict:
    """Write one line per input line (a joint model: with the `source` text and the `alignment`).

    Sentence mode: `<sum of ln P over the words and </s>>\\t<unknown words>\\t<tokens scored>`
    (+ `\\t<ln P of each token>` with per_word). N-gram mode (each line 1..order
    words, predicted word last): `<ln P>\\t<flags>`.
    """
    lines = tokens = unknown = 0
    total = 0.0
    if ngrams and (source is not None or alignment is not None):
        raise UserError("n-gram lines carry no source window: a joint model scores sentences with their source")
    windows = batches(iter_lines(path), window) if ngrams else _sentence_windows(path, window, source, alignment)
    inputs = [p for p in (path, source, alignment) if p is not None]
    with atomic_output(output, inputs=inputs) as out, tqdm(unit=" lines", disable=not progress, dynamic_ncols=True) as bar:
        for win in windows:
            if ngrams:
                grams = [line.split() for _, line in win]
                for (lineno, _), g in zip(win, grams):
                    if not 1 <= len(g) <= backend.order:
                        raise InputError(path, lineno, f"an n-gram needs 1..{backend.order} words, got {len(g)}")
                logp, flags = backend.score_words(grams)
                text = "".join(f"{format_logprob(lp)}\t{fl}\n" for lp, fl in zip(logp.tolist(), flags.tolist()))
                total += float(np.sum(logp, dtype=np.float64))
                tokens += len(grams)
                unknown += int(np.count_nonzero(flags & UNKNOWN))
            else:
                win, extra = win
                parts = []
                for lp, fl in backend.score_sentences(win, **extra):
                    s = float(np.sum(lp, dtype=np.float64))
                    u = int(np.count_nonzero(fl[:-1] & UNKNOWN))
                    row = f"{format_logprob(s)}\t{u}\t{len(lp)}"
                    if per_word:
                        row += "\t" + " ".join(format_logprob(x) for x in lp.tolist())
                    parts.append(row + "\n")
                    total, tokens, unknown = total + s, tokens + len(lp), unknown + u
                text = "".join(parts)
            out.write(text.encode("utf-8"))
            lines += len(win)
            bar.update(len(win))
    return {"lines": lines, "tokens": tokens, "unknown": unknown, "logprob": total}


def _ppl(model: str, logprob: float, tokens: int) -> float:
    """exp(-logprob / tokens) (no tokens count as one), checked (`mtcommon.finite`): finite
    log-probabilities can still make a perplexity past the largest float, which is no number to write."""
    try:
        value = math.exp(-logprob / max(tokens, 1))
    except OverflowError:
        value = math.inf
    check_finite(value, model, "as a perplexity")
    return value


def _name(backend: Backend) -> str:
    return getattr(backend, "name", "the model")


def perplexity(backend: Backend, path: str, kenlm: str | KenLMBackoff | None = None, window: int = 2000,
               progress: bool = True, log_z: bool = False, mix_weight: float | None = None,
               source: str | None = None, alignment: str | None = None) -> dict:
    """Per-token perplexity (every word and </s>, natural log) of a tokenized text (a joint model's: with
    its `source` text and `alignment`).

    `cslm` counts every token; an unknown word costs ln P([UNK] | h) in unk
    mode. `cslm_in_shortlist` only counts tokens whose word is in the shortlist.
    With `kenlm`, the n-gram model is scored on the same tokens, in total and on
    the same in-shortlist tokens; with `mix_weight` (and `kenlm`) also the two models interpolated
    with that weight on the network (`cslm.mix`), on the same tokens.

    With `log_z` (an in-process Engine only), also the distribution of ln Z(h)
    over the text's n-grams (`log_z`: mean, sd, percentiles, mean |ln Z|) and
    `cslm_ppl_unnormalized`: the perplexity obtained when the unnormalised
    scores o_w = ln P + ln Z are used as log-probabilities, as a decoder does
    with a self-normalised model (tokens backed off to KenLM keep their value).
    """
    if log_z and not hasattr(backend, "score_sentences_log_z"):
        raise UserError("ln Z statistics need the model in process (not --server)")
    if isinstance(kenlm, str):
        from .engine import KenLMBackoff

        kenlm = KenLMBackoff(kenlm)
    lm = kenlm
    c_all = c_in = k_all = k_in = 0.0
    n_all = n_in = n_unk = n_backoff = k_oov = sentences = 0
    zs: list[np.ndarray] = []
    u_all = u_in = 0.0  # sums of the unnormalised scores
    m_all = m_in = 0.0  # sums of the mixture's log-probabilities
    if mix_weight is not None:
        if lm is None:
            raise UserError("the interpolated perplexity needs the n-gram model (kenlm)")
        from .mix import check_weight, mix

        check_weight(mix_weight)
    with tqdm(unit=" lines", disable=not progress, dynamic_ncols=True) as bar:
        for sents, extra in _sentence_windows(path, window, source, alignment):
            scored = backend.score_sentences_log_z(sents, **extra) if log_z else \
                [(lp, fl, None) for lp, fl in backend.score_sentences(sents, **extra)]
            for s, (lp, fl, lz) in zip(sents, scored):
                inside = (fl & UNKNOWN) == 0
                if lz is not None:
                    zs.append(lz)
                    u = lp.astype(np.float64) + np.where(fl & BACKOFF, 0.0, lz)  # o_w; KenLM values as they are
                    u_all += float(u.sum())
                    u_in += float(u[inside].sum())
                c_all += float(np.sum(lp, dtype=np.float64))
                c_in += float(np.sum(lp[inside], dtype=np.float64))
                n_all += len(lp)
                n_in += int(inside.sum())
                n_unk += int((~inside).sum())
                n_backoff += int(np.count_nonzero(fl & BACKOFF))
                if lm is not None:
                    ks = lm.full_scores(s)
                    kl = np.array([x for x, _ in ks])
                    k_all += float(kl.sum())
                    k_in += float(kl[inside].sum())
                    k_oov += sum(1 for _, oov in ks if oov)
                    if mix_weight is not None:
                        m = mix(lp, fl, kl, mix_weight)
                        m_all += float(m.sum())
                        m_in += float(m[inside].sum())
            sentences += len(sents)
            bar.update(len(sents))
    if n_all == 0:  # exp(0) = 1 would read as a perfect model
        raise InputError(path, None, "no sentences to evaluate (the text is empty)")
    res = {
        "sentences": sentences,
        "tokens": n_all,
        "unknown": n_unk,
        "backoff": n_backoff,
        "cslm_ppl": _ppl(_name(backend), c_all, n_all),
        "cslm_ppl_in_shortlist": _ppl(_name(backend), c_in, n_in),
    }
    if log_z:
        z = np.concatenate(zs).astype(np.float64)
        p5, p50, p95 = np.percentile(z, [5, 50, 95])
        res.update({
            "cslm_ppl_unnormalized": _ppl(_name(backend), u_all, n_all),
            "cslm_ppl_unnormalized_in_shortlist": _ppl(_name(backend), u_in, n_in),
            "log_z": {"ngrams": int(len(z)), "mean": float(z.mean()), "sd": float(z.std()), "p5": float(p5),
                      "p50": float(p50), "p95": float(p95), "mean_abs": float(np.abs(z).mean()),
                      "min": float(z.min()), "max": float(z.max())},
        })
    if lm is not None:
        res.update({
            "kenlm_order": lm.order,
            "kenlm_oov": k_oov,
            "kenlm_ppl": _ppl(lm.path, k_all, n_all),
            "kenlm_ppl_in_shortlist": _ppl(lm.path, k_in, n_in),
        })
    if mix_weight is not None:
        res.update({"mix_weight": mix_weight, "mix_ppl": _ppl(_name(backend), m_all, n_all),
                    "mix_ppl_in_shortlist": _ppl(_name(backend), m_in, n_in)})
    return res


def estimate_mix_weight(backend: Backend, kenlm: str | KenLMBackoff, path: str, window: int = 2000) -> dict:
    """The weight lambda of the network interpolated with `kenlm` (`cslm.mix`), estimated by EM on the
    shortlist's tokens of the tokenized text `path` (a development set), and the perplexities there of
    the network, the n-gram model and the mixture."""
    from .mix import estimate, mix

    if isinstance(kenlm, str):
        from .engine import KenLMBackoff

        kenlm = KenLMBackoff(kenlm)
    cs, ks, fs = [], [], []
    for win in batches(iter_lines(path), window):
        sents = [line.split() for _, line in win]
        for s, (lp, fl) in zip(sents, backend.score_sentences(sents)):
            cs.append(lp)
            fs.append(fl)
            ks.append(kenlm.sentence_logprobs(s))
    if not cs:
        raise InputError(path, None, "no sentences to estimate the interpolation weight on (the text is empty)")
    c, k, fl = np.concatenate(cs), np.concatenate(ks), np.concatenate(fs)
    inside = (fl & UNKNOWN) == 0
    weight, iterations = estimate(c[inside], k[inside])
    m = mix(c, fl, k, weight)
    return {
        "weight": weight,
        "em_iterations": iterations,
        "tokens": int(len(c)),
        "in_shortlist": int(inside.sum()),
        "cslm_ppl_in_shortlist": _ppl(_name(backend), float(c[inside].mean()), 1),
        "kenlm_ppl_in_shortlist": _ppl(kenlm.path, float(k[inside].mean()), 1),
        "mix_ppl_in_shortlist": _ppl(_name(backend), float(m[inside].mean()), 1),
        "mix_ppl": _ppl(_name(backend), float(m.mean()), 1),
    }


def rescore_nbest(backend: Backend, path: str, output: str, feature: str = "CSLM0", window: int = 5000,
                  progress: bool = True, source: str | None = None) -> dict:
    """Append `<feature>= <sum ln P> <unknown words>` to each hypothesis's scores (`mtcommon.nbest`:
    everything else is kept byte for byte, the total too: the tuner recomputes it from the weights).

    A joint model also reads the `source` text (line k: sentence k of the list) and each hypothesis' word
    alignment (`-print-alignment-info-in-n-best`). With its phrase segmentation too
    (`-include-segmentation-in-n-best`) the words take the decoder's affiliations, inside each phrase pair
    (`cslm.data.decoder_affiliations`), and the scores are Moses's NNJM feature's; without it, training's
    rule over the whole hypothesis (`cslm.data.affiliations`)."""
    sources = [line.split() for _, line in iter_lines(source)] if source is not None else None
    count, decoder = 0, 0
    inputs = [path] + ([source] if source is not None else [])
    with atomic_output(output, inputs=inputs) as out, tqdm(unit=" hyps", disable=not progress, dynamic_ncols=True) as bar:
        for hyps in nbest.windows(path, window):
            texts = [h.text.split() for h in hyps]
            extra = {}
            if sources is not None:
                srcs, alignments = [], []
                for h, words in zip(hyps, texts):
                    src, affil, phrase_local = _nbest_affiliations(h, words, sources, path, source)
                    srcs.append(src)
                    alignments.append([(int(a), j) for j, a in enumerate(affil[:-1])])  # one link a word
                    decoder += phrase_local
                extra = {"sources": srcs, "alignments": alignments}
            results = backend.score_sentences(texts, **extra)
            values = [(float(np.sum(lp, dtype=np.float64)), int(np.count_nonzero(fl[:-1] & UNKNOWN)))
                      for lp, fl in results]
            nbest.write(out, hyps, feature, values)
            count += len(hyps)
            bar.update(len(hyps))
    summary = {"hypotheses": count, "feature": feature}
    if sources is not None:
        summary["decoder_affiliations"] = decoder  # the others: training's rule over the whole hypothesis
    return summary


def _nbest_affiliations(h: nbest.Hypothesis, words: list[str], sources: list[list[str]], path: str,
                        source: str) -> tuple[list[str], np.ndarray, bool]:
    """One hypothesis's source words and affiliations (see `rescore_nbest`), every index checked."""
    if h.sentence >= len(sources):
        raise InputError(path, h.lineno, f"sentence {h.sentence} has no source line ({source} has {len(sources)})")
    src = sources[h.sentence]
    segments, links = h.alignment(path)
    for i, j in links:
        if i >= len(src) or j >= len(words):
            raise InputError(path, h.lineno, f"alignment link {i}-{j} outside the hypothesis ({len(words)} words) "
                                             f"or its source (line {h.sentence + 1} of {source}: {len(src)} words)")
    if segments is None:
        return src, affiliations(links, len(src), len(words)), False
    if any(s1 > len(src) or t1 > len(words) or s0 >= s1 for s0, s1, _, t1 in segments):
        raise InputError(path, h.lineno, f"a phrase pair's range lies outside the hypothesis or its source "
                                         f"(line {h.sentence + 1} of {source})")
    return src, decoder_affiliations(segments, links, len(src), len(words)), True


__all__ = ["RemoteBackend", "score_file", "perplexity", "rescore_nbest"]
