"""Moses phrase tables: a validating reader and a column-appending writer.

A Moses text phrase table has one phrase pair per line:

    src ||| tgt ||| scores [||| alignment [||| counts [||| sparse [||| properties]]]]

`read_phrase_table` streams validated lines one at a time (constant memory).
`parse_window` parses a block of lines at once (numpy over the raw bytes),
with the same results and errors, and remembers where each line's scores
field ends, so `Window.with_columns` appends new score columns *inside*
field 3 and copies every other byte unchanged (line endings and trailing
fields included); the table rewrite uses these.

Moses takes ln() of every phrase-table score when it loads a table and floors
the result at -100 (`FloorScore` in moses/TypeDef.h). A column meant to
contribute the value k to the log-linear model must therefore be written as
e^k; `format_columns` does that, clamping k at -100 so Moses never sees ln(0).
"""

from __future__ import annotations

import math
import re
from typing import Iterable, Iterator, Sequence

import numpy as np

from mtcommon.scores import only_number_bytes, parse_number, parse_numbers, split_numbers
from mtcommon.textio import InputError, decode_line, iter_lines

SEP = " ||| "
MAX_FIELDS = 7
LOG_FLOOR = -100.0  # Moses's floor on ln(score)
# The longest phrase, in words, read for scoring or augmenting by default (`moses-rnn score --max-phrase-words`).
# Time and memory grow with a phrase's length (the encoder and decoder take a step per word): a 1 MB line of
# words took 840 MB and 90 s. Moses's phrase tables hold phrases of up to 7 words by default
# (-max-phrase-length), and hardly ever more than a few dozen, so a longer phrase is a damaged table or not a
# phrase table.
MAX_PHRASE_WORDS = 1000


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
        return parse_numbers(self.line[self._scores_start : self._scores_end])

    @property
    def fields(self) -> list[str]:
        """All fields after the scores (alignment, counts, ...), stripped, possibly empty."""
        rest = self.line[self._scores_end :].rstrip("\r\n")
        if not rest:
            return []
        return [f.strip() for f in rest[len(" |||") :].split(" |||")]

    @property
    def counts(self) -> list[float]:
        """The numbers of the counts field (the fifth), as Moses reads them (`mtcommon.scores`); [] without
        one. A count that is not a number is a ValueError."""
        f = self.fields
        return parse_numbers(f[1]) if len(f) >= 2 else []

    @property
    def source_count(self) -> float | None:
        """count(source): the second number of the counts field (the fifth field); None without one.
        A count that is not a number is a ValueError."""
        counts = self.counts
        return counts[1] if len(counts) >= 2 else None

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
    scores = split_numbers(line[start:end])
    if not scores:
        raise InputError(path, lineno, "no scores in field 3")
    try:
        values = [parse_number(s) for s in scores]
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
            v = parse_number(s)
        except ValueError:
            raise InputError(path, lineno, f"score {s!r} is not a number") from None
        if not (0.0 < v < math.inf):
            raise InputError(path, lineno, f"score {s!r} is not a positive finite number (Moses takes its log)")
    raise InputError(path, lineno, "scores overflow a float when added")


def check_phrase_lengths(sources: Sequence[bytes], targets: Sequence[bytes], path: str, first_lineno: int,
                         limit: int = MAX_PHRASE_WORDS, option: str | None = "--max-phrase-words") -> None:
    """An InputError naming the first line (numbered from `first_lineno`) with a phrase of more than `limit`
    words; `sources` and `targets` are phrase keys (`phrase_key`: words joined by single spaces), `option`
    the one that moves the limit. Free for ordinary tables: a phrase of more than k words has at least
    2k + 1 bytes, so only lines holding a phrase that long are looked at word by word."""
    most = 2 * limit
    if max(map(len, sources), default=0) <= most and max(map(len, targets), default=0) <= most:
        return
    for i, pair in enumerate(zip(sources, targets)):
        for side, phrase in zip(("source", "target"), pair):
            if len(phrase) > most and (words := phrase.count(b" ") + 1) > limit:
                hint = f"{option}; " if option else ""
                raise InputError(path, first_lineno + i, f"{side} phrase of {words} words, more than the limit "
                                                         f"of {limit} ({hint}Moses phrases have a few words)")


_LINK = re.compile(r"([0-9]+)-([0-9]+)\Z")


