"""The one check that a model's numbers are finite, before any of them is written or returned.

A model directory's weights are checked when it is loaded (`modeldir.fit_state`), but finite
weights can still overflow in use (inf - inf = nan). So every command that writes or returns
what a model computes (phrase-table columns, n-best features, sentence and n-gram scores,
perplexities, translations, samples, the server's replies) passes it through `check_finite`,
which raises `NonFiniteScores` naming the model: one line, no partial output.

Plain numbers, numpy arrays and torch tensors (on any device) are all accepted; torch is not
imported here, so the tools that only read scores stay light.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from .textio import InputError


class NonFiniteScores(InputError):
    """A model computed NaN or an infinity: `MODEL: non-finite scores (VALUE WHERE)`."""

    def __init__(self, model: str, detail: str):
        super().__init__(model, None, f"non-finite scores ({detail})")
        self.detail = detail

    def __reduce__(self):  # survives the trip back from a worker process
        return (type(self), (self.path, self.detail))


def _is_tensor(values) -> bool:
    return type(values).__module__.startswith("torch") and hasattr(values, "is_floating_point")


def all_finite(values) -> bool:
    """Whether every value is finite (integers always are). A tensor is judged by its min and max
    (NaN propagates through both), several times faster than isfinite(...).all() on a CPU."""
    if isinstance(values, (int, float)):
        return math.isfinite(values)
    if _is_tensor(values):
        if not values.is_floating_point() or values.numel() == 0:
            return True
        import torch

        low, high = torch.aminmax(values)
        return bool(torch.isfinite(low)) and bool(torch.isfinite(high))
    values = np.asarray(values)
    if values.dtype.kind not in "fc" or values.size == 0:
        return True
    return bool(np.isfinite(values.min())) and bool(np.isfinite(values.max()))


def check_finite(values, model: str, where: str | Callable[[int], str] = "") -> None:
    """Raise NonFiniteScores naming `model` (a model directory, a server address) unless every one of
    `values` (a number, an array, a tensor) is finite. The message gives the first bad value and `where`
    it was: a text, or a function of that value's flat index (a line number, say)."""
    if all_finite(values):
        return
    flat = np.asarray(values.detach().float().cpu() if _is_tensor(values) else values, dtype=np.float64).ravel()
    index = int(np.flatnonzero(~np.isfinite(flat))[0])
    place = where(index) if callable(where) else where
    raise NonFiniteScores(model, f"{flat[index]}" + (f" {place}" if place else ""))
