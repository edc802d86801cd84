"""Check the CSLM scores Moses computes against `cslm score`, in every mode (not run by CI: needs a Moses).

    MOSES=/path/to/mosesdecoder python benchmarks/check_cslm_moses.py CSLM_MODEL_DIR [--sentences 50]

Decodes the first --sentences of newstest2013 with the shared system plus the
CSLM feature (two scores: ln P and the unknown-word count), a 10-best list per
sentence, in process (also with `precision=int8`, against the C++ evaluator's
int8 scores, where the model is self-normalised), through a server per hypothesis (the first 10 sentences
only: that mode takes seconds per sentence), through a server with the buffer
(normal stack search) and with the buffer under cube pruning, both ways (each
new cube's corner, predict=0; each stack's search run ahead, predict=).
Then batching must change nothing: the first --exact-sentences decoded with
one request per hypothesis and with each cube-pruning buffer (one thread,
deterministic cube pruning) must give byte-identical 1-best output and
10-best lists. For every hypothesis of every list, Moses's `CSLM0=` log-probability
must equal `cslm score` (with --self-normalized for a self-normalised model) on
the hypothesis' text within --tolerance, and the unknown-word count must be the
number of its words outside the shortlist. Then the failure paths: the server
absent at load, and killed in the middle of decoding: Moses must stop with the
feature's one-line message and a non-zero status. Prints a JSON report; exit
status 1 if any check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import finish_check  # noqa: E402
from bench_cslm_decode import (  # noqa: E402
    NORMAL_FLAGS, PIPELINE_FLAGS, SYSTEM, Server, free_port, moses_ini, shared_test_set)

LM = SYSTEM / "lm.fr.5.arpa.gz"  # the shared system's n-gram LM, beside the CSLM

from cslm.engine import Engine  # noqa: E402
from mtcommon import nbest as nbest_list  # noqa: E402
from mtcommon.cliutil import run_script


def nbest(path: Path) -> list[tuple[int, str, float, float]]:
    """(sentence, text, CSLM0 log-probability, CSLM0 unknown count) per n-best line."""
    out = []
    for h in nbest_list.read(str(path)):
        features = dict(h.features())
        out.append((h.sentence, h.text.strip(), features["CSLM0_0"], features["CSLM0_1"]))
    return out


def check_mode(name, moses, ini, lines, flags, engine, self_norm, tol, work) -> dict:
    nb = work / f"{name}.nbest"
    r = subprocess.run([str(moses / "bin" / "moses"), "-f", str(ini), "-threads", "2", *flags,
                        "-n-best-list", str(nb), "10", "distinct"],
                       input="\n".join(lines) + "\n", capture_output=True, text=True)
    if r.returncode != 0:
        return {"ok": False, "error": r.stderr[-2000:]}
    hyps = nbest(nb)
    texts = [h[1].split() for h in hyps]
    want = [float(lp.sum()) for lp, _ in engine.score_sentences(texts)]
    got = np.array([h[2] for h in hyps])
    diff = np.abs(got - np.array(want))
    unk = [sum(w not in engine.vocab.index for w in t) for t in texts]
    unk_ok = all(int(h[3]) == u for h, u in zip(hyps, unk))
    row = {"hypotheses": len(hyps), "max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()),
           "unknown_counts_equal": unk_ok, "ok": bool(diff.max() <= tol and unk_ok)}
    print(f"{name}: {json.dumps(row)}", file=sys.stderr)
    return row


def same_output(moses, ini_a, ini_b, lines, work, decoded: dict | None = None) -> dict:
    """Decode with each ini (cube pruning, deterministic, one thread, 10-best): byte-identical outputs?
    `decoded` keeps each ini's outputs, so that a reference compared twice is decoded once."""
    outs = []
    decoded = {} if decoded is None else decoded
    for ini in (ini_a, ini_b):
        if (ini, len(lines)) not in decoded:
            nb = work / f"{ini.stem}.exact.nbest"
            t = time.perf_counter()
            r = subprocess.run([str(moses / "bin" / "moses"), "-f", str(ini), "-threads", "1", *PIPELINE_FLAGS,
                                "-cube-pruning-deterministic-search", "-n-best-list", str(nb), "10"],
                               input="\n".join(lines) + "\n", capture_output=True, text=True)
            if r.returncode != 0:
                return {"ok": False, "error": r.stderr[-2000:]}
            decoded[ini, len(lines)] = (r.stdout, nb.read_text(encoding="utf-8"), round(time.perf_counter() - t, 1))
        outs.append(decoded[ini, len(lines)])
    row = {"sentences": len(lines), "seconds": [outs[0][2], outs[1][2]],
           "one_best_identical": outs[0][0] == outs[1][0], "nbest_identical": outs[0][1] == outs[1][1]}
    row["ok"] = row["one_best_identical"] and row["nbest_identical"]
    print(f"batching exact: {json.dumps(row)}", file=sys.stderr)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--moses", default=os.environ.get("MOSES"))
    ap.add_argument("--sentences", type=int, default=50)
    ap.add_argument("--tolerance", type=float, default=1e-3)
    ap.add_argument("--work", help="keep the filtered table, moses.ini files and n-best lists here "
                    "(reused when present) [a temporary folder, removed at exit]")
    ap.add_argument("--corner", type=int, default=16, help="corner= of the buffered cube-pruning mode")
    ap.add_argument("--ahead", type=int, default=4, help="ahead= of the buffered cube-pruning mode")
    ap.add_argument("--predict", type=float, default=1.25,
                    help="predict= of the buffered cube-pruning mode that runs each stack's search ahead")
    ap.add_argument("--exact-sentences", type=int, default=10,
                    help="sentences decoded with and without batching for the byte-identical check")
    args = ap.parse_args()
    moses, work, lines, table = shared_test_set(args.moses, args.work, args.sentences, "check-cslm-moses-")
    meta = json.loads((Path(args.model) / "config.json").read_text()).get("meta", {})
    self_norm = float(meta.get("train_config", {}).get("self_norm") or 0) > 0
    engine = Engine.load(args.model, device="cpu", normalized=not self_norm)
    model = os.path.abspath(args.model)
    report: dict = {"self_normalized": self_norm, "sentences": len(lines), "tolerance": args.tolerance}

    ini = work / "local.ini"
    moses_ini(ini, table, LM, f"CSLM name=CSLM0 path={model}")
    report["in_process"] = check_mode("in process", moses, ini, lines, PIPELINE_FLAGS, engine, self_norm,
                                      args.tolerance, work)
    if self_norm:  # the layers after the first in 8 bits (cslm_local.h, "Precision"): the C++ evaluator's int8
        int8 = Engine.load(args.model, device="cpu", normalized=False)
        int8.use_evaluator("native", 0, "int8")
        ini = work / "local-int8.ini"
        moses_ini(ini, table, LM, f"CSLM name=CSLM0 path={model} precision=int8")
        report["in_process_int8"] = check_mode("in process, int8", moses, ini, lines, PIPELINE_FLAGS, int8,
                                               self_norm, args.tolerance, work)
        buffered = work / "local-int8-buffered.ini"
        moses_ini(buffered, table, LM, f"CSLM name=CSLM0 path={model} precision=int8 buffer=65536")
        report["int8_batching_exact"] = same_output(moses, ini, buffered, lines[: args.exact_sentences], work)
    with Server(args.model, self_norm, 2) as server:
        ini = work / "server.ini"
        moses_ini(ini, table, LM, f"CSLM name=CSLM0 port={server.port} path={model}")
        report["server_per_hypothesis"] = check_mode("server", moses, ini, lines[:10], PIPELINE_FLAGS, engine,
                                                     self_norm, args.tolerance, work)
        ini = work / "server-buffered.ini"
        moses_ini(ini, table, LM, f"CSLM name=CSLM0 port={server.port} path={model} buffer=4096")
        report["server_buffered"] = check_mode("server, buffered", moses, ini, lines, NORMAL_FLAGS, engine,
                                               self_norm, args.tolerance, work)
        cube = (f"CSLM name=CSLM0 port={server.port} path={model} buffer=4096 predict=0 corner={args.corner} "
                f"ahead={args.ahead}")
        ini = work / "server-buffered-cube.ini"
        moses_ini(ini, table, LM, cube)
        report["server_buffered_cube"] = check_mode("server, buffered, cube pruning", moses, ini, lines,
                                                    PIPELINE_FLAGS, engine, self_norm, args.tolerance, work)
        # batching changes nothing: one request per hypothesis (no prefetch, no buffer) against the buffer
        # under cube pruning, one decoder thread and the deterministic search: byte-identical 1-best and n-best
        plain = work / "server-plain.ini"
        moses_ini(plain, table, LM, f"CSLM name=CSLM0 port={server.port} path={model} prefetch=0")
        decoded: dict = {}
        report["cube_batching_exact"] = same_output(moses, plain, ini, lines[: args.exact_sentences], work, decoded)
        for run_ahead in ("evaluate", "estimate"):  # the run ahead with every feature, and on estimated scores
            ini = work / f"server-buffered-predict-{run_ahead}.ini"
            moses_ini(ini, table, LM, f"CSLM name=CSLM0 port={server.port} path={model} buffer=4096 "
                                      f"predict={args.predict:g} run-ahead={run_ahead}")
            suffix = "" if run_ahead == "evaluate" else "_estimate"
            report[f"server_buffered_predict{suffix}"] = check_mode(
                f"server, buffered, cube pruning run ahead ({run_ahead})", moses, ini, lines, PIPELINE_FLAGS, engine,
                self_norm, args.tolerance, work)
            report[f"predict{suffix}_batching_exact"] = same_output(moses, plain, ini, lines[: args.exact_sentences],
                                                                    work, decoded)

    # failures: no server at load; the server killed while Moses decodes
    ini = work / "absent.ini"
    moses_ini(ini, table, LM, f"CSLM name=CSLM0 port={free_port()} path={model} timeout=5")
    r = subprocess.run([str(moses / "bin" / "moses"), "-f", str(ini)], input=lines[0] + "\n",
                       capture_output=True, text=True, timeout=600)
    report["server_absent"] = {"exit": r.returncode, "message": next(
        (ln.strip() for ln in r.stderr.splitlines() if "cannot use the CSLM server" in ln), None)}
    report["server_absent"]["ok"] = r.returncode != 0 and report["server_absent"]["message"] is not None
    server = Server(args.model, self_norm, 2).__enter__()
    ini = work / "killed.ini"
    moses_ini(ini, table, LM, f"CSLM name=CSLM0 port={server.port} path={model} timeout=5 retries=2")
    proc = subprocess.Popen([str(moses / "bin" / "moses"), "-f", str(ini), *PIPELINE_FLAGS],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    proc.stdin.write("\n".join(lines * 4) + "\n")
    proc.stdin.close()
    time.sleep(30)  # loading and the first sentences
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    try:
        err = proc.stderr.read()
        code = proc.wait(600)
    except subprocess.TimeoutExpired:
        proc.kill()
        err, code = "moses did not stop", None
    report["server_killed"] = {"exit": code, "message": next(
        (ln.strip() for ln in err.splitlines() if "lost the CSLM server" in ln), None)}
    report["server_killed"]["ok"] = code not in (0, None) and report["server_killed"]["message"] is not None

    finish_check(report)


if __name__ == "__main__":
    run_script(main)
