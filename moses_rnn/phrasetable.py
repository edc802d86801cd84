"""Moses phrase tables: a validating streaming reader and a column-appending writer.

A Moses text phrase table has one phrase pair per line:

    src ||| tgt ||| scores [||| alignment [||| counts [||| sparse [||| properties]]]]

The reader keeps each line whole and remembers where the scores field ends,
so the writer can append new score columns *inside* field 3 and copy every
other byte of the line unchanged (line endings and trailing fields included).
Memory is constant: lines are parsed one at a time from the stream.

Moses takes ln() of every phrase-table score when it loads a table and floors
the result at -100 (`FloorScore` in moses/TypeDef.h). A column meant to
contribute the value k to the log-linear model must therefore be written as
e^k; `format_rows` does that, clamping k at -100 so Moses never sees ln(0).
"""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np

from .textio import InputError, iter_lines

SEP = " ||| "
MAX_FIELDS = 7
LOG_FLOOR = -100.0  # Moses's floor on ln(score)


class PhrasePair:
    """One line of a phrase table. `line` is the whole decoded line, newline included."""

    __slots__ = ("lineno", "line", "source", "target", "_scores_start", "_scores_end")

    def __init__(self, lineno: int, line: str, source: str, target: str, scores_start: int, scores_end: int):
        self.lineno = lineno
        self.line = line
        self.source = source
        self.target = target
        self._scores_start = scores_start
        self._scores_end = scores_end

    @property
    def scores(self) -> list[float]:
        return [float(s) for s in self.line[self._scores_start : self._scores_end].split()]

    @property
    def fields(self) -> list[str]:
        """All fields after the scores (alignment, counts, ...), stripped, possibly empty."""
        rest = self.line[self._scores_end :].rstrip("\r\n")
        if not rest:
            return []
        return [f.strip() for f in rest[len(" |||") :].split(" |||")]

    def with_scores(self, extra: str) -> str:
        """The line with `extra` (already formatted score columns) appended to field 3."""
        k = self._scores_end
        return f"{self.line[:k]} {extra}{self.line[k:]}"

    def __repr__(self) -> str:
        return f"PhrasePair({self.lineno}, {self.source!r} -> {self.target!r})"


def parse_line(line: str, path: str, lineno: int, nscores: int | None = None) -> PhrasePair:
    """Parse and validate one phrase-table line (newline included or not).

    `nscores`, when given, is the number of scores every line must have.
    """
    body_end = len(line)
    if line.endswith("\n"):
        body_end -= 2 if line.endswith("\r\n") else 1
    i = line.find(SEP, 0, body_end)
    j = line.find(SEP, i + 5, body_end) if i >= 0 else -1
    if j < 0:
        raise InputError(path, lineno, f"expected at least 3 fields separated by '|||', got {line[:body_end][:200]!r}")
    source, target = line[:i].strip(), line[i + 5 : j].strip()
    if not source:
        raise InputError(path, lineno, "empty source phrase")
    if not target:
        raise InputError(path, lineno, "empty target phrase")
    start = j + 5
    end = line.find(" |||", start, body_end)
    if end < 0:
        end = body_end
    nfields = 3 + line.count(" |||", end, body_end)
    if nfields > MAX_FIELDS:
        raise InputError(path, lineno, f"{nfields} fields, a Moses phrase table has at most {MAX_FIELDS}")
    scores = line[start:end].split()
    if not scores:
        raise InputError(path, lineno, "no scores in field 3")
    try:
        values = [float(s) for s in scores]
        valid = min(values) > 0.0 and sum(values) < math.inf  # the sum is nan or inf if any value is
    except ValueError:
        valid = False
    if not valid:
        _raise_bad_score(scores, path, lineno)
    if nscores is not None and len(scores) != nscores:
        raise InputError(path, lineno, f"{len(scores)} scores, the first line has {nscores}")
    return PhrasePair(lineno, line, source, target, start, end)


def _raise_bad_score(scores: list[str], path: str, lineno: int) -> None:
    for s in scores:
        try:
            v = float(s)
        except ValueError:
            raise InputError(path, lineno, f"score {s!r} is not a number") from None
        if not (0.0 < v < math.inf):
            raise InputError(path, lineno, f"score {s!r} is not a positive finite number (Moses takes its log)")
    raise InputError(path, lineno, "scores overflow a float when added")


def read_phrase_table(path: str) -> Iterator[PhrasePair]:
    """Stream validated phrase pairs from a plain or gzip Moses phrase table.

    Raises InputError (file and line) on undecodable bytes, a wrong field
    count, an empty phrase, a bad score, or a score count that differs from
    the first line's.
    """
    nscores = None
    for lineno, line in iter_lines(path, keepends=True):
        pair = parse_line(line, path, lineno, nscores)
        if nscores is None:
            nscores = len(pair.scores)
        yield pair


def format_rows(values: np.ndarray) -> list[str]:
    """Log-domain feature values [rows, columns] -> Moses score columns, one string per row.

    Each value k is written as e^k, with k floored at -100 (see the module
    docstring), with 7 significant digits.
    """
    vals = np.exp(np.maximum(np.asarray(values, dtype=np.float64), LOG_FLOOR))
    if vals.shape[1] == 1:
        return [f"{v:.7g}" for v in vals[:, 0].tolist()]
    if vals.shape[1] == 2:  # the scorer's usual pair of columns, without a generator per row
        return [f"{a:.7g} {b:.7g}" for a, b in zip(vals[:, 0].tolist(), vals[:, 1].tolist())]
    return [" ".join(f"{v:.7g}" for v in row) for row in vals.tolist()]
