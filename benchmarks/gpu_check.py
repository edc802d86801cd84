"""One prepared check of every GPU path, in at most 8 minutes on one GPU: one JSON and a short Markdown summary.

    python benchmarks/gpu_check.py -o DIR                  # on the GPU (CUDA device 0)
    python benchmarks/gpu_check.py -o DIR --dry-run        # the same checks on CPU, tiny sizes (a minute or two)
    python benchmarks/gpu_check.py -o DIR --moses MOSESDIR # also the socket decode ratio
    python benchmarks/gpu_check.py -o DIR --only cslm_server  # one check and those it uses (a rerun)
    python benchmarks/gpu_check.py --pack-data gpu-data    # the data a GPU run reads, to carry there
    python benchmarks/gpu_check.py -o DIR --data gpu-data  # ... and read there

Writes DIR/gpu_check.json and DIR/gpu_check.md: the device, the date and, per
check, its figures, the targets of issue 44, pass or fail and the wall time.
Each check runs the project's own command (`moses-rnn`, `cslm`, `torchrun`,
or a benchmark script) in a subprocess of its own process group, bounded by
its own timeout and by what is left of --budget; a check that fails is
recorded with its one-line error and the run goes on. Exit status 0 when
every check ran (ok or skipped), 1 when one failed; targets missed are in
the report, not in the exit status.

Checks, in order (later ones use what earlier ones trained; the CSLM's first, the newest measured):
  matmul        torch.matmul rates, bf16 and fp32 (8192^3 on GPU), in this process;
  cslm_train    `cslm train --preset paper --self-norm 0.1` (self-normalised, as the pipeline's
                CSLM) for about 30 s: n-grams/s and the fraction of the matmul rates;
  cslm_server, cslm_server_sn
                benchmarks/bench_cslm_server.py on that model, exact scores (requests of 256
                n-grams) and self-normalised ones (--self-normalized, the mode Moses uses;
                requests of 1,024, about a decoder's): the engine alone (Engine.score_ids)
                and through `cslm serve` with 1 and 8 clients (target: through the server
                >= 0.8 of the engine), both sides with the default evaluator (CUDA graphs
                on a GPU, the C++ one on a CPU);
  cslm_server_sn_torch
                the self-normalised check with torch's eager path (--evaluator torch);
  cslm_decode   benchmarks/bench_cslm_decode.py with --moses, else skipped: on that paper-size
                model, in process (CPU) and through the server (buffered, cube pruning,
                buffer=65536, the run ahead with every feature and on estimated scores with
                predict=8, 2 and 8 decoder threads): decoding time against
                the baseline (target: <= 5x for this paper-size CSLM through a GPU server);
  train_paper   `moses-rnn train --preset paper` for about a minute on a 200,000-line slice of
                the shared table: pairs/s and the model arithmetic it implies as a fraction of
                the measured matmul rates (target: >= 0.4 of bf16);
  train_batch   the same with --batch-size 2048 for about 25 s: what the recipe's batch leaves idle;
  score_fp32, score_bf16
                `moses-rnn score` of a 1,000,000-line slice with that model (pairs/s as the
                command reports it: reading, scoring, writing; target >= 2M pairs/s on an
                H100-class GPU); bf16 against fp32: the largest and the mean |delta log p| of
                the appended column (bound: mean <= 0.02, docs/scoring.md);
  score_sharded `torchrun --nproc-per-node K moses-rnn score` (K = 2 where there are two GPUs,
                or on CPU; else 1): output byte-identical to one process;
  score_workers `moses-rnn score --workers K` (K = 1: one process alone; K = 4: 3 processes plan
                and format windows for the one that runs them on the GPU; the default is up to
                8): pairs/s, output byte-identical to the default's; and the default with a
                CPU's window and token budget (`--window 8192 --token-budget 16384`, a GPU's
                default sizes are larger, docs/scoring.md): pairs/s, |delta log p| <= 1e-4;
  train_sent, translate, rescore_nbest
                an RNNsearch sentence model trained for 30 s (`moses-rnn train --corpus`),
                `moses-rnn translate` of 300 dev sentences (sentences/s, beam 5) and
                `moses-rnn rescore-nbest` of their 5-best lists.

FLOPs per training example (forward + backward = 3 x forward, the sampled
softmax's candidates rather than the whole shortlist) are those of
benchmarks/bench_train.py: `rnn_flops_per_pair` from the model's sizes and the
slice's mean phrase lengths, `cslm_flops_per_ngram` from the preset.
Targets marked GPU in the report apply to an H100-class GPU only; a CPU run
records its figures without holding them to those targets.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import SHARED, filter_arpa, gemm_rate, table_slice  # noqa: E402
from run_all import _fmt, classify_failure, last_json_object  # noqa: E402
from mtcommon.cliutil import run_script

ROOT = HERE.parent
EXAMPLE_TABLE = ROOT / "moses_rnn" / "data" / "example.en-fr.phrase-table"
DATA = SHARED / "en-fr-moses"
DATA_FILES = ("phrase-table.gz", "train.tok.en", "train.tok.fr", "dev.tok.en")  # what the checks read of --data
DECODE_FILES = ("phrase-table.gz", "lm.fr.5.arpa.gz", "test.tok.en")  # ... and cslm_decode, of the shared system
DECODE_SENTENCES = 50  # bench_cslm_decode.py --quick
BUDGET_S = 480


@dataclass
class Sizes:
    """What each check runs on: the GPU's sizes, or the dry run's."""

    matmul: int
    train_preset: str
    train_lines: int
    train_args: list[str]
    score_lines: int
    sent_preset: str
    sent_lines: int
    sent_args: list[str]
    translate_lines: int
    nbest_lines: int
    cslm_preset: str
    cslm_lines: int
    cslm_args: list[str]
    server_args: list[str]
    decode_args: list[str]
    batch_size: int  # train_batch: the paper preset with a large batch ...
    batch_args: list[str]  # ... and these other options
    score_workers: list[int]  # score_workers: --workers values tried


DECODER_REQUEST = 1024  # n-grams a request in the self-normalised server check: about what Moses sends

GPU = Sizes(
    matmul=8192, train_preset="paper", train_lines=200_000,
    train_args=["--max-steps", "1000000", "--eval-every", "1000", "--max-minutes", "0.75", "--valid-pairs", "500"],
    score_lines=1_000_000,
    sent_preset="small", sent_lines=20_000,
    sent_args=["--subwords", "8000", "--max-len", "50", "--max-steps", "1000000", "--eval-every", "500",
               "--max-minutes", "0.4", "--valid-pairs", "200"],
    translate_lines=300, nbest_lines=300,
    cslm_preset="paper", cslm_lines=60_000,
    cslm_args=["--self-norm", "0.1", "--epoch-ngrams", "4000000", "--max-epochs", "1000", "--max-minutes", "0.5"],
    server_args=["--ngrams", "400000", "--clients", "1", "8", "--latency-requests", "100"],
    # the run ahead with every feature (the default) beside the GPU server's best setting measured before it
    decode_args=["--quick", "--modes", "local", "server-cube", "--cubes", "predict:1.25", "predict:8:run-ahead=estimate",
                 "--buffer", "65536", "--cube-threads", "2", "8"],
    batch_size=2048,
    batch_args=["--max-steps", "1000000", "--eval-every", "100", "--max-minutes", "0.4", "--valid-pairs", "500"],
    score_workers=[1, 4],
)
DRY = Sizes(
    matmul=256, train_preset="tiny", train_lines=2000,
    train_args=["--max-steps", "20", "--eval-every", "10", "--valid-pairs", "20"],
    score_lines=2000,
    sent_preset="tiny", sent_lines=400,
    sent_args=["--max-len", "50", "--max-steps", "10", "--eval-every", "5", "--valid-pairs", "20"],
    translate_lines=20, nbest_lines=10,
    cslm_preset="tiny", cslm_lines=400,
    cslm_args=["--self-norm", "0.1", "--epoch-ngrams", "1024", "--max-epochs", "2", "--valid-fraction", "0.05"],
    server_args=["--ngrams", "4000", "--clients", "1", "4", "--latency-requests", "10"],
    decode_args=["--quick", "--modes", "server-cube", "--cubes", "predict:1.25", "predict:4:run-ahead=estimate"],
    batch_size=256,
    batch_args=["--max-steps", "20", "--eval-every", "10", "--valid-pairs", "20"],
    score_workers=[2],
)

# per check: its own timeout (seconds), within what is left of --budget
TIMEOUTS = {"matmul": 30, "cslm_train": 80, "cslm_server": 60, "cslm_server_sn": 60, "cslm_server_sn_torch": 60,
            "cslm_decode": 300,
            "train_paper": 120, "train_batch": 80, "score_fp32": 90, "score_bf16": 90,
            "score_sharded": 90, "score_workers": 150, "train_sent": 80, "translate": 40, "rescore_nbest": 60}


# what each check uses of an earlier one: the matmul rates, the models trained, the fp32 output
NEEDS = {"train_paper": ["matmul"], "train_batch": ["matmul"], "score_fp32": ["train_paper"],
         "score_bf16": ["score_fp32"], "score_sharded": ["score_fp32"], "score_workers": ["score_fp32"],
         "translate": ["train_sent"], "rescore_nbest": ["train_sent"], "cslm_train": ["matmul"],
         "cslm_server": ["cslm_train"], "cslm_server_sn": ["cslm_train"], "cslm_server_sn_torch": ["cslm_train"],
         "cslm_decode": ["cslm_train"]}


def with_needs(names: list[str]) -> set[str]:
    """The checks `names` and, transitively, those they use (NEEDS)."""
    out, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name not in out:
            out.add(name)
            todo += NEEDS.get(name, [])
    return out


@dataclass
class Target:
    figure: str
    op: str  # ">=", "<=", "=="
    value: float | bool
    gpu_only: bool = False  # a target for an H100-class GPU, not for a CPU run

    def met(self, figures: dict) -> bool | None:
        v = figures.get(self.figure)
        if v is None:
            return None
        return {">=": v >= self.value, "<=": v <= self.value, "==": v == self.value}[self.op]

    def text(self) -> str:
        value = self.value if isinstance(self.value, bool) else _fmt(self.value)
        return f"{self.figure} {self.op} {value}" + (" (GPU)" if self.gpu_only else "")


@dataclass
class Result:
    name: str
    status: str = "ok"  # ok | failed | skipped
    seconds: float = 0.0
    figures: dict = field(default_factory=dict)
    targets: list[dict] = field(default_factory=list)
    passed: bool | None = None  # every target that applies met; None: none applies or not measured
    error: str = ""  # failed: the one-line error; skipped: the reason
    commands: list[str] = field(default_factory=list)


class Skip(Exception):
    """A check that cannot run here; its message is the reason."""


class CheckFailed(Exception):
    """A check's command failed; its message is the one-line error."""