def check_fields(pair: PhrasePair, path: str) -> None:
    """The word alignment (field 4) and the counts (field 5) of a line, where it has them, as
    train-model.perl writes them: links `i-j` from source word i to target word j of the pair, and
    finite counts of at least 0; an InputError naming the file and line otherwise. `parse_line` leaves
    these fields unread (scoring copies them byte for byte); a tool that reads them, or writes a table
    Moses will read, checks them here."""
    fields = pair.fields
    if fields:
        words = len(pair.source.split()), len(pair.target.split())
        for link in split_numbers(fields[0]):
            m = _LINK.match(link)
            if m is None:
                raise InputError(path, pair.lineno, f"alignment point {link!r} is not SOURCE-TARGET word positions")
            if int(m[1]) >= words[0] or int(m[2]) >= words[1]:
                raise InputError(path, pair.lineno, f"alignment point {link!r} is outside the phrases "
                                                    f"({words[0]} and {words[1]} words, counted from 0)")
    if len(fields) >= 2:
        for token in split_numbers(fields[1]):
            try:
                count = parse_number(token)
            except ValueError:
                raise InputError(path, pair.lineno, f"count {token!r} is not a number") from None
            if not 0.0 <= count < math.inf:
                raise InputError(path, pair.lineno, f"count {token!r} is not a finite number of at least 0")


def empty_table_error(path: str) -> InputError:
    """The error for a table without a line: an upstream failure, not a table to rewrite."""
    return InputError(path, None, "the phrase table is empty (no lines)")


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


def source_groups(pairs: Iterable) -> Iterator[tuple[str, list]]:
    """(source, [pairs]) for each run of consecutive lines with the same source (anything with a
    `.source`): a Moses table is grouped by source phrase."""
    group, source = [], None
    for pair in pairs:
        if pair.source != source and group:
            yield source, group
            group = []
        source = pair.source
        group.append(pair)
    if group:
        yield source, group


def with_score(pair: PhrasePair, value: str) -> str:
    """The pair's line with `value` appended to its scores (field 3), every other byte as it was."""
    return pair.line[: pair._scores_end] + " " + value + pair.line[pair._scores_end :]


# -- whole windows of lines at once ---------------------------------------------------------------------------
# `parse_line` costs a few microseconds of Python per line; rewriting a 4M-line table with a small model is
# mostly that. `parse_window` does the same parsing and validation for a block of lines with numpy over the
# raw bytes (separator positions, field spans, character checks) and a handful of C-level passes (UTF-8
# decoding, slicing, float conversion), and hands every line it is not sure of to `parse_line` itself, so its
# results and its error messages are those of `parse_line` by construction.

# The UTF-8 encodings of the characters above U+007F that str.split() and str.strip() treat as whitespace
# (U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000): a line holding one takes
# the exact path, since bytes.split() would not split there.
_WIDE_SPACES_2 = np.array([0xC285, 0xC2A0], dtype=np.int64)
_WIDE_SPACES_3 = np.array([0xE19A80, *range(0xE28080, 0xE2808B), 0xE280A8, 0xE280A9, 0xE280AF, 0xE2819F, 0xE38080],
                          dtype=np.int64)
_PAD = bytes(16)  # zeros after the data, so look-ahead indexing never runs off the end


class Window:
    """A block of consecutive table lines, parsed and validated.

    `data` is the block's bytes (valid UTF-8, the last line may lack its newline). For each line:
    `sources[i]` and `targets[i]` are the phrases as UTF-8 bytes, their words (those of str.split()) joined
    by single spaces (`phrase_key`), and `insert_at[i]` is the byte offset in `data` where field 3 (the
    scores) ends: new score columns go there, every other byte is copied.
    """

    __slots__ = ("data", "first_lineno", "sources", "targets", "insert_at")

    def __init__(self, data: bytes, first_lineno: int, sources: list[bytes], targets: list[bytes],
                 insert_at: np.ndarray):
        self.data, self.first_lineno = data, first_lineno
        self.sources, self.targets, self.insert_at = sources, targets, insert_at

    def __len__(self) -> int:
        return len(self.sources)

    def with_columns(self, columns: list[bytes]) -> bytes:
        """The block with `columns[i]` (formatted, with its leading space) inserted at the end of line i's field 3."""
        return insert_columns(self.data, self.insert_at, columns)


def insert_columns(data: bytes, insert_at: np.ndarray, columns: list[bytes]) -> bytes:
    """`data` with `columns[i]` inserted at byte offset `insert_at[i]` (increasing), every other byte kept."""
    if len(columns) != len(insert_at):
        raise ValueError(f"{len(columns)} column strings for {len(insert_at)} lines")
    cuts = insert_at.tolist()
    out: list[bytes] = [b""] * (2 * len(cuts) + 1)
    out[0::2] = [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]
    out[1::2] = columns
    return b"".join(out)


def split_lines(data: bytes) -> list[bytes]:
    """The lines of `data`, each with its newline (only b'\\n' ends a line, as when reading a file)."""
    lines = data.split(b"\n")
    last = lines.pop()
    lines = [line + b"\n" for line in lines]
    if last:
        lines.append(last)
    return lines


