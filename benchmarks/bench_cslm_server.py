"""N-grams per second in process against through `cslm serve` with 1, 8 and 64 clients; small-request latency.

    python benchmarks/bench_cslm_server.py MODEL_DIR TEXT [--clients 1 8 64] [--request 256] [--self-normalized]

The n-grams are those of the sentences of TEXT (every word and </s>, history padded with <s>). In process:
`Engine.score_ids` on batches of --max-batch n-grams (the server's ratio to it is the target's), and on
batches of --request n-grams (one client's requests can get no more). Each rate, in process and through
the server, is the best of --repeats passes over the n-grams, so that a ratio compares like with like on a
busy machine. Through the server: a `cslm serve`
child process (n-gram cache off, so every n-gram is computed) and C connections from this process, each with
one request of --request n-grams in flight at a time, as a decoder thread would: one client a blocking
connection, several asyncio ones. From each run's server, the medians of its requests' latency inside it
(payload read to reply written) and of its engine calls (one per batch), and its batches' mean size.
Latency: one blocking client sending requests of 1 and of 16 n-grams.
--self-normalized: both sides answer o_w (the scores Moses asks for), else exact log-probabilities. Both
compute with --evaluator (`cslm serve --evaluator`: auto takes CUDA graphs on a GPU, and the C++ evaluator
for self-normalised scores on a CPU where it is built), neither with a history cache.
--server-cpus: the engine alone and the server run on these CPUs (one thread each by default), the clients
on the others, so that the clients' own work does not take the server's cores.
Prints a JSON report (and writes it with --json).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time

import numpy as np

from cslm.client import AsyncClient, Client
from common import emit, parse_cpus, pinned, workdir
from cslm.engine import Engine
from mtcommon.textio import iter_lines
from mtcommon.cliutil import run_script


def load_ngrams(engine: Engine, text: str, limit: int) -> np.ndarray:
    rows, n = [], 0
    for _, line in iter_lines(text):
        g = engine.sentence_ngrams(line.split())
        rows.append(g)
        n += len(g)
        if n >= limit:
            break
    return np.concatenate(rows)[:limit]


def in_process(engine: Engine, grams: np.ndarray, batch: int, repeats: int) -> float:
    """Best of `repeats` passes (the engine's best case on a busy machine)."""
    engine.score_ids(grams[:batch])  # warm-up
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i in range(0, len(grams), batch):
            engine.score_ids(grams[i : i + batch])
        best = max(best, len(grams) / (time.perf_counter() - t0))
    return best


def one_client(port: int, grams: np.ndarray, request: int, repeats: int) -> float:
    """N-grams/s through one blocking connection, one request in flight, as a decoder thread sends them; the
    best of `repeats` passes, as `in_process` takes."""
    chunks = [grams[i : i + request] for i in range(0, len(grams), request)]
    best = 0.0
    with Client("127.0.0.1", port) as c:
        c.score(chunks[0])  # warm-up
        for _ in range(repeats):
            t0 = time.perf_counter()
            for chunk in chunks:
                c.score(chunk)
            best = max(best, len(grams) / (time.perf_counter() - t0))
    return best


async def through_server(port: int, grams: np.ndarray, clients: int, request: int, repeats: int) -> float:
    """N-grams/s through `clients` asyncio connections, each with one request in flight; the best of
    `repeats` passes."""
    conns = [await AsyncClient.connect("127.0.0.1", port) for _ in range(clients)]
    chunks = [grams[i : i + request] for i in range(0, len(grams), request)]
    await conns[0].score(chunks[0])  # warm-up

    async def worker(k: int) -> None:
        for c in chunks[k::clients]:
            await conns[k].score(c)

    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(k) for k in range(clients)))
        best = max(best, len(grams) / (time.perf_counter() - t0))
    for c in conns:
        await c.close()
    return best


def latency(port: int, grams: np.ndarray, size: int, count: int) -> dict:
    """Round trips of one blocking client, one request at a time, as a decoder thread makes them."""
    lat = []
    with Client("127.0.0.1", port) as c:
        for i in range(count):
            g = grams[(i * size) % (len(grams) - size):][:size]
            t0 = time.perf_counter()
            c.score(g)
            lat.append(time.perf_counter() - t0)
    ms = np.array(lat) * 1e3
    return {f"p{q}": round(float(np.percentile(ms, q)), 3) for q in (50, 90, 99)}


