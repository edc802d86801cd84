"""One client floods `cslm serve`, another asks once: the other's wait, and what the server's memory grows by.

    python benchmarks/bench_server_fairness.py MODEL_DIR [--frames 60] [--ngrams 200000]

A `cslm serve` child process (n-gram cache off). The flooding client pipelines --frames SCORE
frames of --ngrams random n-grams each and reads no reply until the end; once it has sent what
the server takes, another client sends one SCORE request of 16 n-grams and times the answer.
Target: the other client answered within 1 s.
Target: growth during the flood within the per-connection byte cap.
The growth is the server's peak resident memory during the flood (the peak started again from the
present size as the flood begins, where the kernel allows) above its warm size: its peak scoring one
batch alone (--max-batch n-grams), after two frames of the flood's size were scored; the cap is `--max-conn-bytes`, two frames by default, against which the
server counts what its requests hold (their payloads and answers: `held_peak_mib`). Options it does
not know go to `cslm serve` (`--max-pending 4`, say). Prints a JSON report (and writes it with --json).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np

from common import emit, workdir

from cslm import protocol as P
from cslm.client import Client
from mtcommon.cliutil import run_script


def rss_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def reset_peak(pid: int) -> bool:
    """Start the process's peak resident memory (VmHWM) again from its present size; False where the kernel
    does not allow it (then the peak counts from the process's start, the warm-up's scoring included)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def start_server(model_dir: str, extra: list[str]) -> tuple[subprocess.Popen, int]:
    folder = workdir("fairness-")
    port_file = os.path.join(folder, "port")
    proc = subprocess.Popen([sys.executable, "-m", "cslm.cli", "serve", model_dir, "--port", "0", "--port-file",
                             port_file, "--cache-size", "0", "--device", "cpu", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(port_file):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            sys.exit(f"bench_server_fairness: the server did not start: {proc.communicate()[1].strip()}")
        time.sleep(0.05)
    return proc, int(open(port_file).read())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--frames", type=int, default=60, help="SCORE frames the flooding client pipelines")
    ap.add_argument("--ngrams", type=int, default=200000, help="n-grams per flooding frame")
    ap.add_argument("--probes", type=int, default=5, help="single requests timed, one after another")
    ap.add_argument("--max-batch", type=int, default=8192, help="the server's --max-batch (n-grams per engine call)")
    ap.add_argument("--json", help="also write the report here")
    args, extra = ap.parse_known_args()

    proc, port = start_server(args.model_dir, ["--max-batch", str(args.max_batch), *extra])
    try:
        rng = np.random.default_rng(1)
        with Client("127.0.0.1", port, timeout=120) as warm:
            order, vocab = warm.info["order"], warm.info["vocab_size"]
            max_frame = warm.info["max_frame_bytes"]
            grams = rng.integers(0, vocab, (args.ngrams, order)).astype(np.int32)
            frame = P.frame(P.SCORE, 0, P.encode_score(grams))
            if len(frame) - P.HEADER_SIZE > max_frame:
                sys.exit(f"bench_server_fairness: {args.ngrams} n-grams exceed the frame limit ({max_frame} bytes)")
            warm.score(grams)  # the server's heap as frames of this size leave it, before the flood
            warm.score(grams)
            # its working memory: one engine call's, which comes and goes with each batch, whoever sent it
            peak_of_batch = reset_peak(proc.pid)
            warm.score(grams[: args.max_batch])
        warm = rss_kib(proc.pid, "VmHWM" if peak_of_batch else "VmRSS")
        peak_of_flood = reset_peak(proc.pid)  # the peak below is the flood's, not the warm-up's

        flood = socket.create_connection(("127.0.0.1", port))
        flood.sendall(P.frame(P.HELLO, 1, P.encode_hello()))
        sent = threading.Event()

        def send_all() -> None:  # blocks once the server stops reading this connection (its caps)
            try:
                for _ in range(args.frames):
                    flood.sendall(frame)
            except OSError:
                pass
            sent.set()

        sender = threading.Thread(target=send_all, daemon=True)
        sender.start()
        time.sleep(2.0)  # the flood fills what the server takes from it
        small = rng.integers(0, vocab, (16, order)).astype(np.int32)
        waits = []
        with Client("127.0.0.1", port, timeout=120) as other:
            for _ in range(args.probes):
                t0 = time.perf_counter()
                other.score(small)
                waits.append(time.perf_counter() - t0)
                time.sleep(0.2)
            held = other.stats()["buffered_bytes"]["peak"]
        peak = rss_kib(proc.pid, "VmHWM")
        flood.close()
        sender.join(5)
    finally:
        proc.terminate()
        proc.wait(60)
    cap = 2 * max_frame  # --max-conn-bytes' default: two frames
    report = {
        "frames": args.frames, "ngrams_per_frame": args.ngrams, "frame_bytes": len(frame),
        "other_client_wait_s": {"median": float(np.median(waits)), "max": max(waits), "all": waits},
        "target_wait_s": 1.0, "wait_ok": max(waits) <= 1.0,
        "server_rss_warm_mib": warm / 1024, "warm_is": "the peak of one batch" if peak_of_batch else "the present size",
        "server_rss_peak_mib": peak / 1024,
        "growth_mib": (peak - warm) / 1024, "peak_since": "the flood" if peak_of_flood else "the start",
        "per_connection_cap_mib": cap / 2**20,
        "held_peak_mib": held / 2**20,  # what the server counted its requests holding at most (STATS)
        "flood_bytes_mib": args.frames * len(frame) / 2**20,
    }
    emit(report, args.json)


if __name__ == "__main__":
    run_script(main)
