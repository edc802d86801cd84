"""Several networks' columns of one phrase table, side by side: where they agree and where not.

Each input is the same phrase table scored by `moses-rnn score` with a different model (the
word-level RNN first). The tables are read in lockstep, line by line, and must hold the same
pairs in the same order (as `score` writes them). The comparison gives, for each column:

- the Pearson r of its log p with the table's log p(e|f), over all pairs, over the pairs with
  a word outside the first model's shortlists (its unknown-word column, `score --unknown`),
  and over the pairs whose source has at least `min_words` words;
- Table 2-style examples (Cho et al. 2014, Table 2): source phrases whose best target by a
  later column is not the first column's, drawn at random (seeded) among the long sources and
  among the sources with a shortlist miss, each with the best targets by every column.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from mtcommon.textio import InputError

from ..formats.phrasetable import source_groups
from .analyze import _is_count, _md, scored_pairs


@dataclass
class Correlations:
    """Running sums for Pearson r of x = log p(e|f) with each column's log p."""

    columns: int
    n: int = 0
    sx: float = 0.0
    sxx: float = 0.0
    sy: np.ndarray = None
    syy: np.ndarray = None
    sxy: np.ndarray = None

    def __post_init__(self):
        self.sy, self.syy, self.sxy = (np.zeros(self.columns) for _ in range(3))

    def add(self, x: float, ys: Sequence[float]) -> None:
        y = np.asarray(ys)
        self.n += 1
        self.sx += x
        self.sxx += x * x
        self.sy += y
        self.syy += y * y
        self.sxy += x * y

    def pearson(self) -> list[float]:
        if self.n < 2:
            return [math.nan] * self.columns
        vx = self.sxx - self.sx * self.sx / self.n
        vy = self.syy - self.sy * self.sy / self.n
        cov = self.sxy - self.sx * self.sy / self.n
        with np.errstate(invalid="ignore", divide="ignore"):
            r = cov / np.sqrt(vx * vy)
        return [float(v) for v in r]


@dataclass
class Example:
    source: str
    kind: str  # "long" or "shortlist miss"
    by_tm: list[tuple[str, float]]  # (target, p(e|f)), best first
    by_column: list[list[tuple[str, float]]]  # per column: (target, log p), best first


@dataclass
class ColumnComparison:
    labels: list[str]
    pairs: int = 0
    groups: dict[str, Correlations] = field(default_factory=dict)  # "all", "shortlist miss", "long" -> sums
    examples: list[Example] = field(default_factory=list)
    disagreements: dict[str, list[int]] = field(default_factory=dict)  # kind -> per later column: sources whose best differs
    sources: dict[str, int] = field(default_factory=dict)  # kind -> sources of that kind with enough targets

    def markdown(self, min_words: int) -> str:
        names = {"all": "all pairs", "shortlist miss": f"pairs with a word outside the {self.labels[0]}'s shortlists",
                 "long": f"pairs whose source has {min_words}+ words"}
        out = ["| pairs | count | " + " | ".join(f"r({_md(label)}, p(e\\|f))" for label in self.labels) + " |",
               "|---|---:|" + "---:|" * len(self.labels)]
        for key, sums in self.groups.items():
            out.append(f"| {names[key]} | {sums.n:,} | " + " | ".join(f"{r:.3f}" for r in sums.pearson()) + " |")
        out += ["", f"Sources (with 2+ targets) whose best target differs from the {_md(self.labels[0])}'s:", "",
                "| sources | count | " + " | ".join(_md(label) for label in self.labels[1:]) + " |",
                "|---|---:|" + "---:|" * (len(self.labels) - 1)]
        for kind, counts in self.disagreements.items():
            total = self.sources.get(kind, 0)
            kinds = {"long": f"sources of {min_words}+ words", "shortlist miss": "sources with a pair outside the shortlists"}
            out.append(f"| {kinds[kind]} | {total:,} | " + " | ".join(
                f"{c:,} ({100 * c / total:.0f}%)" if total else "–" for c in counts) + " |")
        for kind in ("long", "shortlist miss"):
            rows = [e for e in self.examples if e.kind == kind]
            if not rows:
                continue
            out += ["", f"Examples: {names[kind]} (best targets, best first)", "",
                    "| source | p(e\\|f) | " + " | ".join(_md(label) for label in self.labels) + " |",
                    "|---|---|" + "---|" * len(self.labels)]
            for e in rows:
                cells = ["<br>".join(f"{_md(t)} ({p:.2g})" for t, p in e.by_tm)]
                cells += ["<br>".join(f"{_md(t)} ({lp:.2f})" for t, lp in col) for col in e.by_column]
                out.append(f"| {_md(e.source)} | " + " | ".join(cells) + " |")
        return "\n".join(out) + "\n"