def start_server(model_dir: str, device: str, threads: int | None, max_batch: int, max_delay_us: int,
                 self_normalized: bool = False, evaluator: str = "auto", cpus: set[int] | None = None):
    folder = workdir("cslm-bench-")
    port_file = os.path.join(folder, "port")
    cmd = [sys.executable, "-m", "cslm.cli", "serve", model_dir, "--port", "0", "--port-file", port_file,
           "--cache-size", "0", "--history-cache", "0", "--device", device, "--max-batch", str(max_batch), "--max-delay-us", str(max_delay_us)]
    if threads:
        cmd += ["--threads", str(threads)]
    cmd += ["--evaluator", evaluator] + (["--self-normalized"] if self_normalized else [])
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL, preexec_fn=pinned(cpus))
    while not os.path.exists(port_file):
        if proc.poll() is not None:
            raise SystemExit("the server failed to start")
        time.sleep(0.05)
    with open(port_file) as f:
        return proc, int(f.read())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("text")
    ap.add_argument("--ngrams", type=int, default=40000)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--request", type=int, default=256, help="n-grams per request")
    ap.add_argument("--max-batch", type=int, default=8192)
    ap.add_argument("--max-delay-us", type=int, default=200)
    ap.add_argument("--latency-requests", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3, help="passes per rate, the best kept [%(default)s]")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, help="the engine's threads, on both sides [all, or one per --server-cpus]")
    ap.add_argument("--server-cpus", type=parse_cpus,
                    help="keep the server, and the engine alone, on these CPUs (e.g. 1), the clients on the others")
    ap.add_argument("--self-normalized", action="store_true",
                    help="both sides answer o_w (premultiplied first layer, one output row), as Moses asks")
    ap.add_argument("--evaluator", choices=["auto", "native", "graphs", "torch"], default="auto",
                    help="who computes, on both sides (`cslm serve --evaluator`) [%(default)s]")
    ap.add_argument("--json", help="also write the report here")
    a = ap.parse_args()

    import torch

    client_cpus = None
    if a.server_cpus:  # the engine alone measured where the server will run; the clients kept off those cores
        client_cpus = os.sched_getaffinity(0) - a.server_cpus
        if not client_cpus or not a.server_cpus <= os.sched_getaffinity(0):
            raise SystemExit(f"--server-cpus must be some of this process's CPUs {sorted(os.sched_getaffinity(0))}, "
                             f"not all")
        os.sched_setaffinity(0, a.server_cpus)
        a.threads = a.threads or len(a.server_cpus)
    if a.threads:
        torch.set_num_threads(a.threads)
    engine = Engine.load(a.model_dir, device=a.device, normalized=not a.self_normalized)
    evaluator = engine.use_evaluator(a.evaluator, 0, max_rows=a.max_batch)  # as the server chooses (cslm.server)
    grams = load_ngrams(engine, a.text, a.ngrams)
    report = {
        "model": engine.model.config.to_dict(),
        "device": a.device,
        "scores": engine.scores,
        "evaluator": evaluator,
        "kernels": None if engine.native is None else engine.native.kernels,  # the C++ evaluator's instructions
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "server_cpus": sorted(a.server_cpus) if a.server_cpus else None,
        "client_cpus": sorted(client_cpus) if client_cpus else None,
        "ngrams": int(len(grams)),
        "distinct_histories": int(len(np.unique(grams[:, :-1], axis=0))),
        "request_ngrams": a.request,
        "repeats": a.repeats,
        "in_process_ngrams_per_s": round(in_process(engine, grams, a.max_batch, a.repeats)),
        # the engine on calls of one request's size: what one client's requests can get at best
        "in_process_at_request_ngrams_per_s": round(in_process(engine, grams, a.request, a.repeats)),
    }
    del engine
    if client_cpus:
        os.sched_setaffinity(0, client_cpus)

    def server():
        return start_server(a.model_dir, a.device, a.threads, a.max_batch, a.max_delay_us, a.self_normalized,
                            evaluator, a.server_cpus)

    for c in a.clients:  # a server of its own for each: its STATS speak of this run alone
        proc, port = server()
        try:
            rate = one_client(port, grams, a.request, a.repeats) if c == 1 else \
                asyncio.run(through_server(port, grams, c, a.request, a.repeats))
            with Client("127.0.0.1", port) as stats_client:
                stats = stats_client.stats()
        finally:
            proc.terminate()
            proc.wait(30)
        report[f"server_{c}_clients_ngrams_per_s"] = round(rate)
        report[f"server_{c}_clients_vs_in_process"] = round(rate / report["in_process_ngrams_per_s"], 3)
        report[f"server_{c}_clients_vs_in_process_at_request"] = round(
            rate / report["in_process_at_request_ngrams_per_s"], 3)
        # where a request's time goes: its latency in the server (payload read to reply written) and the
        # engine's call for its batch, medians in ms
        report[f"server_{c}_clients_request_ms_p50"] = stats["latency_ms"]["p50"]
        report[f"server_{c}_clients_engine_ms_p50"] = stats["compute_ms"]["p50"]
        report[f"server_{c}_clients_batch_ngrams_mean"] = stats["batch_ngrams"]["mean"]
    proc, port = server()
    try:
        for size in (1, 16):
            report[f"latency_ms_{size}_ngrams"] = latency(port, grams, size, a.latency_requests)
    finally:
        proc.terminate()
        proc.wait(30)
    emit(report, a.json)


if __name__ == "__main__":
    run_script(main)
