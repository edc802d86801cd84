"""Cutting a stream into windows: what every command that reads a file a block at a time uses."""

from __future__ import annotations

import itertools
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")


def batches(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """The items, `size` at a time, in order (the last window may be shorter; none for no items). Read
    lazily, one window ahead at most: a stream of any length takes the memory of one window."""
    if size < 1:
        raise ValueError(f"a window holds at least 1 item, not {size}")
    items = iter(items)
    while window := list(itertools.islice(items, size)):
        yield window
