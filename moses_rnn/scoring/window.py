"""One window of a table's lines: the job it belongs to, taken from the table's first window, and its rewrite
(parse, check, score, append the columns)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mtcommon.modeldir import ModelError
from mtcommon.textio import InputError

from ..formats.phrasetable import Window, first_line_scores, format_columns, parse_window
from .scorer import PhraseScorer

# The longest phrase, in words, `score_table` scores by default (`moses-rnn score --max-phrase-words`). Time and
# memory grow with a phrase's length (the encoder and decoder take a step per word). Moses's phrase tables hold
# phrases of up to 7 words by default (-max-phrase-length), and hardly ever more than a few dozen, so a longer
# phrase is a damaged table or not a phrase table.
MAX_PHRASE_WORDS = 1000


@dataclass(frozen=True)
class TableJob:
    """What scoring one window of a table needs besides its lines."""

    path: str  # for error messages
    nscores: int  # every line must have the first line's number of scores
    normalize: bool = False
    unknown: bool = False
    max_words: int = MAX_PHRASE_WORDS  # the longest phrase scored, in words


def check_phrase_lengths(window: Window, job: TableJob) -> None:
    """An InputError naming the first line of `window` (table order) with a phrase of more than
    `job.max_words` words. Free for ordinary tables: a phrase of more than k words has at least 2k + 1 bytes,
    so only windows holding a phrase that long are looked at word by word."""
    limit = job.max_words
    most = 2 * limit
    if max(map(len, window.sources), default=0) <= most and max(map(len, window.targets), default=0) <= most:
        return
    for i, pair in enumerate(zip(window.sources, window.targets)):
        for side, phrase in zip(("source", "target"), pair):
            if len(phrase) > most and (words := phrase.count(b" ") + 1) > limit:
                raise InputError(job.path, window.first_lineno + i,
                                 f"{side} phrase of {words} words, more than the limit of {limit} "
                                 f"(--max-phrase-words; Moses phrases have a few words)")


def first_window(table: str, head: tuple[int, bytes] | None, normalize: bool = False, unknown: bool = False,
                 max_words: int = MAX_PHRASE_WORDS) -> tuple[TableJob, Window]:
    """The job of scoring `table`, and its first window `head` ((first line, bytes of whole lines) as
    `textio.iter_line_blocks` gives it) parsed and checked, so that it is scored without being parsed again.
    The first line sets the number of scores every line must have; an empty table (`head` None) is an error."""
    if head is None:  # an empty table is an upstream failure, not a table to rewrite
        raise InputError(table, None, "the phrase table is empty (no lines)")
    first, data = head
    job = TableJob(table, first_line_scores(data, table, first), normalize, unknown, max_words)
    window = parse_window(data, table, first, job.nscores)
    check_phrase_lengths(window, job)
    return job, window


def rewrite_window(scorer: PhraseScorer, job: TableJob, window: Window) -> tuple[bytes, int, int]:
    """Score a parsed window: its lines with the model's columns appended to field 3 (every other byte kept),
    the number of lines and the number of distinct source phrases. A non-finite log p (a model that overflows)
    raises ModelError naming the model and the line, so no `nan` is ever written."""
    before = scorer.distinct_sources
    values = scorer.score_keys(window.sources, window.targets).columns(job.normalize, job.unknown)
    finite = np.isfinite(values[:, 0])
    if not finite.all():  # a model that overflows: never a `nan` column (the loader refuses non-finite weights)
        line = window.first_lineno + int(np.argmin(finite))
        raise ModelError(scorer.model_dir or "the model",
                         f"gives a non-finite log-probability ({values[line - window.first_lineno, 0]}) "
                         f"for {job.path}:{line}")
    return window.with_columns(format_columns(values)), len(window), scorer.distinct_sources - before


def rewrite_lines(scorer: PhraseScorer, job: TableJob, first_lineno: int, data: bytes) -> tuple[bytes, int, int]:
    """`rewrite_window` of raw table lines (`data`, whole lines, the first numbered `first_lineno`), parsed and
    checked first: a phrase longer than `job.max_words` words raises InputError naming its line."""
    window = parse_window(data, job.path, first_lineno, job.nscores)
    check_phrase_lengths(window, job)
    return rewrite_window(scorer, job, window)
