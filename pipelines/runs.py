"""Where a run keeps its tunings and step times under WORK (systems/SYSTEM/TUNING-K, times.tsv),
and how the scores of a system's tunings are summed up."""

from __future__ import annotations

import signal
import statistics
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from mtcommon.textio import iter_lines

from files import read_lines

# the mert-moses.pl options each TUNER value adds (pipelines/Makefile), for the report's first line
TUNER_FLAGS = {"mert": "", "kbmira": " --batch-mira", "pro": " --pairwise-ranked, megam by pipelines/megam.py"}
MERT_RESTARTS = 20  # mert-moses.pl's default --random-restarts


def tuning_name(tuner: str, restarts: int = MERT_RESTARTS, tuner_args: str = "") -> str:
    """The prefix of a system's tuning folders, systems/SYSTEM/NAME-K: the tuner, with -rN for mert
    run with N random restarts other than mert-moses.pl's 20, and -bp for pro with its -b (the
    smoothed brevity penalty) among the tuner's arguments (pipelines/Makefile's TUNING)."""
    if tuner == "mert" and restarts != MERT_RESTARTS:
        return f"{tuner}-r{restarts}"
    if tuner == "pro" and "-b" in tuner_args.split():
        return "pro-bp"
    return tuner


def tunings(work: Path, system: str, tuner: str = "mert") -> dict[str, Path]:
    """The tunings of a system by a tuner (or of that name, TUNING): run name -> folder
    (systems/SYSTEM/TUNING-K, in the order of K; a folder with its own bleu.json, the layout of a single tuning, counts as one run named '')."""
    folder = work / "systems" / system
    prefix = f"{tuner}-"
    folders = [d for d in folder.glob(prefix + "*") if d.is_dir() and d.name[len(prefix):].isdigit()]
    runs = {d.name: d for d in sorted(folders, key=lambda d: int(d.name[len(prefix):]))}
    if not runs and (folder / "test.bleu.json").exists():
        runs[""] = folder
    return runs


def mean_sd(values: list[float]) -> str:
    """`mean ± sd` (sample standard deviation) of one or more scores; one score alone."""
    if len(values) == 1:
        return f"{values[0]:.2f}"
    mean = sum(values) / len(values)
    sd = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
    return f"{mean:.2f} ± {sd:.2f}"


def pooled_outputs(work: Path, system: str, tuner: str) -> list[list[str]]:
    """The test outputs (detokenized) of a system's tunings, or of a network alone (WORK/NAME/test.detok)."""
    runs = [d / "test.detok" for d in tunings(work, system, tuner).values()] or [work / system / "test.detok"]
    return [read_lines(p) for p in runs if p.exists()]


@contextmanager
def signals_noted():
    """While a command runs: SIGTERM, SIGINT and SIGHUP noted, not acted on. They reach the process group
    (Ctrl-C, the group killed at a sitting's end), so the command gets them as this process does; this
    one waits for the command to finish its own clean-up, not passing them on (a second signal could cut
    that short). Yields the list of the signals received; the old handlers come back after."""
    stopped: list[int] = []

    def stop(signum, _frame):
        stopped.append(signum)

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        yield stopped
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def timed(times: str, step: str, command: list[str]) -> int:
    """Run `command` (stdin, stdout and stderr inherited) and append "STEP<TAB>seconds<TAB>start"
    to `times` (start: seconds since the epoch, for the run's wall time, `wall_seconds`) when it
    succeeds. When SIGTERM, SIGINT or SIGHUP reaches the process group (Ctrl-C, the group killed at
    a sitting's end), the command gets it as this process does; this one waits for the command to
    finish its own clean-up and logs the time spent with a fourth field, "interrupted": that time
    counts in the wall time, not in the step's medians. Returns the command's status (128 + the
    signal when interrupted)."""
    start, wall_start = time.monotonic(), time.time()
    with signals_noted() as stopped:
        rc = subprocess.call(command)
    mark = "\tinterrupted" if stopped else ""
    if rc == 0 or stopped:
        with open(times, "a", encoding="utf-8") as f:  # one short line: an atomic append
            f.write(f"{step}\t{time.monotonic() - start:.1f}\t{wall_start:.0f}{mark}\n")
    return 128 + stopped[0] if stopped else rc


def _time_fields(times: Path):
    """times.tsv's lines as (step, seconds, start or None, interrupted): older lines have no start."""
    if times.exists():
        for _, line in iter_lines(str(times)):
            step, seconds, *rest = line.split("\t") + ["", ""]
            try:
                yield step, float(seconds), (float(rest[0]) if rest[0] else None), rest[1] == "interrupted"
            except ValueError:
                raise ValueError(f"{times}: not STEP<TAB>seconds[<TAB>start[<TAB>interrupted]]: {line!r}") from None


def wall_seconds(times: Path) -> tuple[float, float, int, int] | None:
    """The wall time of a run's logged steps: (seconds in which at least one step ran, the union of
    their [start, start + seconds] intervals; the steps' seconds summed; how many steps; how many of
    them were interrupted), or None when no line has a start. Steps that `make -j` runs side by side
    count once; time in which no step ran (between sittings) does not count. An interrupted step's
    time counts: what a resumed step (a tuning's --continue) did before is then in the sum, and
    what a step run again from its start repeats is in it twice."""
    rows = [(start, start + seconds, cut) for _, seconds, start, cut in _time_fields(times) if start is not None]
    if not rows:
        return None
    spans = sorted((a, b) for a, b, _ in rows)
    union, (lo, hi) = 0.0, spans[0]
    for a, b in spans[1:]:
        if a > hi:
            union, lo, hi = union + hi - lo, a, b
        else:
            hi = max(hi, b)
    return union + hi - lo, sum(b - a for a, b in spans), len(spans), sum(cut for *_, cut in rows)


def step_time_rows(path: Path) -> list[str]:
    """Markdown rows: per step, how many times it ran, its median and total minutes."""
    return [f"| {step} | {len(v)} | {statistics.median(v):.1f} | {sum(v):.1f} |" for step, v in step_minutes(path).items()]


def step_minutes(times: Path) -> dict[str, list[float]]:
    """times.tsv's minutes per step: STEP -> [minutes of each complete run of it], in the file's order."""
    steps: dict[str, list[float]] = {}
    for step, seconds, _, interrupted in _time_fields(times):
        if not interrupted:
            steps.setdefault(step, []).append(seconds / 60)
    return steps


# the phrase networks a run may train: their folder under WORK -> their name in the report
PHRASE_NETWORKS = {"rnn": "RNN Encoder–Decoder", "rnn-subword": "RNN Encoder–Decoder, subword units",
                   "rnnsearch": "RNNsearch"}