def parse_window_exactly(data: bytes, path: str, first_lineno: int, nscores: int | None = None) -> Window:
    """`parse_window`'s results, line by line through `parse_line`: the reference it is tested against, and
    the path that names the first bad line of a window in order."""
    sources, targets, insert_at, offset = [], [], [], 0
    for k, raw in enumerate(split_lines(data)):
        lineno = first_lineno + k
        pair = parse_line(decode_line(raw, path, lineno), path, lineno, nscores)
        if nscores is None:
            nscores = len(pair.scores)
        sources.append(phrase_key(pair.source))
        targets.append(phrase_key(pair.target))
        insert_at.append(offset + len(pair.line[: pair._scores_end].encode("utf-8")))
        offset += len(raw)
    return Window(data, first_lineno, sources, targets, np.array(insert_at, dtype=np.int64))


def phrase_key(phrase: str) -> bytes:
    """A phrase as `Window` holds it: its words (str.split()) joined by single spaces, UTF-8."""
    return " ".join(phrase.split()).encode("utf-8")


def first_line_scores(data: bytes, path: str, first_lineno: int) -> int:
    """The number of scores on the first line of a block of table lines (non-empty), which every other line
    of the table must have; the line is parsed and validated (`parse_line`'s errors)."""
    first_line = data[: data.find(b"\n") + 1 or len(data)]
    return len(parse_line(decode_line(first_line, path, first_lineno), path, first_lineno).scores)


def parse_window(data: bytes, path: str, first_lineno: int, nscores: int | None = None) -> Window:
    """Parse and validate a block of table lines (`first_lineno` numbers its first line).

    Same results and same errors (`InputError` naming the file and the first bad line) as `parse_line` on
    each line in turn, with `nscores` (default: the first line's) scores required on every line.

    A line takes the vectorised path when it has the usual shape: 3 to 7 fields separated by ' ||| ', no
    space at either end of the source, target or scores, no two spaces in a row, printable ASCII scores,
    and no whitespace other than spaces (and the final CR LF). Any other line goes through `parse_line`. Any error at all sends the whole window through `parse_window_exactly`, so the error
    raised is the one of the first bad line.
    """
    if not data:
        return Window(data, first_lineno, [], [], np.zeros(0, dtype=np.int64))
    if nscores is None:
        nscores = first_line_scores(data, path, first_lineno)
    try:
        data.decode("utf-8")  # validates the whole block at C speed; the str itself is not needed
        return _parse_window_fast(data, path, first_lineno, nscores)
    except (UnicodeDecodeError, _NotFast):
        return parse_window_exactly(data, path, first_lineno, nscores)


class _NotFast(Exception):
    """Something in the window needs the line-by-line path (an error, found there with its line number)."""


