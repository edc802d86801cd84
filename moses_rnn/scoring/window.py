"""One window of a table's lines: the job it belongs to, taken from the table's first window, and its rewrite
(parse, check, score, append the columns)."""

from __future__ import annotations

from dataclasses import dataclass

from mtcommon.finite import check_finite

from ..formats.phrasetable import (MAX_PHRASE_WORDS, Window, empty_table_error, first_line_scores, format_columns,
                                   parse_window)
from ..formats.phrasetable import check_phrase_lengths as phrase_lengths
from .scorer import PhraseScorer


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
    `job.max_words` words (`phrasetable.check_phrase_lengths`, which `augment` applies too)."""
    phrase_lengths(window.sources, window.targets, job.path, window.first_lineno, job.max_words)


def first_window(table: str, head: tuple[int, bytes] | None, normalize: bool = False, unknown: bool = False,
                 max_words: int = MAX_PHRASE_WORDS) -> tuple[TableJob, Window]:
    """The job of scoring `table`, and its first window `head` ((first line, bytes of whole lines) as
    `textio.iter_line_blocks` gives it) parsed and checked, so that it is scored without being parsed again.
    The first line sets the number of scores every line must have; an empty table (`head` None) is an error."""
    if head is None:  # an empty table is an upstream failure, not a table to rewrite
        raise empty_table_error(table)
    first, data = head
    job = TableJob(table, first_line_scores(data, table, first), normalize, unknown, max_words)
    window = parse_window(data, table, first, job.nscores)
    check_phrase_lengths(window, job)
    return job, window


def rewrite_window(scorer: PhraseScorer, job: TableJob, window: Window) -> tuple[bytes, int, int]:
    """Score a parsed window: its lines with the model's columns appended to field 3 (every other byte kept),
    the number of lines and the number of distinct source phrases. A non-finite log p (a model that overflows)
    raises NonFiniteScores naming the model and the line (`mtcommon.finite`), so no `nan` is ever written."""
    before = scorer.distinct_sources
    values = scorer.score_keys(window.sources, window.targets).columns(job.normalize, job.unknown)
    check_finite(values[:, 0], scorer.model_dir or "the model", lambda i: f"for {job.path}:{window.first_lineno + i}")
    return window.with_columns(format_columns(values)), len(window), scorer.distinct_sources - before


def rewrite_lines(scorer: PhraseScorer, job: TableJob, first_lineno: int, data: bytes) -> tuple[bytes, int, int]:
    """`rewrite_window` of raw table lines (`data`, whole lines, the first numbered `first_lineno`), parsed and
    checked first: a phrase longer than `job.max_words` words raises InputError naming its line."""
    window = parse_window(data, job.path, first_lineno, job.nscores)
    check_phrase_lengths(window, job)
    return rewrite_window(scorer, job, window)
