"""One window of a table's lines: the job it belongs to, taken from the table's first window, and its rewrite:
parse and check, plan (the host's half, `plan.Planner`), score on the device and append the columns."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mtcommon.finite import check_finite

from ..formats.phrasetable import (MAX_PHRASE_WORDS, Window, check_phrase_lengths, empty_table_error,
                                   first_line_scores, format_columns, insert_columns, parse_window)
from .plan import Planner, ScoringPlan
from .scorer import PhraseScorer, PhraseScores


@dataclass(frozen=True)
class TableJob:
    """What scoring one window of a table needs besides its lines."""

    path: str  # for error messages
    nscores: int  # every line must have the first line's number of scores
    normalize: bool = False
    unknown: bool = False
    max_words: int = MAX_PHRASE_WORDS  # the longest phrase scored, in words


def first_window(table: str, head: tuple[int, bytes] | None, normalize: bool = False, unknown: bool = False,
                 max_words: int = MAX_PHRASE_WORDS) -> tuple[TableJob, Window]:
    """The job of scoring `table`, and its first window `head` ((first line, bytes of whole lines) as
    `textio.iter_line_blocks` gives it) parsed and checked, so that it is scored without being parsed again.
    The first line sets the number of scores every line must have; an empty table (`head` None) is an error."""
    if head is None:  # an empty table is an upstream failure, not a table to rewrite
        raise empty_table_error(table)
    first, data = head
    job = TableJob(table, first_line_scores(data, table, first), normalize, unknown, max_words)
    return job, parse_checked(job, first, data)


@dataclass
class PlannedWindow:
    """A parsed window made ready for the device: its bytes, where its new columns go, and the plan of
    scoring its pairs (`plan.Planner`). Plain data: a planning process sends it to the process that scores."""

    data: bytes
    first_lineno: int
    insert_at: np.ndarray
    plan: ScoringPlan


def plan_window(planner: Planner, window: Window) -> PlannedWindow:
    """The host's half of scoring `window`, which needs no network."""
    return PlannedWindow(window.data, window.first_lineno, window.insert_at,
                         planner.plan(window.sources, window.targets))


def format_window(job: TableJob, model: str, planned: PlannedWindow, log_p: np.ndarray) -> tuple[bytes, int, int]:
    """A planned window's lines with the columns of `log_p` (the device's result for its plan) appended to
    field 3 (every other byte kept), the number of lines and the number of distinct source phrases. A
    non-finite log p (a model that overflows) raises NonFiniteScores naming `model` and the line
    (`mtcommon.finite`), so no `nan` is ever written."""
    plan = planned.plan
    values = PhraseScores(log_p, plan.symbols, plan.unknown).columns(job.normalize, job.unknown)
    check_finite(values[:, 0], model, lambda i: f"for {job.path}:{planned.first_lineno + i}")
    return insert_columns(planned.data, planned.insert_at, format_columns(values)), plan.pairs, plan.distinct_sources


def rewrite_window(scorer: PhraseScorer, job: TableJob, window: Window) -> tuple[bytes, int, int]:
    """`format_window` of a parsed window, planned in this process and scored on the scorer's device."""
    planned = plan_window(scorer.planner, window)
    return format_window(job, scorer.model_dir or "the model", planned, scorer.run(planned.plan))


def parse_checked(job: TableJob, first_lineno: int, data: bytes) -> Window:
    """Raw table lines (`data`, whole lines, the first numbered `first_lineno`) parsed and checked: a phrase
    longer than `job.max_words` words raises InputError naming its line."""
    window = parse_window(data, job.path, first_lineno, job.nscores)
    check_phrase_lengths(window.sources, window.targets, job.path, window.first_lineno, job.max_words)
    return window


def rewrite_lines(scorer: PhraseScorer, job: TableJob, first_lineno: int, data: bytes) -> tuple[bytes, int, int]:
    """`rewrite_window` of raw table lines (`parse_checked`)."""
    return rewrite_window(scorer, job, parse_checked(job, first_lineno, data))
