"""The pipeline's small files: lines and JSON results read, lines and figures written atomically."""

from __future__ import annotations

import json
from pathlib import Path

from mtcommon.errors import UserError
from mtcommon.textio import iter_lines
from mtcommon.outputs import atomic_output


def write_lines(path: str, lines) -> int:
    """Write `lines` to `path` atomically; a file that already holds them is left as it is.

    Leaving an identical file untouched keeps its time stamp, so a corpus that
    was copied again (a new time stamp, the same text) re-runs `prepare` but
    nothing after it: make compares the times again after each recipe.
    """
    data = b"".join(line.encode("utf-8") + b"\n" for line in lines)
    target = Path(path)
    if target.is_file() and target.stat().st_size == len(data) and target.read_bytes() == data:
        return data.count(b"\n")
    with atomic_output(path, compress=False) as out:
        out.write(data)
    return data.count(b"\n")


def read_lines(path: Path) -> list[str]:
    """The lines of a text file (plain or gzip), without their line endings."""
    return [line for _, line in iter_lines(str(path))]


def read_result(path: Path) -> dict | None:
    """A step's JSON result (sacrebleu's score of a set); None when the step has not written it."""
    if not path.exists():
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_json_list(path: Path) -> list[dict]:
    """The list of objects in a JSON file (`moses-rnn analyze learning`'s); [] if there is no file."""
    if not path.exists():
        return []
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise UserError(f"{path}: not JSON ({e})") from None
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise UserError(f"{path}: expected a list of objects")
    return value


def json_field(path: str, key: str):
    """One top-level field of a JSON object file (a step's result that a later step's command needs)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))[key]
    except (KeyError, TypeError, json.JSONDecodeError):
        raise UserError(f"{path}: no field {key!r} in a JSON object") from None


def save_png(fig, output: str, crop: bool = True) -> None:
    """Write a matplotlib figure to `output` as PNG atomically and close it; `crop`: cut to what it
    draws (a legend below the axes included)."""
    import matplotlib.pyplot as plt

    try:
        with atomic_output(output, compress=False) as out:
            fig.savefig(out, format="png", **({"bbox_inches": "tight"} if crop else {}))
    finally:
        plt.close(fig)
