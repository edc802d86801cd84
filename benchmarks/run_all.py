"""Run every benchmarks/bench_*.py and print one summary table (`make bench`).

    python benchmarks/run_all.py                 # every benchmark, at its own sizes (long)
    python benchmarks/run_all.py --quick         # small sizes where a script has size options
    python benchmarks/run_all.py --only rewrite --only memory
    python benchmarks/run_all.py --args cslm_server='MODEL_DIR TEXT' --args cslm_ppl='MODEL_DIR TEXT LM.arpa'

Scripts are found by name (bench_*.py), so a new one is picked up as it is.
Each prints a JSON object as the last thing on stdout; the table lists its
top-level numbers and every field, at any depth, whose name says it is a
ratio, fraction, speedup or target, beside the targets its docstring states
("Target: ..."). A script is skipped, not failed, when it needs ../shared/data
and that folder is not beside the project, when it needs arguments (a model
directory, a text) that --args does not give it, or when it needs a Moses and
MOSES is not set (or its report says `"skipped": REASON`). --quick passes a
script its own --quick if it has one, else the options in QUICK that it
defines (found in its source, `add_argument("--lines"`); sizes a script has no
option for stay as they are (bench_memory always reads the whole shared
table). Exit status 1 if any benchmark failed.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from mtcommon import cliutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SHARED = ROOT.parent / "shared" / "data"

# --quick: small sizes, passed only to scripts that define the option
QUICK: dict[str, list[str]] = {
    "--lines": ["20000"],
    "--small-lines": ["100000"],
    "--repeats": ["1"],
    "--pairs": ["1024"],
    "--single-pairs": ["50"],
    "--ngrams": ["4000"],
    "--latency-requests": ["50"],
    "--clients": ["1", "8"],
    "--limit": ["200"],
    "--max-steps": ["50"],
    "--steps": ["50"],
}
KEYWORDS = ("ratio", "fraction", "speedup", "target")


@dataclass
class Script:
    path: Path
    name: str  # file stem, e.g. bench_rewrite
    options: list[str]  # the --options it defines
    positionals: list[str]  # required positional arguments
    needs_shared: bool
    targets: list[str]  # "Target: ..." statements of its docstring


@dataclass
class Result:
    name: str
    status: str  # ok | skipped | failed
    reason: str = ""
    seconds: float = 0.0
    args: list[str] = field(default_factory=list)
    report: dict | None = None
    targets: list[str] = field(default_factory=list)


def discover(folder: Path = HERE) -> list[Path]:
    return sorted(folder.glob("bench_*.py"))


def inspect_script(path: Path) -> Script:
    """What a script accepts and needs, read from its source (no import: they pull in torch)."""
    src = path.read_text(encoding="utf-8")
    options = re.findall(r"""add_argument\(\s*["'](--[\w-]+)["']""", src)
    positionals = []
    for name, rest in re.findall(r"""add_argument\(\s*["']([A-Za-z_][\w-]*)["']([^\n]*)""", src):
        if not re.search(r"""nargs\s*=\s*["'][?*]["']|default\s*=""", rest):
            positionals.append(name)
    needs_shared = bool(re.search(r"""\brequire_shared\b|REAL_TABLE|["']shared["']""", src))
    doc = re.match(r'\s*(?:"""|\'\'\')(.*?)(?:"""|\'\'\')', src, re.S)
    targets = []
    for m in re.finditer(r"\b[Tt]arget:\s*([^)\n;]+)", doc.group(1) if doc else ""):
        targets.append(m.group(1).strip().rstrip(".").strip())
    return Script(path, path.stem, options, positionals, needs_shared, targets)


def quick_args(script: Script, given: list[str]) -> list[str]:
    """A script's own --quick if it has one (it knows its small sizes), else QUICK's options
    that it defines and the user did not set."""
    if "--quick" in script.options:
        return [] if "--quick" in given else ["--quick"]
    out = []
    for opt, values in QUICK.items():
        if opt in script.options and opt not in given:
            out += [opt, *values]
    return out


def last_json_object(text: str) -> dict | None:
    """The JSON object that ends `text` (only whitespace after it), or None."""
    text = text[-(1 << 20):]
    decoder = json.JSONDecoder()
    for i in reversed([m.start() for m in re.finditer(r"\{", text)]):
        try:
            obj, end = decoder.raw_decode(text, i)
        except ValueError:
            continue
        if isinstance(obj, dict) and not text[end:].strip():
            return obj
    return None


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def figures(report: dict) -> list[tuple[str, object]]:
    """(name, value) to show: top-level numbers, and fields named like a ratio, fraction, speedup or
    target at any depth (dotted names), in the report's order."""
    out: list[tuple[str, object]] = []

    def walk(d: dict, prefix: str, top: bool) -> None:
        for k, v in d.items():
            name = f"{prefix}{k}"
            keyword = any(w in str(k).lower() for w in KEYWORDS)
            if isinstance(v, dict):
                walk(v, f"{name}.", False)
            elif (top and _is_number(v)) or (keyword and (_is_number(v) or isinstance(v, str))):
                out.append((name, v))

    walk(report, "", True)
    return out


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e5 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def format_table(results: list[Result]) -> str:
    """One table: benchmark, status, time, figure, value, and the targets the script states.

    A skipped or failed benchmark has one row, its reason in place of figure and value."""
    rows: list[tuple[str, ...]] = [("benchmark", "status", "time", "figure", "value", "target")]
    for r in results:
        head = (r.name, r.status, f"{r.seconds:.0f} s" if r.seconds else "")
        target = "; ".join(r.targets)
        if r.status != "ok":
            rows.append((*head, r.reason + (f"  (target: {target})" if target else "")))
            continue
        figs = figures(r.report or {}) or [("(no numbers)", "")]
        for i, (k, v) in enumerate(figs):
            rows.append((*(head if i == 0 else ("", "", "")), k, _fmt(v), target if i == 0 else ""))
    w = [max(len(row[c]) for row in rows) for c in range(3)]
    w += [max(len(row[c]) for row in rows if len(row) == 6) for c in (3, 4)]
    lines = []
    for n, row in enumerate(rows):
        cells = [row[0].ljust(w[0]), row[1].ljust(w[1]), row[2].rjust(w[2])]
        if len(row) == 4:  # a reason
            cells.append(row[3])
        else:
            cells += [row[3].ljust(w[3]), row[4].rjust(w[4]), row[5]]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * x for x in w + [len("target")]))
    return "\n".join(lines)