def compare_columns(tables: Sequence[str], labels: Sequence[str], tm_column: int = 2, min_words: int = 5,
                    examples: int = 6, top: int = 3, min_targets: int = 2, seed: int = 1) -> ColumnComparison:
    """Compare the RNN columns of `tables` (the same phrase table scored by different models; the
    first is the reference, and its unknown-word column marks the shortlist misses). The tables are
    streamed, grouped by source as Moses writes them; any size works."""
    if len(tables) != len(labels) or len(tables) < 2:
        raise ValueError("need two or more tables, one label each")
    streams = [scored_pairs(t) for t in tables]
    columns = [c for c, _ in streams]
    result = ColumnComparison(list(labels))
    result.groups = {key: Correlations(len(tables)) for key in ("all", "shortlist miss", "long")}
    result.disagreements = {kind: [0] * (len(tables) - 1) for kind in ("long", "shortlist miss")}
    result.sources = {"long": 0, "shortlist miss": 0}
    rng = random.Random(seed)
    reservoir: dict[str, list[Example]] = {"long": [], "shortlist miss": []}
    seen = {"long": 0, "shortlist miss": 0}
    first_unknown = None  # whether the first table has an unknown-word column after its RNN column

    def lockstep():
        for rows in itertools.zip_longest(*(pairs for _, pairs in streams)):
            if None in rows:
                short = tables[rows.index(None)]
                raise InputError(short, None, f"ends before {tables[[r is not None for r in rows].index(True)]}: "
                                              "not the same table")
            head = rows[0]
            for table, other in zip(tables[1:], rows[1:]):
                if (other.source, other.target) != (head.source, head.target):
                    raise InputError(table, other.lineno, f"holds {other.source!r} ||| {other.target!r} where "
                                     f"{tables[0]} holds {head.source!r} ||| {head.target!r}: not the same table")
            yield rows

    def pair_scores(rows):
        nonlocal first_unknown
        head = rows[0]
        tm = head.scores[tm_column]
        if first_unknown is None:
            first_unknown = len(head.scores) > columns[0] + 1 and _is_count(head.scores[columns[0] + 1])
        ys = []
        for table, pair, col in zip(tables, rows, columns):
            value = pair.scores[col] if col < len(pair.scores) else math.nan
            if not 0 < value <= 1:
                raise InputError(table, pair.lineno, f"score column {col} is {value:g}: not an RNN's e^(log p)")
            ys.append(math.log(value))
        miss = first_unknown and round(math.log(head.scores[columns[0] + 1])) > 0
        return math.log(tm), ys, miss

    groups = source_groups(map(_Row, lockstep()))
    for source, group in groups:
        long = len(source.split()) >= min_words
        scored = []
        any_miss = False
        for row in group:
            rows = row.rows
            x, ys, miss = pair_scores(rows)
            result.pairs += 1
            result.groups["all"].add(x, ys)
            if miss:
                result.groups["shortlist miss"].add(x, ys)
                any_miss = True
            if long:
                result.groups["long"].add(x, ys)
            scored.append((rows[0].target, math.exp(x), ys))
        if len(scored) < min_targets:
            continue
        best = [min(scored, key=lambda s: (-s[2][k], s[0]))[0] for k in range(len(tables))]  # ties: the first target
        for kind, applies in (("long", long), ("shortlist miss", any_miss)):
            if not applies:
                continue
            result.sources[kind] += 1
            differs = [best[k] != best[0] for k in range(1, len(tables))]
            for k, d in enumerate(differs):
                result.disagreements[kind][k] += d
            if not any(differs):
                continue
            seen[kind] += 1  # reservoir sampling among the sources whose best targets differ
            slot = len(reservoir[kind]) if len(reservoir[kind]) < examples else rng.randrange(seen[kind])
            if slot >= examples:
                continue
            entry = Example(source, kind, [(t, p) for t, p, _ in sorted(scored, key=lambda s: (-s[1], s[0]))[:top]],
                            [[(t, ys[k]) for t, _, ys in sorted(scored, key=lambda s: (-s[2][k], s[0]))[:top]]
                             for k in range(len(tables))])
            if slot < len(reservoir[kind]):
                reservoir[kind][slot] = entry
            else:
                reservoir[kind].append(entry)
    result.examples = sorted(reservoir["long"], key=lambda e: e.source) + sorted(
        reservoir["shortlist miss"], key=lambda e: e.source)
    return result


@dataclass
class _Row:
    """One line of every table, with the `.source` that `source_groups` groups by."""

    rows: tuple

    @property
    def source(self) -> str:
        return self.rows[0].source
