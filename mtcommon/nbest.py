"""Moses n-best lists: read them in windows, add a feature to each hypothesis, write them back.

A line is `id ||| hypothesis ||| feature scores ||| total[ ||| more fields]` (Moses's
`-n-best-list`, what mert-moses.pl's `extractor` reads). A rescorer appends
`NAME= value ...` at the end of the feature scores; every other byte of the line is
kept, the total too (the tuner recomputes it from the weights). Both rescorers,
`cslm rescore-nbest` and `moses-rnn rescore-nbest`, read and write lists through here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import BinaryIO, Iterator, Sequence

from .batching import batches
from .errors import UserError
from .scores import SEPARATORS, parse_number, split_numbers
from .textio import InputError, iter_lines

SEPARATOR = " ||| "
_ID = re.compile(r"[0-9]+\Z")  # a sentence id: ASCII digits, as Moses writes it


@dataclass
class Hypothesis:
    """One n-best line, split at ` ||| `: `fields[0]` the sentence id, `fields[1]` the hypothesis,
    `fields[2]` the feature scores, `fields[3]` the total, then any further fields."""

    lineno: int
    fields: list[str]

    @property
    def sentence(self) -> int:
        return int(self.fields[0])

    @property
    def text(self) -> str:
        return self.fields[1]

    def features(self) -> list[tuple[str, float]]:
        """The dense feature scores, each named as Moses's `extractor` names them: `NAME_i` for the
        i-th score after `NAME=`. A value that is not a number as Moses reads it (`mtcommon.scores`) is a
        ValueError."""
        out, name, index = [], None, 0
        for token in split_numbers(self.fields[2]):
            if token.endswith("="):
                name, index = token[:-1], 0
                continue
            if name is None:
                raise ValueError(f"score {token!r} before any feature name")
            out.append((f"{name}_{index}", parse_number(token)))
            index += 1
        return out

    def alignment(self, path: str) -> tuple[list[tuple[int, int, int, int]] | None, list[tuple[int, int]]]:
        """The hypothesis' phrase segmentation and word alignment, from the fields after the total:
        Moses's `-include-segmentation-in-n-best` (`0-1=0-1 2=2 ...`: each phrase pair's source and target
        word ranges) gives the segmentation as (source start, end, target start, end), ends excluded, or
        None without that field; `-print-alignment-info-in-n-best` (`0-0 1-2 ...`) the (source, target)
        word links. An InputError naming `path` and the line if the list has no word alignment field."""
        segments, links = None, None
        for field in self.fields[4:]:
            tokens = field.split()
            if tokens and all(_SEGMENT.fullmatch(t) for t in tokens):
                segments = [_ranges(t) for t in tokens]
            elif all(_LINK.fullmatch(t) for t in tokens) and links is None:
                links = [(int(i), int(j)) for i, _, j in (t.partition("-") for t in tokens)]
        if links is None:
            raise InputError(path, self.lineno, "no word alignment after the total: decode with Moses's "
                                                "-print-alignment-info-in-n-best")
        return segments, links

    def with_feature(self, name: str, values: Sequence[float | int]) -> str:
        """The line (newline included) with `name= values...` after its feature scores."""
        fields = list(self.fields)
        fields[2] = f"{fields[2].rstrip()} {name}= {' '.join(_fmt(v) for v in values)}"
        return SEPARATOR.join(fields) + "\n"


_LINK = re.compile(r"[0-9]+-[0-9]+")
_SEGMENT = re.compile(r"[0-9]+(?:-[0-9]+)?=[0-9]+(?:-[0-9]+)?")


def _ranges(token: str) -> tuple[int, int, int, int]:
    """`3-5=4-6` or `2=3` -> (3, 6, 4, 7) or (2, 3, 3, 4): a phrase pair's source and target ranges."""
    spans = []
    for side in token.split("="):
        a, _, b = side.partition("-")
        spans += [int(a), int(b or a) + 1]
    return spans[0], spans[1], spans[2], spans[3]


def _fmt(value: float | int) -> str:
    """A feature value as Moses writes it; callers pass values `finite.check_finite` has checked."""
    if isinstance(value, int):
        return str(value)
    return f"{value:.6f}"


def parse(line: str, path: str, lineno: int) -> Hypothesis:
    """One n-best line (without its newline); an InputError naming the file and line if it is not one."""
    fields = line.split(SEPARATOR)
    if len(fields) < 4 or not _ID.match(fields[0].strip(SEPARATORS)):  # not str.isdigit(): it takes '²' and '٣'
        raise InputError(path, lineno, "not a Moses n-best line (id ||| hypothesis ||| scores ||| total)")
    return Hypothesis(lineno, fields)


def read(path: str) -> Iterator[Hypothesis]:
    """The list's hypotheses, each line checked (`parse`), streamed."""
    return (parse(line, path, lineno) for lineno, line in iter_lines(path))


def windows(path: str, size: int) -> Iterator[list[Hypothesis]]:
    """The list's hypotheses, `size` at a time, each line checked (`parse`)."""
    return batches(read(path), size)


def write(out: BinaryIO, hypotheses: Sequence[Hypothesis], name: str, values: Sequence[Sequence[float | int]]) -> None:
    """Each hypothesis's line with feature `name` (its values, one sequence per hypothesis)."""
    out.write("".join(h.with_feature(name, v) for h, v in zip(hypotheses, values, strict=True)).encode("utf-8"))


def top(paths: Sequence[str], output: str, n: int) -> tuple[int, int]:
    """Each sentence's first `n` hypotheses of each list in `paths`, the lists' lines merged per sentence in
    the order the lists are given, into `output` (atomically; gzip if it ends in .gz), every kept line byte
    for byte. A Moses list holds each sentence's hypotheses best first, so one list gives its n-best list;
    several (a tuning's lists of every iteration, as mert-moses.pl accumulates them) give their union: a
    line whose hypothesis and feature scores repeat one already kept for the sentence is dropped, the
    total and any later field not compared (they depend on the weights, not on the hypothesis). Each list
    must hold its sentences in ascending order, as Moses writes them. Returns (lines read, lines kept)."""
    import heapq

    from .outputs import atomic_output

    if n < 1:
        raise UserError(f"need n >= 1 hypotheses per sentence, got {n}")
    read = kept = 0

    def sentences(order: int, path: str) -> Iterator[tuple[int, int, list[tuple[tuple, str]]]]:
        """(sentence id, list's position, its first n (key, line)) of one list, checking the ascending order;
        a line's key is its hypothesis and its scores as numbers."""
        nonlocal read
        group: list[tuple[tuple, str]] = []
        current = None
        for lineno, line in iter_lines(path):
            h = parse(line, path, lineno)
            read += 1
            if h.sentence != current:
                if current is not None and h.sentence < current:
                    raise InputError(path, lineno, f"sentence {h.sentence} after sentence {current}: "
                                                   "not a list in Moses's order")
                if group:
                    yield current, order, group
                current, group = h.sentence, []
            if len(group) < n:
                try:
                    key = (h.text.strip(), tuple(h.features()))
                except ValueError as e:
                    raise InputError(path, lineno, str(e)) from None
                group.append((key, line))
        if group:
            yield current, order, group

    streams = [sentences(i, p) for i, p in enumerate(paths)]
    with atomic_output(output) as out:
        seen: set[tuple] = set()
        current = None
        for sentence, _, group in heapq.merge(*streams, key=lambda item: (item[0], item[1])):
            if sentence != current:
                current, seen = sentence, set()
            for key, line in group:
                if key not in seen:
                    seen.add(key)
                    out.write((line + "\n").encode("utf-8"))
                    kept += 1
    return read, kept
