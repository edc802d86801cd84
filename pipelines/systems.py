"""The pipeline's systems, from their one table (systems.tsv, which the Makefile reads too)."""

from __future__ import annotations

from pathlib import Path

TABLE = Path(__file__).resolve().with_name("systems.tsv")

# a system's name -> its fields: set (paper: the paper's Table 1, the default; extended: added by
# SYSTEMS=all; named: built only when named), label (its name in the report), what it is
SYSTEMS: dict[str, dict[str, str]] = {}
for _line in TABLE.read_text(encoding="utf-8").splitlines():
    if _line and not _line.startswith("#"):
        _name, _set, _label, _what = _line.split("\t")
        SYSTEMS[_name] = {"set": _set, "label": _label, "what": _what}


def label(system: str) -> str:
    """A system's name in the report (S-rerank: S's, reranked); a name the table lacks as it is."""
    if system in SYSTEMS:
        return SYSTEMS[system]["label"]
    if system.endswith("-rerank"):
        return f"{label(system[: -len('-rerank')])}, reranked"
    return system
