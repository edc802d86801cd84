"""Which generated phrase pairs a decoder used: an augmented table against Moses's segmented 1-best.

`moses-rnn augment` marks each line it adds with the indicator score e (the fifth score; the
network's columns, if scored, come after it). Moses run with `-t` (report segmentation) writes
each 1-best as its target phrases, each followed by the source span it translates:

    la maison |0-1| est petite |2-3|

`segments` reads such a line; `usage` looks every (source phrase, target phrase) of a test set's
1-best up among the table's generated pairs, and counts how many phrases, sentences and distinct
pairs were generated ones, keeping the sentences for a comparison with another system.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from mtcommon.textio import InputError, iter_lines

from ..formats.phrasetable import read_phrase_table
from ..generation.augment import GENERATED

_SPAN = re.compile(r"\|(\d+)-(\d+)\|")
INDICATOR = 4  # the generated-line indicator's position among a line's scores (after the 4 TM scores)


def generated_pairs(table: str) -> tuple[set[tuple[str, str]], int]:
    """The (source, target) pairs of `table` that augmentation added, and the table's line count."""
    pairs, lines, marker = set(), 0, float(GENERATED)
    for pair in read_phrase_table(table):
        lines += 1
        scores = pair.scores
        if len(scores) <= INDICATOR:
            raise InputError(table, pair.lineno, f"{len(scores)} scores: not a table written by moses-rnn augment")
        if abs(scores[INDICATOR] - marker) < 1e-5:
            pairs.add((pair.source, pair.target))
    return pairs, lines


def segments(line: str, path: str = "-", lineno: int = 0) -> list[tuple[str, int, int]]:
    """(target phrase, first source word, last source word) of each phrase of a `moses -t` line."""
    out, words = [], []
    for token in line.split():
        m = _SPAN.fullmatch(token)
        if m:
            out.append((" ".join(words), int(m.group(1)), int(m.group(2))))
            words = []
        else:
            words.append(token)
    if words:
        raise InputError(path, lineno, "words after the last |i-j| span: not Moses's -t (segmentation) output")
    return out


@dataclass
class Usage:
    lines: int = 0  # the table's
    generated: int = 0  # its generated lines
    sentences: int = 0
    phrases: int = 0  # phrases in the 1-best, all sentences
    used: int = 0  # ... of them generated pairs
    sentences_using: list[int] = field(default_factory=list)  # 0-based, those with at least one
    pairs: Counter = field(default_factory=Counter)  # (source, target) of the generated ones used -> uses
    first_use: dict = field(default_factory=dict)  # (source, target) -> the first sentence that used it

    def as_dict(self, examples: int = 12) -> dict:
        return {
            "table_lines": self.lines, "generated_lines": self.generated,
            "growth": self.generated / max(1, self.lines - self.generated),
            "sentences": self.sentences, "phrases": self.phrases, "generated_phrases_used": self.used,
            "distinct_generated_pairs_used": len(self.pairs),
            "sentences_using_generated": len(self.sentences_using), "sentence_ids": self.sentences_using,
            "examples": [{"source": s, "target": t, "uses": n, "sentence": self.first_use[(s, t)] + 1}
                         for (s, t), n in self.pairs.most_common(examples)],
        }


def usage(table: str, trace: str, source: str) -> Usage:
    """How the 1-best of `trace` (moses -t output, one line per sentence of `source`) used the
    generated pairs of `table`."""
    generated, lines = generated_pairs(table)
    u = Usage(lines=lines, generated=len(generated))
    src_lines = [line.split() for _, line in iter_lines(source)]
    for lineno, line in iter_lines(trace):
        i = lineno - 1
        if i >= len(src_lines):
            raise InputError(trace, lineno, f"more lines than {source} has ({len(src_lines)})")
        words, hit = src_lines[i], False
        for target, a, b in segments(line, trace, lineno):
            if b >= len(words) or a > b:
                raise InputError(trace, lineno, f"span {a}-{b} outside the source's {len(words)} words")
            u.phrases += 1
            key = (" ".join(words[a : b + 1]), target)
            if key in generated:
                u.used += 1
                u.pairs[key] += 1
                u.first_use.setdefault(key, i)
                hit = True
        u.sentences += 1
        if hit:
            u.sentences_using.append(i)
    if u.sentences != len(src_lines):
        raise InputError(trace, u.sentences, f"{u.sentences} lines for the {len(src_lines)} of {source}")
    return u
