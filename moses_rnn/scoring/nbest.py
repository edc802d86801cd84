"""Rescoring Moses n-best lists with a network: log p(hypothesis | source sentence) as a new feature.

Bahdanau et al.'s and Cho et al.'s own use of a sentence-level network beside a
phrase-based system: every hypothesis of Moses's n-best list gets the network's
log-probability of it given its source sentence, appended as a named feature
(`mtcommon.nbest`: every other byte of the line is kept). A tuner (mert-moses.pl's
`extractor` with `mert` or `kbmira`) then weighs it with Moses's own features.

The hypotheses of one source share its encoding and, through `PhraseScorer`'s
prefix tree, their common prefixes: a 300-best list costs far less than 300
independent sentences.
"""

from __future__ import annotations

from dataclasses import dataclass

from tqdm import tqdm

from mtcommon import nbest
from mtcommon.finite import check_finite
from mtcommon.textio import InputError, iter_lines
from mtcommon.outputs import atomic_output

from ..formats.phrasetable import phrase_key
from .scorer import PhraseScorer


@dataclass
class RescoreStats:
    hypotheses: int = 0
    sentences: int = 0
    feature: str = "RNN0"


def rescore_nbest(scorer: PhraseScorer, source: str, path: str, output: str, feature: str = "RNN0",
                  unknown: bool = False, window: int = 5000, progress: bool = True) -> RescoreStats:
    """Append `feature= <log p(hypothesis | source)>` (and with `unknown`, the count of units outside the
    model's vocabularies) to every hypothesis of the n-best list `path`, whose ids index the lines of
    `source` (tokenized, one sentence a line) from 0. A hypothesis of an empty source sentence is an error:
    the network has nothing to condition on (a model with attention nothing to attend to)."""
    sources = [" ".join(line.split()) for _, line in iter_lines(source)]
    stats = RescoreStats(feature=feature)
    seen = set()
    with atomic_output(output, inputs=(path, source)) as out, tqdm(unit=" hyps", disable=not progress, dynamic_ncols=True,
                                            desc="rescoring") as bar:
        for hyps in nbest.windows(path, window):
            keys = []
            for h in hyps:
                if h.sentence >= len(sources):
                    raise InputError(path, h.lineno, f"sentence id {h.sentence}, but {source} has only "
                                                     f"{len(sources)} lines (ids count from 0)")
                if not sources[h.sentence]:
                    raise InputError(path, h.lineno, f"a hypothesis of sentence {h.sentence}, but line "
                                                     f"{h.sentence + 1} of {source} is empty")
                keys.append(phrase_key(sources[h.sentence]))
                seen.add(h.sentence)
            values = scorer.score_keys(keys, [phrase_key(h.text) for h in hyps]).columns(unknown=unknown)
            check_finite(values[:, 0], scorer.model_dir or "the model", lambda i: f"for {path}:{hyps[i].lineno}")
            rows = [(float(v[0]), int(v[1])) if unknown else (float(v[0]),) for v in values]
            nbest.write(out, hyps, feature, rows)
            stats.hypotheses += len(hyps)
            bar.update(len(hyps))
    stats.sentences = len(seen)
    return stats
