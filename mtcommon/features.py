"""Moses feature names: the one check of a name the project writes into a moses.ini or an n-best list.

MERT's scripts read an n-best list's scores as `NAME= v1 v2 ...` and name each
column `NAME_i`; mert-moses.pl splits those names at `_` and a moses.ini's
`[weight]` line at `=` and spaces. A name with `_`, `=`, `|`, a space, or none
at all is misread there, silently. So a name is letters, digits, `-` and `.`,
starting with a letter.
"""

from __future__ import annotations

import re

from .errors import UserError

NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9.\-]*")


def check_name(name: str) -> str:
    """`name` if MERT accepts it as a feature name, else a UserError saying why."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise UserError(f"feature name {name!r} is not usable by MERT: use letters, digits, '-' or '.', "
                        "starting with a letter (no '_', no spaces)")
    return name