def decode_figures(rep: dict) -> dict:
    """The cslm_decode check's figures from bench_cslm_decode.py's report: the best cube-pruning server row's
    ratio, every row's time, what the CSLM rows asked for, and each server row's own time per request, p50,
    from its read to its reply (latency_ms) and its batch's scoring within it (compute_ms)."""
    cube_rows = ("cslm_server_buffered_cube", "cslm_server_buffered_predict")
    rows = {k: v for k, v in rep.get("rows", {}).items() if k.startswith(cube_rows)}
    if not rows:
        raise CheckFailed("no cube-pruning server row in bench_cslm_decode.py's report")
    best = min(rows, key=lambda k: rows[k]["ratio_to_baseline"])
    figures = {"best_ratio_to_baseline": rows[best]["ratio_to_baseline"], "row": best}
    for key, row in rep["rows"].items():
        name = key.replace("cslm_server_buffered_", "server_").replace("cslm_", "")
        figures[f"{name}_s_per_sentence"] = row["seconds_per_sentence"]
        for k in ("ratio_to_baseline", "requests_per_sentence", "evaluated_per_sentence"):
            if k in row:
                figures[f"{name}_{k.replace('_per_sentence', '')}"] = row[k]
        for k, v in (row.get("server_ms") or {}).items():
            figures[f"{name}_{k}_p50"] = v["p50"]
    return figures