def _parse_window_fast(data: bytes, path: str, first_lineno: int, nscores: int) -> Window:
    n = len(data)
    if n < 8:
        raise _NotFast
    a = np.frombuffer(data + _PAD, dtype=np.uint8)
    head = a[:n]
    ctrl = np.flatnonzero(head < 32)  # newlines, and any tab, CR or other control character
    nl = ctrl[a[ctrl] == 10]
    ends = nl if data.endswith(b"\n") else np.append(nl, n)  # end of each line's content, newline excluded
    nlines = len(ends)
    starts = np.empty(nlines, dtype=np.int64)
    starts[0], starts[1:] = 0, ends[:-1] + 1
    crlf = (ends < n) & (ends > starts) & (a[ends - 1] == 13)
    body = ends - crlf  # parse_line's body_end: a final CR LF is not part of the last field

    # " |||" (the field separator without its trailing space) everywhere; it cannot overlap itself, so
    # str.find and str.count see exactly these occurrences
    p = np.flatnonzero(head == 124)
    bars = p[(a[p - 1] == 32) & (a[p + 1] == 124) & (a[p + 2] == 124)] - 1
    bars = bars[bars >= 0]
    first = np.searchsorted(bars, starts)
    k = np.diff(first, append=len(bars))  # separators on each line
    barp = np.empty(len(bars) + 3, dtype=np.int64)
    barp[: len(bars)], barp[len(bars) :] = bars, n  # sentinels for lines with fewer than 3
    b1, b2, b3 = barp[first], barp[first + 1], barp[first + 2]
    three = k >= 3
    s0, s1 = b2 + 5, np.where(three, b3, body)  # the scores field [s0, s1)
    ok = (
        (k >= 2) & (k <= MAX_FIELDS - 1)  # fields: k + 1 (k >= 3) or 3, as parse_line counts them
        & (a[b1 + 4] == 32) & (a[b2 + 4] == 32) & (b2 >= b1 + 5) & (~three | (b3 >= s0))  # find() lands on them
        & (b1 > starts) & (a[starts] != 32) & (a[b1 - 1] != 32)  # source: non-empty, nothing to strip
        & (b2 > b1 + 5) & (a[b1 + 5] != 32) & (a[b2 - 1] != 32)  # target
        & (s1 > s0) & (a[s0] != 32) & (a[s1 - 1] != 32)  # scores
    )
    # control characters (a tab, a CR not ending the line, U+001C-U+001F, ...) and wide spaces: exact path
    ctrl = ctrl[(a[ctrl] != 10) & ~((a[ctrl] == 13) & (a[ctrl + 1] == 10))]
    high = np.flatnonzero(head > 126)
    lead = high[(a[high] == 0xC2) | ((a[high] >= 0xE1) & (a[high] <= 0xE3))]
    code = (a[lead].astype(np.int64) << 16) | (a[lead + 1].astype(np.int64) << 8) | a[lead + 2]
    wide = lead[np.isin(code >> 8, _WIDE_SPACES_2) | np.isin(code, _WIDE_SPACES_3)]
    # two spaces in a row (inside a phrase: its key would not be words joined by single spaces)
    doubled = np.flatnonzero((head[:-1] == 32) & (head[1:] == 32))
    ok[np.searchsorted(starts, np.concatenate([ctrl, wide, doubled]), side="right") - 1] = False
    # scores outside printable ASCII (float(bytes) equals float(str) on ASCII): exact path
    line = np.searchsorted(starts, high, side="right") - 1
    ok[line[(high >= s0[line]) & (high < s1[line])]] = False

    fast = np.flatnonzero(ok)
    if len(fast):
        # the score fields of the fast lines, each followed by one space: tokens and per-line counts
        lo, hi = s0[fast], s1[fast]
        width = hi - lo + 1
        offsets = np.cumsum(width) - width
        joined = a[np.repeat(lo - offsets, width) + np.arange(int(width.sum()))]
        joined[offsets + width - 1] = 32
        gaps = np.flatnonzero(joined == 32)
        counts = np.diff(np.searchsorted(gaps, offsets + width - 1, side="right"), prepend=0)
        if np.any(counts != nscores):
            raise _NotFast  # a score count differs from the first line's
        if not only_number_bytes(joined):
            raise _NotFast  # float() would take what Moses refuses (`1_000`), or a word (`inf`): parse_line judges
        # float() on each distinct score string (scores repeat: 1, 0.5, ...); all positive and below 1e300
        # means every value is positive and finite and every line's sum is finite, parse_line's checks
        try:
            values = np.fromiter(map(float, set(joined[:-1].tobytes().split(b" "))), dtype=np.float64)
        except ValueError:
            raise _NotFast from None
        if not (np.all(values > 0.0) and np.all(values < 1e300)):
            raise _NotFast
    src = [data[x:y] for x, y in zip(starts[fast].tolist(), b1[fast].tolist())]
    tgt = [data[x:y] for x, y in zip((b1[fast] + 5).tolist(), b2[fast].tolist())]
    insert_at = s1
    if len(fast) < nlines:  # the other lines, through parse_line (an error there is the window's first)
        sources: list[bytes] = [b""] * nlines
        targets: list[bytes] = [b""] * nlines
        for i, s, t in zip(fast.tolist(), src, tgt):
            sources[i], targets[i] = s, t
        insert_at = insert_at.copy()
        for i in np.flatnonzero(~ok).tolist():
            lineno = first_lineno + i
            raw = data[starts[i] : ends[i] + 1]
            pair = parse_line(decode_line(raw, path, lineno), path, lineno, nscores)
            sources[i], targets[i] = phrase_key(pair.source), phrase_key(pair.target)
            insert_at[i] = starts[i] + len(pair.line[: pair._scores_end].encode("utf-8"))
        src, tgt = sources, targets
    return Window(data, first_lineno, src, tgt, insert_at)


def format_columns(values: np.ndarray) -> list[bytes]:
    """Log-domain feature values [rows, columns] -> Moses score columns for `Window.with_columns`: each
    row as bytes with a leading space, each value k written as e^k with k floored at -100 (see the module
    docstring), 7 significant digits. One %-format over all values."""
    vals = np.exp(np.maximum(np.asarray(values, dtype=np.float64), LOG_FLOOR))
    rows, cols = vals.shape
    if rows == 0:
        return []
    text = ((" %.7g" * cols + "\n") * rows) % tuple(vals.ravel().tolist())
    return text.encode("ascii").split(b"\n")[:-1]
