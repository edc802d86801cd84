"""Fields of numbers as Moses reads them: phrase-table scores, n-best feature values, counts.

Moses cuts such a field at ASCII spaces and tabs and converts each token with a C-locale,
strtod-like parser: an optional sign, ASCII digits with an optional decimal point, an optional
exponent (and `inf`, `nan`). Python is more lenient: float() takes `1_000` and digits of other
scripts (`٣`), and str.split() also cuts at a no-break space, so a field Moses misreads or refuses
would pass. Every reader of these fields goes through `split_numbers` and `parse_number`, so a field
is accepted exactly when Moses reads it as the same numbers.
"""

from __future__ import annotations

import re

import numpy as np

SEPARATORS = " \t"  # what Moses cuts a field of numbers at
_NUMBER = re.compile(r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|(?i:inf|infinity|nan))\Z")
_SPLIT = re.compile(f"[{SEPARATORS}]+")

# The bytes a decimal number may hold (digits, point, exponent, signs), and the space that separates
# numbers: a field of printable ASCII holding no other byte is read alike by float() and by Moses
# (`only_number_bytes`), so fast paths may give it to float() as it is.
_NUMBER_BYTES = np.zeros(256, dtype=bool)
_NUMBER_BYTES[np.frombuffer(b"0123456789.eE+- ", dtype=np.uint8)] = True


def split_numbers(field: str) -> list[str]:
    """The tokens of a field of numbers, cut where Moses cuts it (ASCII spaces and tabs only)."""
    return [token for token in _SPLIT.split(field) if token]


def parse_number(token: str) -> float:
    """The value of one token as Moses reads it; a ValueError for anything else (`1_000`, `٣`, `0x10`)."""
    if not _NUMBER.match(token):
        raise ValueError(f"not a number: {token!r}")
    return float(token)


def parse_numbers(field: str) -> list[float]:
    """Every number of a field (`split_numbers`, `parse_number`); a ValueError names the first bad token."""
    return [parse_number(token) for token in split_numbers(field)]


def only_number_bytes(data: np.ndarray) -> bool:
    """Whether the bytes `data` (uint8) hold only what decimal numbers and the spaces between them hold."""
    return bool(_NUMBER_BYTES[data].all())
