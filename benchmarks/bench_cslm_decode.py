"""Moses decoding with the CSLM feature against the same system without it, in every scoring mode.

    MOSES=/path/to/mosesdecoder python benchmarks/bench_cslm_decode.py CSLM_MODEL_DIR [--sentences 500]

The baseline is the shared Moses system (phrase table, KenLM 5-gram, distortion,
word and phrase penalties; its lexicalized reordering table is not shipped, so
that feature is left out), its phrase table filtered to the test sentences
(the first --sentences of newstest2013), decoded with the pipeline's flags:
`-threads 2 -search-algorithm 1 -cube-pruning-pop-limit 1000`. The CSLM rows
add the feature (weight 0.1, untuned: this measures speed, not BLEU):

  * in-process: cslm::LocalModel inside Moses (self-normalised if the model is);
  * server, per hypothesis: `cslm serve` on the same cores, one request per
    hypothesis whose n-grams miss the cache (prefetching the span's other options);
  * server, buffered: the paper's buffer (CSLMBuffer.h), which works with the
    normal stack search, so that row and its own baseline use -search-algorithm 0
    (stack 100);
  * in-process, buffered: the same with the in-process evaluator;
  * server, buffered, cube pruning (one row per --cubes value): the buffer's
    cube-pruning side (CSLMBuffer.h) with the pipeline's search, asking in one
    request per stack either, for K:A, each new cube's first expansions,
    (x+1)(y+1) <= K, or, for predict:P, what the stack's search creates when
    run ahead for P times its pop limit (predict:P:KEY=VALUE,... adds keys to
    the CSLM line: run-ahead=estimate, rounds=N); and each time a
    popped expansion's successors miss, that cube's reach grown (by A, or 4),
    in one request (on --slow-sentences sentences);
  * in-process, buffered, cube pruning (mode local-cube, one row per --cubes
    value): the same buffer and run ahead with the in-process evaluator, on
    the same sentences: what asking ahead costs the decoder itself, so that
    the server row's excess over it is the server's share (round trips and,
    on the same cores, its arithmetic).

Each row gives the decoding time without loading (by Moses's own clock, from
the end of loading to its exit), its ratio to its baseline, and the
requests, evaluated n-grams and cache hits per sentence (the feature's stats=1
lines); a server row adds the server's own time per request, p50 and p99 from
its payload read to its reply written, and of that its batch's scoring
(`server_ms`: latency_ms, compute_ms). Server rows use --slow-sentences
sentences when that is fewer (the per-hypothesis mode can be thousands of
times slower), and their ratios are
to the baseline on those same sentences. Needs a Moses built with
cslm/moses/add-to-moses.sh: without MOSES the decoding rows are skipped with
the reason. Targets: in process <= 3x the baseline's time, through the server
under cube pruning <= 5x.

The server runs where `--server-device` says (auto: a GPU when there is one),
the decoder on the CPU. Each server row starts its own server (no row finds
another's n-grams in the server's cache) and first decodes --warmup sentences
from the end of the test set untimed. `--system DIR` measures another system
laid out like the shared one (for instance a copy on a GPU machine, with
--work holding the table already filtered). `--decoder-cpus` and
`--server-cpus` keep Moses and the server on given cores (a 2-core decoder
beside a GPU server, say), and `--cube-threads` tries more decoder threads
than cores, which hides round trips; each such row's ratio is to the fastest
baseline at those thread counts.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import SHARED, emit, parse_cpus, pinned, require_shared, workdir  # noqa: E402

from cslm.client import Client  # noqa: E402
from mtcommon.cliutil import run_script

SYSTEM = SHARED / "en-fr-moses"
PIPELINE_FLAGS = ["-search-algorithm", "1", "-cube-pruning-pop-limit", "1000"]
NORMAL_FLAGS = ["-search-algorithm", "0", "-stack", "100"]
WARMUP = 5  # sentences from the end of the test set decoded untimed before each server row (--warmup)


def filter_table(table: Path, sentences: list[str], out: Path, max_len: int = 7) -> int:
    """Keep the phrase-table lines whose source phrase occurs in the input (filter-model-given-input)."""
    wanted = set()
    for s in sentences:
        w = s.split()
        for i in range(len(w)):
            for j in range(i + 1, min(len(w), i + max_len) + 1):
                wanted.add(" ".join(w[i:j]).encode())
    kept = 0
    tmp = out.with_suffix(".tmp")
    with gzip.open(table, "rb") as src, gzip.open(tmp, "wb", compresslevel=1) as dst:
        for line in src:
            if line[: line.index(b" ||| ")] in wanted:
                dst.write(line)
                kept += 1
    tmp.rename(out)
    return kept


def shared_test_set(moses: str | None, work: str | None, sentences: int, prefix: str
                    ) -> tuple[Path, Path, list[str], Path]:
    """What a check against Moses starts from: the shared data and `moses` (a mosesdecoder with bin/moses)
    checked, the work folder (a new temporary one without `work`), the first `sentences` of newstest2013
    and the shared table filtered to them (once per work folder)."""
    require_shared()
    if not moses or not (Path(moses) / "bin" / "moses").exists():
        raise SystemExit("set MOSES (or --moses) to a mosesdecoder built with cslm/moses/build-moses.sh")
    folder = Path(work or workdir(prefix))
    folder.mkdir(parents=True, exist_ok=True)
    lines = (SYSTEM / "test.tok.en").read_text(encoding="utf-8").splitlines()[:sentences]
    table = folder / f"phrase-table.first{sentences}.gz"
    if not table.exists():
        filter_table(SYSTEM / "phrase-table.gz", lines, table)
    return Path(moses), folder, lines, table


def moses_ini(path: Path, table: Path, lm: Path, cslm_line: str | list[str] | None) -> None:
    """The shared system's moses.ini without lexicalized reordering, absolute paths, plus the CSLM (or NNJM)
    line, or several, each weighted 0.1 (log-probability) and -0.1 (unknown words) under its name= (CSLM0
    without one)."""
    features = ["UnknownWordPenalty", "WordPenalty", "PhrasePenalty",
                f"PhraseDictionaryMemory name=TranslationModel0 num-features=4 path={table} input-factor=0 output-factor=0",
                "Distortion", f"KENLM name=LM0 factor=0 path={lm.resolve()} order=5"]
    weights = ["UnknownWordPenalty0= 1", "WordPenalty0= -1", "PhrasePenalty0= 0.2",
               "TranslationModel0= 0.2 0.2 0.2 0.2", "Distortion0= 0.3", "LM0= 0.5"]
    for line in [cslm_line] if isinstance(cslm_line, str) else cslm_line or []:
        features.append(line)
        name = next((w[5:] for w in line.split() if w.startswith("name=")), "CSLM0")
        weights.append(f"{name}= 0.1 -0.1")
    path.write_text("[input-factors]\n0\n\n[mapping]\n0 T 0\n\n[distortion-limit]\n6\n\n[feature]\n"
                    + "\n".join(features) + "\n\n[weight]\n" + "\n".join(weights) + "\n")


STATS = re.compile(r"CSLM0: sentence \d+: requests (\d+), n-grams evaluated (\d+), cache hits (\d+), hidden layers computed (\d+)")


# Moses's own clock on stderr: when loading is over ("Created input-output object : [3.121] seconds") and when
# the process ends ("... real:3.203"), both in seconds since it started
LOADED = re.compile(r"^Created input-output object : \[([0-9.]+)\] seconds", re.M)
ENDED = re.compile(r"\breal:([0-9.]+)\s*$", re.M)


def cube_row(spec: str) -> tuple[str, str, str]:
    """A --cubes value -> (the CSLM line's keys, the row's name, its label). CORNER:AHEAD asks for each new
    cube's corner (predict=0); predict:P runs each stack's search ahead for P times the pop limit, and
    predict:P:KEY=VALUE,KEY=VALUE adds keys (run-ahead=estimate, rounds=3)."""
    corner, _, rest = spec.partition(":")
    ahead, _, keys = rest.partition(":")
    ahead = ahead or corner
    if corner != "predict":
        return f"predict=0 corner={corner} ahead={ahead}", f"cube_{corner}_{ahead}", f"corner {corner}, ahead {ahead}"
    extra = [k for k in keys.split(",") if k]
    name = "_".join([f"predict_{ahead}", *(k.replace("=", "_").replace("-", "_") for k in extra)])
    return " ".join([f"predict={ahead}", *extra]), name, " ".join([f"predict {ahead}", *extra])


def decode(moses: Path, ini: Path, text: str, flags: list[str], threads: int,
           cpus: set[int] | None = None) -> tuple[float, float, str]:
    """-> (seconds loading, seconds decoding, stderr), both by Moses's own clock: the decoding time is from the
    end of loading to the end of the process, so it needs no separate run to subtract the loading from."""
    r = subprocess.run([str(moses / "bin" / "moses"), "-f", str(ini), "-threads", str(threads), *flags],
                       input=text, capture_output=True, text=True, preexec_fn=pinned(cpus))
    if r.returncode != 0:
        raise SystemExit(f"moses failed on {ini}:\n{r.stderr[-3000:]}")
    times = moses_times(r.stderr)
    if times is None:
        raise SystemExit(f"moses on {ini} printed no load or end time (\"Created input-output object\", \"real:\")")
    return times[0], times[1], r.stderr


def moses_times(log: str) -> tuple[float, float] | None:
    """(seconds loading, seconds after loading) from Moses's stderr, or None if it lacks either time."""
    loaded, ended = LOADED.search(log), ENDED.findall(log)
    if loaded is None or not ended:
        return None
    load = float(loaded.group(1))
    return load, float(ended[-1]) - load


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`cslm serve MODEL` on a free port for the duration of a `with` block."""

    def __init__(self, model: str, self_normalized: bool, threads: int, device: str = "auto",
                 cpus: set[int] | None = None, extra: list[str] | None = None):
        self.port = free_port()
        args = [sys.executable, "-m", "cslm.cli", "serve", model, "--port", str(self.port), "--threads", str(threads),
                "--device", device]
        if self_normalized:
            args.append("--self-normalized")
        args += extra or []
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     preexec_fn=pinned(cpus))

    def __enter__(self):
        for _ in range(600):
            if self.proc.poll() is not None:
                raise SystemExit(f"cslm serve exited: {self.proc.stderr.read()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.2)
        raise SystemExit("cslm serve did not start")

    def __exit__(self, *exc):
        # the server's own split of a request's time, asked before it stops: from its payload read to its reply
        # written (latency_ms), and of that its batch's scoring (compute_ms), p50 and p99 in ms
        self.timing = None
        try:
            with Client(port=self.port, timeout=30) as c:
                s = c.stats()
            self.timing = {k: {q: s[k][q] for q in ("p50", "p99")} for k in ("latency_ms", "compute_ms")}
        except OSError:  # ServerError included: the row keeps its times without the split
            pass
        self.proc.terminate()
        self.proc.wait(60)
        # the server's own account of the row: requests, n-grams and its latency per request (p50, p99)
        lines = [ln for ln in self.proc.stderr.read().splitlines() if ln.startswith("cslm: server stopped")]
        self.summary = lines[-1][len("cslm: "):] if lines else None

    def report(self) -> dict:
        """What a row adds of the server's own account, warm-up and load included: its summary line, and
        `server_ms`, the split of a request's time (None when the server did not answer STATS)."""
        return {"server": self.summary, "server_ms": self.timing}


