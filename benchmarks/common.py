"""Helpers shared by the benchmarks: data slices, untrained models of a preset, timing."""

from __future__ import annotations

import atexit
import dataclasses
import gzip
import json
import sys
import itertools
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from moses_rnn.networks import modelio
from moses_rnn.networks.modelbase import preset_config, preset_vocab
from moses_rnn.networks.modelio import build_model
from moses_rnn.training.train import build_vocabularies

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
REAL_TABLE = SHARED / "en-fr-moses" / "phrase-table.gz"


def table_slice(lines: int, folder: str, name: str | None = None, table: str | Path = REAL_TABLE) -> str:
    """The first `lines` lines of a phrase table (plain or gzip; the real one by default), gzipped into `folder`."""
    out = os.path.join(folder, name or f"slice{lines}.gz")
    if not os.path.exists(out):
        opener = gzip.open if str(table).endswith(".gz") else open
        with opener(table, "rb") as src, gzip.open(out, "wb", compresslevel=1) as dst:
            dst.writelines(itertools.islice(src, lines))
    return out


def filter_arpa(src: str | Path, dst: str | Path, vocab: set[str]) -> dict[int, int]:
    """The n-grams of ARPA file `src` whose words are all in `vocab` (or <s>, </s>, <unk>) into `dst`
    (gzip when it ends in .gz), the header's counts rewritten: KenLM's `filter single vocab`.

    Lossless for text over `vocab`: every n-gram such text queries, and every context and suffix it backs
    off to, has only words of `vocab`, so it is kept with its probability and back-off. Returns the counts
    kept per order."""
    keep = {w.encode("utf-8") for w in vocab} | {b"<s>", b"</s>", b"<unk>"}
    sections: dict[int, list[bytes]] = {}
    order = 0
    with gzip.open(src, "rb") if str(src).endswith(".gz") else open(src, "rb") as f:
        for raw in f:
            line = raw.rstrip(b"\n")
            if line.startswith(b"\\") and line.endswith(b"-grams:"):
                order = int(line[1:line.index(b"-")])
                sections[order] = []
            elif line == b"\\end\\":
                order = 0
            elif order and line:
                fields = line.split(b"\t")
                if all(w in keep for w in fields[1].split(b" ")):
                    sections[order].append(raw if raw.endswith(b"\n") else raw + b"\n")
    if not sections:
        raise SystemExit(f"filter_arpa: {src} has no n-gram sections (not an ARPA file?)")
    with gzip.open(dst, "wb", compresslevel=6) if str(dst).endswith(".gz") else open(dst, "wb") as g:
        g.write(b"\n\\data\\\n" + b"".join(b"ngram %d=%d\n" % (n, len(v)) for n, v in sections.items()))
        for n, entries in sections.items():
            g.write(b"\n\\%d-grams:\n" % n)
            g.writelines(entries)
        g.write(b"\n\\end\\\n")
    return {n: len(v) for n, v in sections.items()}


def untrained_model_dir(preset: str, vocab_table: str, folder: str, width: int | None = None) -> str:
    """A model directory of `preset` sizes, shortlists from `vocab_table`, random weights; with `width`, every
    layer (embeddings, hidden state, maxout, output rank) that wide instead, the architecture and shortlists
    kept.

    Speed does not depend on the weights' values, so benchmarks need no training.
    """
    model_dir = os.path.join(folder, f"model-{preset}" + (f"-width{width}" if width else ""))
    size = preset_vocab(preset)
    src_vocab, tgt_vocab = build_vocabularies(vocab_table, size, size)
    modelio.save_vocabularies(model_dir, src_vocab, tgt_vocab)
    torch.manual_seed(0)
    cfg = preset_config(preset, len(src_vocab), len(tgt_vocab))
    if width:
        cfg = dataclasses.replace(cfg, **{f: width for f in ("hidden", "embed", "maxout", "out_rank")
                                          if getattr(cfg, f, None)})
    model = build_model(cfg)
    model.init_weights()
    modelio.save_model(model_dir, model, {"note": "untrained, for benchmarks"})
    return model_dir


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU), so that timings cover it."""
    if device.type == "cuda":
        torch.cuda.synchronize()


def gemm_rate(device: torch.device, m: int, k: int, n: int, dtype: torch.dtype = torch.float32,
              repeats: int = 5) -> float:
    """Measured FLOP/s of [m x k] @ [k x n] in `dtype` on `device` (median of `repeats` rounds of 4 products)."""
    a = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(k, n, device=device).to(dtype)
    torch.mm(a, b)
    rates = []
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        for _ in range(4):
            torch.mm(a, b)
        sync(device)
        rates.append(4 * 2 * m * k * n / (time.perf_counter() - t))
    return statistics.median(rates)


def pinned(cpus: set[int] | None):
    """A preexec_fn that keeps a child process on `cpus` (None: anywhere)."""
    return (lambda: os.sched_setaffinity(0, cpus)) if cpus else None


def parse_cpus(text: str | None) -> set[int] | None:
    """"0,1" or "0-3,8" -> {0, 1} / {0, 1, 2, 3, 8}; None stays None."""
    if not text:
        return None
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def emit(report: dict, path: str | None = None) -> None:
    """Print a benchmark's JSON report (the last thing on stdout, as run_all.py reads it); also write it to `path`."""
    text = json.dumps(report, indent=2)
    print(text)
    if path:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text + "\n")


def finish_check(report: dict) -> None:
    """End a check: `all_ok` when every part of `report` (each a dict with "ok") passed, the report printed
    (`emit`), exit status 1 if any part failed."""
    report["all_ok"] = all(v.get("ok") for v in report.values() if isinstance(v, dict))
    emit(report)
    sys.exit(0 if report["all_ok"] else 1)


def workdir(prefix: str = "moses-rnn-bench-") -> str:
    """A new temporary folder for this run's files (slices, models, outputs, a server's port file), removed
    when the script exits: normally, on an error, or on SIGTERM (through `run_script`'s clean-up). Scripts
    whose files are worth keeping take a --work folder instead."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def require_shared() -> None:
    if not REAL_TABLE.exists():
        raise SystemExit(f"benchmarks need ../shared/data beside the project ({REAL_TABLE} is missing)")


def one_thread_slice(lines: int) -> tuple[str, str]:
    """(a fresh work folder, the shared table's first `lines` lines in it), torch on one CPU thread."""
    from mtcommon.runtime import configure_threads

    require_shared()
    configure_threads(torch.device("cpu"), 1)
    tmp = workdir()
    return tmp, table_slice(lines, tmp)