def tool(name: str) -> list[str]:
    """The command line of a project tool: its console script beside this interpreter or on PATH, else
    `python -m` its module."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return [str(beside)]
    found = shutil.which(name)
    if found:
        return [found]
    module = {"moses-rnn": "moses_rnn.cli", "cslm": "cslm.cli", "torchrun": "torch.distributed.run"}[name]
    return [sys.executable, "-m", module]


class Check:
    """Runs one check's commands within its time limit and records them."""

    def __init__(self, result: Result, deadline: float, env: dict):
        self.result, self.deadline, self.env = result, deadline, env

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, cmd: list[str], timeout: float | None = None) -> subprocess.CompletedProcess:
        """Run `cmd` in its own process group; the whole group is killed when it outlasts the check's time.
        A non-zero exit is a CheckFailed with the command's last line of error output."""
        limit = self.left() if timeout is None else min(timeout, self.left())
        if limit <= 1:
            raise CheckFailed("no time left in the check's budget")
        self.result.commands.append(" ".join(cmd))
        proc = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise CheckFailed(f"{Path(cmd[0]).name} timed out after {limit:.0f} s") from None
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if proc.returncode != 0:
            raise CheckFailed(classify_failure(proc.returncode, err)[1])
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def summary_of(p: subprocess.CompletedProcess) -> dict:
    """The JSON summary a training command prints last on stderr."""
    s = last_json_object(p.stderr)
    if s is None:
        raise CheckFailed("no JSON summary at the end of the command's output")
    return s


def steady_rate(summary: dict, unit: str) -> float:
    """Examples per training second from the first held-out evaluation to the last (the first interval,
    with the device's warm-up, left out); the whole run's rate when it had fewer than two evaluations."""
    h = summary.get("valid_ppl_history", [])
    if len(h) >= 2 and h[-1]["train_seconds"] > h[0]["train_seconds"]:
        return (h[-1]["examples_seen"] - h[0]["examples_seen"]) / (h[-1]["train_seconds"] - h[0]["train_seconds"])
    return summary[f"{unit}_seen"] / summary["train_seconds"]


def parse_rate(pattern: str, text: str, what: str) -> float:
    m = re.search(pattern, text)
    if not m:
        raise CheckFailed(f"the command did not report {what}")
    return float(m.group(1))


def head(src: str | Path, dst: str | Path, lines: int) -> None:
    """The first `lines` lines of text file `src` into `dst` (kept when it exists)."""
    if not os.path.exists(dst):
        with open(src, "rb") as f, open(dst, "wb") as g:
            g.writelines(line for _, line in zip(range(lines), f))


def pack_data(data: Path, out: Path) -> None:
    """What a GPU run reads of `data`, cut to its sizes, into `out`: small enough to travel with the
    repository to a machine that has no ../shared. With the shared system's LM and test set in `data`,
    also out/decode: the decode check's system (pack_decode)."""
    out.mkdir(parents=True, exist_ok=True)
    table_slice(max(GPU.score_lines, GPU.train_lines), str(out), "phrase-table.gz", data / "phrase-table.gz")
    for side in ("en", "fr"):
        head(data / f"train.tok.{side}", out / f"train.tok.{side}", max(GPU.sent_lines, GPU.cslm_lines))
    head(data / "dev.tok.en", out / "dev.tok.en", max(GPU.translate_lines, GPU.nbest_lines))
    if all((data / f).exists() for f in DECODE_FILES):
        pack_decode(data, out / "decode")