def classify_failure(returncode: int, stderr: str) -> tuple[str, str]:
    """(status, reason) of a script that exited non-zero."""
    last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    if "the following arguments are required" in last:
        return "skipped", "needs arguments: " + last.split("required:")[-1].strip()
    if m := re.search(r"one of the arguments (.+) is required", last):  # a script of two forms
        names = [a if a.startswith("-") else a.upper() for a in m.group(1).split()]
        return "skipped", "needs arguments: " + " or ".join(names)
    if re.search(r"\bset MOSES\b", last):
        return "skipped", "needs MOSES, a mosesdecoder built with the CSLM feature (cslm/moses/build-moses.sh)"
    if "shared/data" in stderr and ("beside the project" in stderr or "No such file" in stderr):
        return "skipped", "needs ../shared/data beside the project (not found)"
    tail = [line for line in stderr.strip().splitlines() if line.strip()]
    return "failed", f"exit {returncode}: {tail[-1].strip() if tail else 'no message'}"


def run_script(script: Script, extra: list[str], quick: bool, timeout: float | None, shared: Path = SHARED) -> Result:
    res = Result(script.name, "skipped", targets=script.targets)
    if script.needs_shared and not shared.is_dir() and not extra:  # given arguments may point elsewhere
        res.reason = "needs ../shared/data beside the project (not found)"
        return res
    if script.positionals and not extra:
        res.reason = (f"needs arguments {' '.join(a.upper() for a in script.positionals)} "
                      f"(--args {script.name.removeprefix('bench_')}='...')")
        return res
    args = extra + (quick_args(script, extra) if quick else [])
    res.args = args
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, str(script.path), *args], cwd=ROOT, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        res.status, res.reason, res.seconds = "failed", f"timed out after {timeout:g} s", time.perf_counter() - t0
        return res
    res.seconds = time.perf_counter() - t0
    if p.returncode != 0:
        res.status, res.reason = classify_failure(p.returncode, p.stderr)
        return res
    res.report = last_json_object(p.stdout)
    if res.report is None:
        res.status, res.reason = "failed", "no JSON object at the end of its output"
    elif isinstance(res.report.get("skipped"), str):  # the script's own verdict (bench_cslm_decode without MOSES)
        res.status, res.reason = "skipped", res.report["skipped"]
    else:
        res.status = "ok"
    return res


def _parse_args_option(values: list[str]) -> dict[str, list[str]]:
    out = {}
    for v in values:
        name, eq, args = v.partition("=")
        if not eq:
            raise SystemExit(f"--args expects NAME='ARGS', got {v!r}")
        out["bench_" + name.removeprefix("bench_").removesuffix(".py")] = shlex.split(args)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, where a script has options for them")
    ap.add_argument("--only", action="append", default=[], metavar="NAME",
                    help="run only this benchmark (bench_NAME.py; repeatable)")
    ap.add_argument("--args", action="append", default=[], metavar="NAME='ARGS'",
                    help="arguments for one benchmark, e.g. cslm_server='MODEL_DIR TEXT' (repeatable)")
    ap.add_argument("--timeout", type=float, help="seconds allowed to each benchmark [no limit]")
    ap.add_argument("--json", help="also write every result here")
    a = ap.parse_args(argv)
    given = _parse_args_option(a.args)
    scripts = [inspect_script(p) for p in discover()]
    if a.only:
        wanted = {"bench_" + n.removeprefix("bench_").removesuffix(".py") for n in a.only}
        unknown = wanted - {s.name for s in scripts}
        if unknown:
            raise SystemExit(f"no such benchmark: {', '.join(sorted(unknown))}")
        scripts = [s for s in scripts if s.name in wanted]
    results = []
    for i, s in enumerate(scripts, 1):
        print(f"[{i}/{len(scripts)}] {s.name} ...", file=sys.stderr, flush=True)
        r = run_script(s, given.get(s.name, []), a.quick, a.timeout)
        print(f"[{i}/{len(scripts)}] {s.name}: {r.status}{' (' + r.reason + ')' if r.reason else ''}"
              f"{f' in {r.seconds:.0f} s' if r.seconds else ''}", file=sys.stderr, flush=True)
        results.append(r)
    print(format_table(results))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump([asdict(r) for r in results], f, indent=2, default=str)
            f.write("\n")
    return 1 if any(r.status == "failed" for r in results) else 0


if __name__ == "__main__":
    cliutil.run_script(main)