def warm_up(moses: Path, ini: Path, lines: list[str], flags: list[str], threads: int,
            cpus: set[int] | None = None) -> None:
    """Decode a few sentences untimed, so that a server's first batches (CUDA's start-up) fall outside the rows."""
    if lines:
        decode(moses, ini, "\n".join(lines) + "\n", flags, threads, cpus)


def run_row(name, moses, ini, lines, flags, threads, baseline=None, repeats=1, cpus=None):
    text = "\n".join(lines) + "\n"
    loads, times, log = [], [], ""
    for _ in range(repeats):
        load, seconds, log = decode(moses, ini, text, flags, threads, cpus)
        loads.append(load)
        times.append(seconds)
    load, seconds = statistics.median(loads), max(statistics.median(times), 1e-9)
    row = {"sentences": len(lines), "threads": threads, "load_seconds": round(load, 2), "decode_seconds": round(seconds, 2),
           "seconds_per_sentence": round(seconds / len(lines), 4)}
    stats = [tuple(map(int, m.groups())) for m in STATS.finditer(log)]
    if stats:
        req, ev, hits, hidden = (sum(s[i] for s in stats) for i in range(4))
        row.update(requests_per_sentence=round(req / len(stats), 1), evaluated_per_sentence=round(ev / len(stats), 1),
                   cache_hit_rate=round(hits / max(hits + ev, 1), 3))
        if hidden:
            row["hidden_layers_per_sentence"] = round(hidden / len(stats), 1)
    if baseline is not None:
        if baseline["seconds_per_sentence"] <= 0:
            raise SystemExit(f"bench_cslm_decode: the baseline for {name!r} took no measurable time; "
                             f"time more sentences (--sentences, --slow-sentences)")
        row["ratio_to_baseline"] = round(row["seconds_per_sentence"] / baseline["seconds_per_sentence"], 2)
    print(f"{name}: {json.dumps(row)}", file=sys.stderr)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="a CSLM model directory (`cslm train`)")
    ap.add_argument("--moses", default=os.environ.get("MOSES"), help="mosesdecoder with the CSLM feature [$MOSES]")
    ap.add_argument("--sentences", type=int, default=500)
    ap.add_argument("--slow-sentences", type=int, default=50, help="sentences for the server rows")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--modes", nargs="+",
                    default=["local", "local-buffered", "local-cube", "server-buffered", "server-cube", "server"])
    ap.add_argument("--cubes", nargs="+", default=["1:1", "16:4", "predict:1.25"], metavar="CORNER:AHEAD",
                    help="corner= and ahead= of the server-cube rows (expansions asked ahead per new cube, "
                         "and the factor its reach grows by past a miss), or predict:P for predict=P (each stack's "
                         "search run ahead for P times its pop limit), predict:P:KEY=VALUE,... with more keys of "
                         "the CSLM line (run-ahead=estimate, rounds=3)")
    ap.add_argument("--work", help="keep the filtered table and outputs here (reused when present) "
                    "[a temporary folder, removed at exit]")
    ap.add_argument("--system", type=Path, default=SYSTEM,
                    help="a folder with phrase-table.gz, lm.fr.5.arpa.gz and test.tok.en [the shared system]; "
                         "phrase-table.gz may be absent when --work holds the filtered table")
    ap.add_argument("--server-device", default="auto", help="`cslm serve --device` for the server rows [auto: "
                                                            "cuda when there is one]")
    ap.add_argument("--server-args", default="", help="more `cslm serve` options for the server rows, e.g. "
                                                      "\"--history-cache 0\"")
    ap.add_argument("--precision", choices=("fp32", "int8"), default="fp32",
                    help="the C++ evaluator's layers after the first, in process (precision=) and in the server "
                         "(--precision) [%(default)s]")
    ap.add_argument("--server-threads", type=int, help="`cslm serve --threads` [--threads]")
    ap.add_argument("--cube-threads", type=int, nargs="+", metavar="N",
                    help="decoder threads of the server-cube rows, one row per N and cube [--threads]; a baseline "
                         "row is measured at each N too, and the ratios are to the fastest baseline. More threads "
                         "than cores hide a server's round trips")
    ap.add_argument("--decoder-cpus", type=parse_cpus,
                    help="keep Moses on these CPUs (\"0,1\" or \"0-3\"), baseline rows included")
    ap.add_argument("--server-cpus", type=parse_cpus, help="keep `cslm serve` on these CPUs")
    ap.add_argument("--warmup", type=int, default=WARMUP,
                    help="sentences decoded untimed before each server row (the GPU's first kernels)")
    ap.add_argument("--quick", action="store_true", help="50 sentences, 10 for the server rows")
    ap.add_argument("--buffer", type=int, default=4096,
                    help="the server, cube-pruning rows' buffer=: n-grams per request at most [%(default)s]")
    ap.add_argument("--json", help="also write the report here")
    args = ap.parse_args()
    if args.system == SYSTEM:
        require_shared()
    system, lm = args.system, args.system / "lm.fr.5.arpa.gz"
    if args.quick:
        args.sentences, args.slow_sentences = 50, 10
    report: dict = {"model": os.path.basename(os.path.normpath(args.model)), "threads": args.threads,
                    "precision": args.precision}
    moses = Path(args.moses) if args.moses else None
    if moses is None or not (moses / "bin" / "moses").exists():
        report["skipped"] = ("MOSES is not set to a mosesdecoder built with cslm/moses/add-to-moses.sh"
                             if moses is None else f"{moses}/bin/moses not found")
        print(json.dumps(report, indent=2))
        return
    meta = json.loads((Path(args.model) / "config.json").read_text()).get("meta", {})
    self_norm = float(meta.get("train_config", {}).get("self_norm") or 0) > 0
    report["self_normalized"] = self_norm
    report["server_device"] = args.server_device

    work = Path(args.work or workdir("bench-cslm-decode-"))
    work.mkdir(parents=True, exist_ok=True)
    every = (system / "test.tok.en").read_text(encoding="utf-8").splitlines()
    lines = every[: args.sentences]
    warm = every[len(lines):][-args.warmup:] if args.warmup else []  # sentences outside the timed ones
    table = work / f"phrase-table.first{args.sentences}.gz"
    if not table.exists():
        if not (system / "phrase-table.gz").exists():
            raise SystemExit(f"bench_cslm_decode: neither {table} nor {system / 'phrase-table.gz'} exists")
        t = time.perf_counter()
        report["filtered_table_lines"] = filter_table(system / "phrase-table.gz", lines, table)
        report["filter_seconds"] = round(time.perf_counter() - t, 1)

    rows: dict = {}
    base_ini = work / "baseline.ini"
    moses_ini(base_ini, table, lm, None)
    dcpus, scpus = args.decoder_cpus, args.server_cpus
    report["decoder_cpus"], report["server_cpus"] = (sorted(c) if c else None for c in (dcpus, scpus))
    rows["baseline"] = run_row("baseline", moses, base_ini, lines, PIPELINE_FLAGS, args.threads,
                               repeats=args.repeats, cpus=dcpus)
    # the rows on fewer sentences are held against the baseline on those same sentences, not on all of them
    slow = lines[: args.slow_sentences]
    slow_base = rows["baseline"]
    if len(slow) < len(lines) and {"server-cube", "local-cube", "server"} & set(args.modes):
        slow_base = rows[f"baseline_first_{len(slow)}"] = run_row(
            f"baseline, first {len(slow)} sentences", moses, base_ini, slow, PIPELINE_FLAGS, args.threads,
            repeats=args.repeats, cpus=dcpus)
    cube_threads = args.cube_threads or [args.threads]
    fastest = slow_base
    if "server-cube" in args.modes:
        for t in sorted(set(cube_threads) - {args.threads}):
            row = rows[f"baseline_threads_{t}"] = run_row(f"baseline, {t} threads", moses, base_ini, slow,
                                                          PIPELINE_FLAGS, t, repeats=args.repeats, cpus=dcpus)
            if row["seconds_per_sentence"] < fastest["seconds_per_sentence"]:
                fastest = row
    if any(m.endswith("buffered") for m in args.modes):
        rows["baseline_normal_search"] = run_row("baseline, normal search", moses, base_ini, lines, NORMAL_FLAGS,
                                                 args.threads, repeats=args.repeats, cpus=dcpus)
    local = f"CSLM name=CSLM0 path={os.path.abspath(args.model)} stats=1"
    server_args = shlex.split(args.server_args)
    if args.precision != "fp32":
        local += f" precision={args.precision}"
        server_args += ["--precision", args.precision]
    if "local" in args.modes:
        ini = work / "cslm-local.ini"
        moses_ini(ini, table, lm, local)
        rows["cslm_in_process"] = run_row("in process", moses, ini, lines, PIPELINE_FLAGS, args.threads,
                                          rows["baseline"], args.repeats, dcpus)
    if "local-buffered" in args.modes:
        ini = work / "cslm-local-buffered.ini"
        moses_ini(ini, table, lm, local + " buffer=4096")
        rows["cslm_in_process_buffered"] = run_row("in process, buffered", moses, ini, lines, NORMAL_FLAGS,
                                                   args.threads, rows["baseline_normal_search"], args.repeats, dcpus)
    if "local-cube" in args.modes:  # what asking ahead costs the decoder itself, without a server's round trips
        for cube in args.cubes:
            asked, name, what = cube_row(cube)
            ini = work / f"cslm-local-{name}.ini"
            moses_ini(ini, table, lm, f"{local} buffer={args.buffer} {asked}")
            rows[f"cslm_in_process_buffered_{name}"] = run_row(
                f"in process, buffered, cube pruning, {what}", moses, ini, slow, PIPELINE_FLAGS, args.threads,
                slow_base, args.repeats, dcpus)
    if "server-cube" in args.modes:
        for cube in args.cubes:
            asked, name, what = cube_row(cube)
            for t in cube_threads:  # a server of its own per row: no row meets another's n-grams in its cache
                with Server(args.model, self_norm, args.server_threads or args.threads, args.server_device,
                            scpus, server_args) as server:
                    line = (f"CSLM name=CSLM0 port={server.port} path={os.path.abspath(args.model)} stats=1 "
                            f"buffer={args.buffer}")
                    ini = work / f"cslm-server-{name}.ini"
                    moses_ini(ini, table, lm, f"{line} {asked}")
                    warm_up(moses, ini, warm, PIPELINE_FLAGS, t, dcpus)
                    key = f"cslm_server_buffered_{name}" + (f"_threads_{t}" if t != args.threads else "")
                    row = rows[key] = run_row(f"server, buffered, cube pruning, {what}, {t} threads", moses, ini, slow,
                                              PIPELINE_FLAGS, t, fastest, 1, dcpus)
                row.update(server.report())
    for mode in ("server-buffered", "server"):
        if mode not in args.modes:
            continue
        with Server(args.model, self_norm, args.server_threads or args.threads, args.server_device, scpus,
                    server_args) as server:
            line = f"CSLM name=CSLM0 port={server.port} path={os.path.abspath(args.model)} stats=1"
            ini = work / f"cslm-{mode}.ini"
            if mode == "server-buffered":
                moses_ini(ini, table, lm, line + " buffer=4096")
                warm_up(moses, ini, warm, NORMAL_FLAGS, args.threads, dcpus)
                rows["cslm_server_buffered"] = run_row("server, buffered", moses, ini, lines, NORMAL_FLAGS,
                                                       args.threads, rows["baseline_normal_search"], 1, dcpus)
            else:
                moses_ini(ini, table, lm, line)
                warm_up(moses, ini, warm[:2], PIPELINE_FLAGS, args.threads, dcpus)
                rows["cslm_server_per_hypothesis"] = run_row("server, per hypothesis", moses, ini, slow,
                                                             PIPELINE_FLAGS, args.threads, slow_base, 1, dcpus)
        rows["cslm_server_buffered" if mode == "server-buffered" else "cslm_server_per_hypothesis"].update(
            server.report())
    report["rows"] = rows
    ratios = [r["ratio_to_baseline"] for r in rows.values() if "ratio_to_baseline" in r]
    if ratios:
        report["best_ratio_to_baseline"] = min(ratios)
        report["target"] = "in process <= 3x the baseline's time; server, cube pruning <= 5x"
    emit(report, args.json)


if __name__ == "__main__":
    run_script(main)