def pack_decode(system: Path, out: Path, sentences: int = DECODE_SENTENCES) -> None:
    """The shared system cut to what `bench_cslm_decode.py --quick --system OUT` decodes: test.tok.en,
    the phrase table filtered to its first `sentences` (the name the benchmark looks for in its --work)
    and the 5-gram LM filtered to the words those can produce or pass through (lossless for them,
    common.filter_arpa): about 10 MB instead of 120."""
    from bench_cslm_decode import WARMUP, filter_table

    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(system / "test.tok.en", out / "test.tok.en")
    test = (out / "test.tok.en").read_text(encoding="utf-8").splitlines()
    table = out / f"phrase-table.first{sentences}.gz"
    if not table.exists():
        filter_table(system / "phrase-table.gz", test[:sentences], table)
    decoded = test[:sentences] + test[-WARMUP:]  # and bench_cslm_decode.py's warm-up sentences
    vocab = {w for line in decoded for w in line.split()}  # unknown words are passed through to the target
    with gzip.open(table, "rt", encoding="utf-8") as f:
        for line in f:
            vocab.update(line.split(" ||| ", 2)[1].split())
    if not (out / "lm.fr.5.arpa.gz").exists():
        filter_arpa(system / "lm.fr.5.arpa.gz", out / "lm.fr.5.arpa.gz", vocab)


def appended_column(path: str) -> list[float]:
    """log p of every line of a scored table: the ln of the last value of its scores field."""
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            out.append(math.log(float(line.split(" ||| ")[2].split()[-1])))
    return out


class GpuCheck:
    def __init__(self, out_dir: Path, dry_run: bool, budget: float, moses: str | None, work: str,
                 data: Path = DATA):
        import torch

        self.torch = torch
        self.out_dir, self.dry_run, self.moses, self.work = out_dir, dry_run, moses, work
        self.sizes = DRY if dry_run else GPU
        self.data = data if all((data / f).exists() for f in DATA_FILES) else None
        if not dry_run and self.data is None:
            raise SystemExit(f"gpu_check: {data} lacks one of {', '.join(DATA_FILES)} (--data; --pack-data makes them)")
        if not dry_run and not torch.cuda.is_available():
            raise SystemExit("gpu_check: torch sees no CUDA device (--dry-run runs the checks on CPU)")
        self.device = "cpu" if dry_run else "cuda"
        self.gpus = torch.cuda.device_count() if not dry_run else 0
        self.start = time.monotonic()
        self.end = self.start + budget
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
        if dry_run:  # tiny models: one thread each, as the tests run them
            self.env.update(OMP_NUM_THREADS="1")
        self.results: list[Result] = []
        self.state: dict = {}  # what a check leaves for later ones: models, slices, rates

    # data -------------------------------------------------------------------------------------------
    def table(self, lines: int) -> str:
        """A gzipped slice of the data's table, or of the shipped example table without data."""
        if self.data:
            return table_slice(lines, self.work, table=self.data / "phrase-table.gz")
        return table_slice(lines, self.work, "example.gz", EXAMPLE_TABLE)

    def corpus(self, lines: int) -> tuple[str, str]:
        """Tokenized sentence pairs: the data's training corpus's first `lines`, or without data the
        example table's phrase pairs as a tiny corpus."""
        src, tgt = os.path.join(self.work, f"corpus{lines}.en"), os.path.join(self.work, f"corpus{lines}.fr")
        if not os.path.exists(tgt):
            if self.data:
                head(self.data / "train.tok.en", src, lines)
                head(self.data / "train.tok.fr", tgt, lines)
            else:
                with open(EXAMPLE_TABLE, encoding="utf-8") as f:
                    pairs = [line.split(" ||| ")[:2] for line in f][:lines]
                with open(src, "w", encoding="utf-8") as g, open(tgt, "w", encoding="utf-8") as h:
                    g.writelines(s + "\n" for s, _ in pairs)
                    h.writelines(t + "\n" for _, t in pairs)
        return src, tgt

    def dev_source(self, lines: int) -> str:
        path = os.path.join(self.work, f"dev{lines}.en")
        head(self.data / "dev.tok.en" if self.data else self.corpus(self.sizes.sent_lines)[0], path, lines)
        return path

    # running ----------------------------------------------------------------------------------------
    def run_check(self, name: str, fn, targets: list[Target]) -> Result:
        r = Result(name, targets=[asdict(t) for t in targets])
        deadline = min(self.end, time.monotonic() + TIMEOUTS[name])
        print(f"gpu_check: {name} ...", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        try:
            if deadline - time.monotonic() < 5:
                raise Skip("no time left in the run's budget")
            r.figures = fn(Check(r, deadline, self.env))
        except Skip as e:
            r.status, r.error = "skipped", str(e)
        except CheckFailed as e:
            r.status, r.error = "failed", str(e)
        except Exception as e:  # noqa: BLE001 -- a bug in the check itself: keep the one line, go on with the next
            r.status, r.error = "failed", f"{type(e).__name__}: {e}".splitlines()[0]
            traceback.print_exc()
        r.seconds = round(time.monotonic() - t0, 1)
        if r.status == "ok":
            verdicts = [t.met(r.figures) for t in targets if not (t.gpu_only and self.device == "cpu")]
            r.passed = None if not verdicts or None in verdicts else all(verdicts)
        print(f"gpu_check: {name}: {r.status}{' (' + r.error + ')' if r.error else ''} in {r.seconds} s",
              file=sys.stderr, flush=True)
        self.results.append(r)
        return r

    def plan(self) -> list[tuple[str, object, list[Target]]]:
        """Every check in its order: name, the method that runs it, its targets."""
        return [
            ("matmul", self.matmul, []),
            ("cslm_train", self.cslm_train, []),
            ("cslm_server", self.cslm_server, [Target("server_1_client_vs_engine", ">=", 0.8),
                                               Target("server_many_clients_vs_engine", ">=", 0.8)]),
            ("cslm_server_sn", lambda c: self.cslm_server(c, self_normalized=True),
             [Target("server_1_client_vs_engine", ">=", 0.8), Target("server_many_clients_vs_engine", ">=", 0.8)]),
            # the same with torch's eager path, against which the default's evaluator (CUDA graphs on a GPU, the
            # C++ one on a CPU) is measured
            ("cslm_server_sn_torch", lambda c: self.cslm_server(c, self_normalized=True, evaluator="torch"), []),
            # <= 5x: the paper-size CSLM through a GPU server, and any CSLM through a server on the decoder's cores
            ("cslm_decode", self.cslm_decode, [Target("best_ratio_to_baseline", "<=", 5.0)]),
            ("train_paper", self.train_paper, [Target("fraction_of_bf16_matmul", ">=", 0.4, gpu_only=True)]),
            ("train_batch", self.train_batch, []),
            ("score_fp32", lambda c: self.score(c, "fp32"), [Target("pairs_per_s", ">=", 2e6, gpu_only=True)]),
            ("score_bf16", lambda c: self.score(c, "bf16"),
             [Target("pairs_per_s", ">=", 2e6, gpu_only=True), Target("mean_abs_delta_logp", "<=", 0.02)]),
            ("score_sharded", self.score_sharded, [Target("identical_to_unsharded", "==", True)]),
            ("score_workers", self.score_workers, [Target("identical_to_default", "==", True),
                                                   Target("cpu_sizes_max_abs_delta_logp", "<=", 1e-4),
                                                   Target("pairs_per_s", ">=", 2e6, gpu_only=True)]),
            ("train_sent", self.train_sent, []),
            ("translate", self.translate, []),
            ("rescore_nbest", self.rescore_nbest, []),
        ]

    def run(self, only: list[str] | None = None) -> dict:
        """Run every check, or those named in `only` and the ones they use (`with_needs`)."""
        wanted = with_needs(only) if only else None
        for name, fn, targets in self.plan():
            if wanted is None or name in wanted:
                self.run_check(name, fn, targets)
        return self.report()

    # checks -----------------------------------------------------------------------------------------
    def matmul(self, c: Check) -> dict:
        torch, n = self.torch, self.sizes.matmul
        dev = torch.device(self.device)
        rates = {"size": n, "tf32_allowed": torch.backends.cuda.matmul.allow_tf32}
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            rates[f"{name}_tflops"] = round(gemm_rate(dev, n, n, n, dtype) / 1e12, 4)
        self.state["matmul"] = rates
        if dev.type == "cuda":
            torch.cuda.empty_cache()  # leave the GPU's memory to the commands that follow
        return rates

    def matmul_fractions(self, flops_per_s: float) -> dict:
        m = self.state.get("matmul")
        if not m:
            return {}
        return {f"fraction_of_{d}_matmul": round(flops_per_s / (m[f"{d}_tflops"] * 1e12), 4)
                for d in ("bf16", "fp32") if m[f"{d}_tflops"] > 0}

    def train_paper(self, c: Check) -> dict:
        figures = self.train_rnn(c, "rnn-model", self.sizes.train_args)
        self.state["rnn_model"] = os.path.join(self.work, "rnn-model")
        return figures

    def train_batch(self, c: Check) -> dict:
        """The same preset with a large batch: how much of the GPU the recipe's small batch leaves idle."""
        s = self.sizes
        return {"batch_size": s.batch_size,
                **self.train_rnn(c, "rnn-model-batch", ["--batch-size", str(s.batch_size), *s.batch_args])}

    def train_rnn(self, c: Check, name: str, args: list[str]) -> dict:
        """`moses-rnn train` of the preset on the slice into work/`name`: its steady pairs/s and arithmetic rate."""
        from bench_train import rnn_flops_per_pair, table_lengths

        s = self.sizes
        table = self.table(s.train_lines)
        model = os.path.join(self.work, name)
        with ThreadPoolExecutor(1) as pool:  # the slice's phrase lengths, read while the command trains
            lengths = pool.submit(table_lengths, table)
            p = c.run([*tool("moses-rnn"), "train", table, "-o", model, "--preset", s.train_preset, "--device",
                       self.device, "--quiet", *args])
            _, _, src_len, tgt_len = lengths.result()
        summary = summary_of(p)
        rate = steady_rate(summary, "pairs")
        with open(os.path.join(model, "config.json"), encoding="utf-8") as f:
            config = json.load(f)["model"]
        flops = rnn_flops_per_pair(s.train_preset, config["src_vocab"], config["tgt_vocab"], src_len, tgt_len, 2048)
        return {"pairs_per_s": round(rate, 1), "steps": summary["steps"], "dtype": summary["dtype"],
                "train_seconds": summary["train_seconds"], "gflop_per_pair": round(flops / 1e9, 4),
                "model_tflops": round(rate * flops / 1e12, 4), **self.matmul_fractions(rate * flops)}

    def scoring_model(self) -> str:
        """The model the train check trained; an untrained one of its preset when that check failed."""
        if "rnn_model" not in self.state:
            from common import untrained_model_dir

            self.state["rnn_model"] = untrained_model_dir(self.sizes.train_preset, self.table(self.sizes.train_lines),
                                                          self.work)
        return self.state["rnn_model"]

    def score(self, c: Check, dtype: str) -> dict:
        from mtcommon.runtime import native_bf16

        if dtype == "bf16" and not native_bf16(self.torch.device(self.device)):
            raise Skip(f"no native bfloat16 on this {self.device}")
        table, model = self.table(self.sizes.score_lines), self.scoring_model()
        out = os.path.join(self.work, f"scored-{dtype}.gz")
        p = c.run([*tool("moses-rnn"), "score", table, "-m", model, "-o", out, "--device", self.device,
                   "--dtype", dtype, "--quiet"])
        lines = parse_rate(r"(\d+) lines,", p.stderr, "its lines")
        figures = {"lines": int(lines), "pairs_per_s": parse_rate(r"(\d+) pairs/s", p.stderr, "its pairs/s"),
                   "processes": int(parse_rate(r"\((\d+) process", p.stderr, "its processes"))}
        self.state[f"scored_{dtype}"] = out
        if dtype == "bf16":
            if "scored_fp32" not in self.state:
                raise CheckFailed("no fp32 output to compare with (score_fp32 failed)")
            a, b = appended_column(self.state["scored_fp32"]), appended_column(out)
            delta = [abs(x - y) for x, y in zip(a, b)]
            figures["max_abs_delta_logp"] = round(max(delta), 5)
            figures["mean_abs_delta_logp"] = round(sum(delta) / len(delta), 6)
            figures["speedup_over_fp32"] = round(figures["pairs_per_s"] / self.state["fp32_rate"], 3)
        else:
            self.state["fp32_rate"] = figures["pairs_per_s"]
        return figures

    def score_sharded(self, c: Check) -> dict:
        if "scored_fp32" not in self.state:
            raise Skip("no one-process output to compare with (score_fp32 failed)")
        procs = 2 if self.device == "cpu" or self.gpus >= 2 else 1
        table, model = self.table(self.sizes.score_lines), self.scoring_model()
        out = os.path.join(self.work, "scored-sharded.gz")
        program = tool("moses-rnn")
        program = program if len(program) == 1 else ["-m", program[-1]]  # torchrun runs a script, or -m a module
        p = c.run([*tool("torchrun"), "--standalone", "--nproc-per-node", str(procs), *program, "score", table,
                   "-m", model, "-o", out, "--device", self.device, "--dtype", "fp32", "--quiet"])
        with open(out, "rb") as f, open(self.state["scored_fp32"], "rb") as g:
            same = f.read() == g.read()
        return {"processes": procs, "identical_to_unsharded": same,
                "pairs_per_s": parse_rate(r"(\d+) pairs/s", p.stderr, "its pairs/s")}

    def score_workers(self, c: Check) -> dict:
        """`score --workers K` (on a GPU K-1 processes plan and format windows for the one that runs them; on a
        CPU each scores windows of its own): pairs/s for each K, and every output byte-identical to the
        default's (score_fp32). Then the default with a CPU's window and token budget: pairs/s against the
        default's (on a GPU other matrix shapes, so the largest |delta log p| rather than the bytes)."""
        if "scored_fp32" not in self.state:
            raise Skip("no default output to compare with (score_fp32 failed)")
        table, model = self.table(self.sizes.score_lines), self.scoring_model()
        with open(self.state["scored_fp32"], "rb") as g:
            one = g.read()
        figures, same = {"cores": os.cpu_count()}, True
        for k in self.sizes.score_workers:
            out = os.path.join(self.work, f"scored-workers{k}.gz")
            p = c.run([*tool("moses-rnn"), "score", table, "-m", model, "-o", out, "--device", self.device,
                       "--dtype", "fp32", "--workers", str(k), "--quiet"])
            rate = parse_rate(r"(\d+) pairs/s", p.stderr, "its pairs/s")
            figures[f"workers_{k}_pairs_per_s"] = rate
            figures[f"workers_{k}_speedup"] = round(rate / self.state["fp32_rate"], 3)
            with open(out, "rb") as f:
                same = same and f.read() == one
        figures["identical_to_default"] = same
        figures["pairs_per_s"] = max(figures[f"workers_{k}_pairs_per_s"] for k in self.sizes.score_workers)
        out = os.path.join(self.work, "scored-cpu-sizes.gz")
        p = c.run([*tool("moses-rnn"), "score", table, "-m", model, "-o", out, "--device", self.device,
                   "--dtype", "fp32", "--window", "8192", "--token-budget", "16384", "--quiet"])
        rate = parse_rate(r"(\d+) pairs/s", p.stderr, "its pairs/s")
        figures["cpu_sizes_pairs_per_s"] = rate
        figures["default_over_cpu_sizes"] = round(self.state["fp32_rate"] / rate, 3)
        a, b = appended_column(self.state["scored_fp32"]), appended_column(out)
        figures["cpu_sizes_max_abs_delta_logp"] = max((abs(x - y) for x, y in zip(a, b)), default=0.0)
        return figures

    def train_sent(self, c: Check) -> dict:
        s = self.sizes
        src, tgt = self.corpus(s.sent_lines)
        model = os.path.join(self.work, "sent-model")
        p = c.run([*tool("moses-rnn"), "train", "--corpus", src, tgt, "-o", model, "--arch", "rnnsearch",
                   "--preset", s.sent_preset, "--device", self.device, "--quiet", *s.sent_args])
        summary = summary_of(p)
        self.state["sent_model"] = model
        return {"pairs_per_s": round(steady_rate(summary, "pairs"), 1), "steps": summary["steps"],
                "valid_ppl": round(summary["valid_ppl"], 2)}

    def translate(self, c: Check) -> dict:
        if "sent_model" not in self.state:
            raise Skip("no sentence model (train_sent failed)")
        source = self.dev_source(self.sizes.translate_lines)
        output = os.path.join(self.work, "dev.trans")
        p = c.run([*tool("moses-rnn"), "translate", "-m", self.state["sent_model"], "-i", source, "-o", output,
                   "--beam", "5", "--device", self.device])  # no --quiet: the rate is in its last line
        return {"sentences": self.sizes.translate_lines,
                "sentences_per_s": parse_rate(r"translated, ([\d.]+)/s\)", p.stderr, "its sentences/s")}

    def rescore_nbest(self, c: Check) -> dict:
        if "sent_model" not in self.state:
            raise Skip("no sentence model (train_sent failed)")
        model, source = self.state["sent_model"], self.dev_source(self.sizes.nbest_lines)
        listed = os.path.join(self.work, "dev.5best")
        c.run([*tool("moses-rnn"), "translate", "-m", model, "-i", source, "-o", listed, "--beam", "5",
               "--n-best", "5", "--device", self.device, "--quiet"])
        nbest = os.path.join(self.work, "dev.nbest")
        with open(listed, encoding="utf-8") as f, open(nbest, "w", encoding="utf-8") as g:
            for line in f:  # `id ||| hypothesis ||| score` -> a Moses list line with one feature
                i, hyp, score = line.rstrip("\n").split(" ||| ")
                g.write(f"{i} ||| {hyp} ||| Beam0= {score} ||| {score}\n")
        rescored = os.path.join(self.work, "dev.nbest.rnn")
        t0 = time.monotonic()
        p = c.run([*tool("moses-rnn"), "rescore-nbest", nbest, "-m", model, "--source", source, "-o", rescored,
                   "--device", self.device])  # its count of hypotheses: not --quiet
        seconds = time.monotonic() - t0
        hyps = int(parse_rate(r"(\d+) hypotheses", p.stderr, "its hypotheses"))
        with open(rescored, encoding="utf-8") as f:
            added = sum(1 for line in f if " RNN0= " in line)
        return {"hypotheses": hyps, "hypotheses_with_feature": added,
                "hypotheses_per_s_with_startup": round(hyps / seconds, 1)}

    def cslm_text(self) -> str:
        if self.data:
            path = os.path.join(self.work, f"train{self.sizes.cslm_lines}.fr")
            head(self.data / "train.tok.fr", path, self.sizes.cslm_lines)
            return path
        return self.corpus(self.sizes.sent_lines)[1]

    def cslm_train(self, c: Check) -> dict:
        from bench_train import cslm_flops_per_ngram

        s = self.sizes
        model = os.path.join(self.work, "cslm-model")
        p = c.run([*tool("cslm"), "train", self.cslm_text(), "-o", model, "--preset", s.cslm_preset,
                   "--device", self.device, "--quiet", *s.cslm_args])
        summary = summary_of(p)
        self.state["cslm_model"] = model
        rate = steady_rate(summary, "ngrams")
        flops = cslm_flops_per_ngram(s.cslm_preset)
        return {"ngrams_per_s": round(rate, 1), "dtype": summary["dtype"], "gflop_per_ngram": round(flops / 1e9, 5),
                "model_tflops": round(rate * flops / 1e12, 4), **self.matmul_fractions(rate * flops)}

    def cslm_server(self, c: Check, self_normalized: bool = False, evaluator: str = "auto") -> dict:
        """bench_cslm_server.py: the engine alone and through `cslm serve`, exact scores or (the mode Moses
        uses) self-normalised ones computed by `evaluator`."""
        if "cslm_model" not in self.state:
            raise Skip("no CSLM model (cslm_train failed)")
        report_path = os.path.join(self.work, f"cslm_server{'_sn' if self_normalized else ''}_{evaluator}.json")
        # self-normalised, as Moses asks: requests of about a decoder's size (1,072 n-grams a request through
        # the server, docs/cslm.md); exact: the benchmark's 256
        c.run([sys.executable, str(HERE / "bench_cslm_server.py"), self.state["cslm_model"], self.cslm_text(),
               "--device", self.device, *self.sizes.server_args, "--json", report_path,
               *(["--self-normalized", "--request", str(DECODER_REQUEST), "--evaluator", evaluator]
                 if self_normalized else [])])
        with open(report_path, encoding="utf-8") as f:
            rep = json.load(f)
        many = max(int(k.split("_")[1]) for k in rep if re.fullmatch(r"server_\d+_clients_ngrams_per_s", k))
        return {"scores": rep["scores"], "evaluator": rep["evaluator"], "request_ngrams": rep["request_ngrams"],
                "engine_ngrams_per_s": rep["in_process_ngrams_per_s"],
                "server_1_client_ngrams_per_s": rep["server_1_clients_ngrams_per_s"],
                f"server_{many}_clients_ngrams_per_s": rep[f"server_{many}_clients_ngrams_per_s"],
                "server_1_client_vs_engine": rep["server_1_clients_vs_in_process"],
                # the engine on calls of one request's size: what one client's requests can get at best
                "engine_at_request_ngrams_per_s": rep["in_process_at_request_ngrams_per_s"],
                "server_1_client_vs_engine_at_request": rep["server_1_clients_vs_in_process_at_request"],
                # one client's request inside the server, and the engine's call within it (medians, ms)
                "server_1_client_request_ms_p50": rep["server_1_clients_request_ms_p50"],
                "server_1_client_engine_ms_p50": rep["server_1_clients_engine_ms_p50"],
                "server_many_clients_vs_engine": rep[f"server_{many}_clients_vs_in_process"],
                "server_many_clients_batch_ngrams_mean": rep[f"server_{many}_clients_batch_ngrams_mean"],
                "many_clients": many, "latency_ms_1_ngram_p50": rep["latency_ms_1_ngrams"]["p50"],
                "latency_ms_16_ngrams_p50": rep["latency_ms_16_ngrams"]["p50"]}

    def cslm_decode(self, c: Check) -> dict:
        if not self.moses:
            raise Skip("no --moses: a mosesdecoder built with cslm/moses/add-to-moses.sh is needed")
        if "cslm_model" not in self.state:
            raise Skip("no CSLM model (cslm_train failed)")
        report_path = os.path.join(self.work, "cslm_decode.json")
        system = []
        if self.data and (self.data / "decode").is_dir():  # --pack-data's system; else the shared one
            work = os.path.join(self.work, "decode")
            os.makedirs(work, exist_ok=True)
            table = f"phrase-table.first{DECODE_SENTENCES}.gz"
            shutil.copyfile(self.data / "decode" / table, os.path.join(work, table))
            system = ["--system", str(self.data / "decode"), "--work", work]
        c.run([sys.executable, str(HERE / "bench_cslm_decode.py"), self.state["cslm_model"], "--moses", self.moses,
               "--server-device", self.device, *self.sizes.decode_args, *system, "--json", report_path])
        if not os.path.exists(report_path):
            raise CheckFailed("bench_cslm_decode.py wrote no report (Moses not found?)")
        with open(report_path, encoding="utf-8") as f:
            return decode_figures(json.load(f))

    # report -----------------------------------------------------------------------------------------
    def device_name(self) -> str:
        if self.device == "cuda":
            return self.torch.cuda.get_device_name(0)
        try:
            with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
                model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
        except OSError:
            model = ""
        return f"CPU: {model or platform.processor() or 'unknown'} ({os.cpu_count()} cores)"

    def shown(self, command: str) -> str:
        """A recorded command as the report shows it: no machine's paths (the work folder as WORK, the
        checkout's files relative to it, the interpreter as python3, the tools beside it by name)."""
        return (command.replace(sys.executable, "python3").replace(str(Path(sys.executable).parent) + os.sep, "")
                .replace(self.work, "WORK").replace(str(ROOT) + os.sep, ""))

    def report(self) -> dict:
        return {
            "device": self.device_name(),
            "device_type": self.device,
            "mode": "dry-run (CPU, tiny sizes)" if self.dry_run else "gpu",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": self.torch.__version__,
            "data": str(self.data) if self.data else "the shipped example table (no --data)",
            "budget_seconds": round(self.end - self.start),
            "total_seconds": round(time.monotonic() - self.start, 1),
            "checks": [{**asdict(r), "commands": [self.shown(c) for c in r.commands]} for r in self.results],
        }


def markdown(report: dict) -> str:
    lines = [f"# GPU check: {report['device']}", "",
             (f"{report['date']}, {report['mode']}, torch {report['torch']}, "
              f"{report['total_seconds']:.0f} s of a {report['budget_seconds']} s budget."), "",
             "| check | status | wall s | figures | targets | pass |", "|---|---|---:|---|---|---|"]
    for c in report["checks"]:
        figs = c["error"]
        if c["status"] == "ok":
            figs = "; ".join(f"{k} {v if isinstance(v, bool) else _fmt(v)}" for k, v in c["figures"].items())
        targets = "; ".join(Target(**t).text() for t in c["targets"]) or "-"
        verdict = {True: "pass", False: "**FAIL**", None: "-"}[c["passed"]]
        lines.append(f"| {c['name']} | {c['status']} | {c['seconds']:.0f} | {figs.replace('|', '/')} | "
                     f"{targets} | {verdict} |")
    if report["device_type"] == "cpu":
        lines += ["", "Targets marked (GPU) are for an H100-class GPU and are not held against a CPU run."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("-o", "--output-dir", help="where gpu_check.json and gpu_check.md go")
    ap.add_argument("--dry-run", "--cpu-smoke", action="store_true",
                    help="every check on CPU with tiny models and slices (a minute or two)")
    ap.add_argument("--data", type=Path, default=DATA,
                    help="phrase-table.gz, train.tok.en/fr and dev.tok.en (shared en-fr-moses or --pack-data's) "
                         "[../shared/data/en-fr-moses; without it the dry run uses the shipped example table]")
    ap.add_argument("--pack-data", type=Path, metavar="DIR",
                    help="write the part of --data a GPU run reads into DIR (about 50 MB) and stop")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for the whole run [%(default)s]")
    ap.add_argument("--moses", default=os.environ.get("MOSES"),
                    help="a mosesdecoder with the CSLM feature, for the decode ratio [$MOSES]")
    ap.add_argument("--only", action="append", choices=list(TIMEOUTS), metavar="CHECK",
                    help="run this check and those it uses (repeatable; to rerun a failed one) [all]")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (models, slices, outputs)")
    a = ap.parse_args(argv)
    if a.pack_data:
        pack_data(a.data, a.pack_data)
        return 0
    if not a.output_dir:
        ap.error("-o/--output-dir is required")
    out = Path(a.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = tempfile.mkdtemp(prefix="gpu-check-", dir=out if a.keep else None)
    try:
        check = GpuCheck(out, a.dry_run, a.budget, a.moses, work, a.data)
        report = check.run(a.only)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (out / "gpu_check.md").write_text(markdown(report), encoding="utf-8")
    print(markdown(report))
    return 1 if any(c["status"] == "failed" for c in report["checks"]) else 0


if __name__ == "__main__":
    run_script(main)
