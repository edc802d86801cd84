"""The C++ evaluator from Python (cslm/native.py, cslm/cpp/cslm_native.cc) and the server's choice of evaluator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from cslm import native
from cslm.client import Client
from cslm.engine import Engine
from cslm.stats import startup_message
from mtcommon.errors import UserError

from test_cslm_local import model_dir  # noqa: F401 (a self-normalised model, shared within the module)
from test_cslm_server import ServerThread, random_ngrams

built = pytest.mark.skipif(native.library_path() is None, reason="cslm/_native not built (no C++ compiler)")


def engines(path):
    torch_engine = Engine.load(str(path), device="cpu", normalized=False)
    native_engine = Engine.load(str(path), device="cpu", normalized=False)
    assert native_engine.use_evaluator("native", 64) == "native"
    return torch_engine, native_engine


@built
def test_native_scores_are_the_torch_engines(model_dir):  # noqa: F811
    """Self-normalised o_w from the C++ evaluator equal torch's within float rounding, through a history cache
    small enough that rows are replaced, and the exact path's o_w - ln Z too."""
    out, _, _ = model_dir
    torch_engine, native_engine = engines(out)
    grams = random_ngrams(torch_engine, 500, 7, seed=5)
    grams[250:, :-1] = grams[:250, :-1]  # histories met again: the cache's hits
    rows = torch_engine.pad(grams)
    want, flags = torch_engine.score_rows(rows)
    for _ in range(2):
        got, got_flags = native_engine.score_rows(rows)
        assert got.dtype == np.float32 and np.max(np.abs(got - want)) < 1e-4
        assert np.array_equal(got_flags, flags)
    hits, misses = native_engine.native.cache_counts()
    assert hits > 0 and hits + misses == 2 * len(rows)
    exact = Engine.load(str(out), device="cpu").score_rows(rows)[0]
    assert np.max(np.abs(native_engine.native.score(rows, normalized=True) - exact)) < 1e-4


@built
def test_a_call_split_over_threads_answers_as_one_thread(model_dir):  # noqa: F811
    """Rows shared out over threads (one per 256 rows, each with a scratch of its own) give the scores of one
    thread bit for bit, an error in any row is the call's, and the cache counts every row."""
    out, _, _ = model_dir
    engine = Engine.load(str(out), device="cpu", normalized=False)
    rows = engine.pad(random_ngrams(engine, 2000, 7, seed=9))
    one = native.NativeModel(str(out), 64, threads=1).score(rows, normalized=False)
    split = native.NativeModel(str(out), 64, threads=4)
    assert split.full_rows == 4 * 256  # what the server's batches need, no more (parts of at least 256 rows)
    assert np.array_equal(split.score(rows, normalized=False), one)
    hits, misses = split.cache_counts()
    assert hits + misses == len(rows)
    bad = rows.copy()
    bad[1900, -1] = split.vocab_size  # in the last part
    with pytest.raises(ValueError):
        split.score(bad, normalized=False)


@built
def test_every_call_is_shared_out_in_chunks_that_cover_its_rows():
    """A call gets a thread per 0.1 ms of its rows' expected time, at most `threads` and one per row, and
    every thread's chunk holds at least one row: a slow model's call of a few rows (a chunk of 0 rows once
    crashed the server dividing by it) as well as a fast one's of thousands."""
    for row_ns in (0, 100, 5_000, 50_000, 400_000, 10**9):
        for threads in (1, 2, 3, 8):
            for count in (0, 1, 2, 3, 5, 7, 16, 63, 64, 255, 256, 513, 8192):
                wanted, chunk = native.plan(count, row_ns, threads)
                assert wanted <= min(threads, count)
                if wanted < 2:
                    assert chunk == count  # one thread: the whole call at once
                else:
                    assert 1 <= chunk <= 64 and chunk * wanted <= count
    assert native.plan(256, 5_000, 2) == (2, 32)  # a small model's 256 rows: both threads, 32 at a time
    assert native.plan(256, 200, 2) == (0, 256)  # a tiny model's: not worth a helper
    assert native.plan(512, 0, 2) == (2, 64)  # untimed: a thread per 256 rows


@built
def test_the_threads_of_a_call_share_one_history_cache(model_dir):  # noqa: F811
    """A history that one thread computed is found by every other: after a call shared out over threads, the
    same rows scored again from one thread compute no hidden layer (with a cache per thread they would compute
    those of the rows the other threads took)."""
    out, _, _ = model_dir
    engine = Engine.load(str(out), device="cpu", normalized=False)
    histories = random_ngrams(engine, 100, 7, seed=11)[:, :-1]
    grams = random_ngrams(engine, 4000, 7, seed=12)
    grams[:, :-1] = np.repeat(histories, 40, axis=0)  # each history's 40 rows together, in one thread's rows
    rows = engine.pad(grams)
    m = native.NativeModel(str(out), 1 << 16, threads=4)
    first = m.score(rows, normalized=False)
    hits, misses = m.cache_counts()
    assert misses >= len(histories)  # each computed at least once (twice where two threads met it at once)
    m.threads = 1  # one lookup per run of equal rows
    assert np.array_equal(m.score(rows, normalized=False), first)
    assert m.cache_counts() == (hits + len(histories), misses)


@built
def test_native_calls_from_several_threads_get_their_own_answers(model_dir):  # noqa: F811
    out, _, _ = model_dir
    torch_engine, native_engine = engines(out)
    parts = [torch_engine.pad(random_ngrams(torch_engine, 300, 7, seed=s)) for s in range(8)]
    want = [native_engine.native.score(p, normalized=False) for p in parts]
    got = [None] * len(parts)

    def work(i):
        for _ in range(20):
            got[i] = native_engine.native.score(parts[i], normalized=False)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(parts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(np.array_equal(g, w) for g, w in zip(got, want))


@built
def test_native_refuses_bad_rows_and_models(model_dir, tmp_path):  # noqa: F811
    out, loaded, _ = model_dir
    m = native.NativeModel(str(out), 0)
    with pytest.raises(ValueError, match="rows must be"):
        m.score(np.zeros((3, 4), np.int32), normalized=False)
    bad = np.zeros((1, m.row_size), np.int32)
    for wrong in (m.vocab_size, -1):  # int32 rows go in as they are: a negative id is out of range too
        bad[0, -1] = wrong
        with pytest.raises(ValueError, match="beyond the vocabulary"):
            m.score(bad, normalized=False)
    with pytest.raises(UserError, match=str(tmp_path)):
        native.NativeModel(str(tmp_path), 16)  # no model there: one line naming the file
    exact = Engine.load(str(out), device="cpu")
    with pytest.raises(UserError, match="--evaluator torch"):
        exact.use_evaluator("native", None)


def test_auto_takes_torch_where_the_library_is_not_built(model_dir, monkeypatch):  # noqa: F811
    out, _, _ = model_dir
    monkeypatch.setattr(native, "library_path", lambda: None)
    engine = Engine.load(str(out), device="cpu", normalized=False)
    assert engine.use_evaluator("auto", None) == "torch" and engine.native is None and engine.history_cache is None
    assert engine.full_batch is None  # torch: every row more helps
    assert engine.use_evaluator("torch", 100) == "torch" and engine.history_cache.slots == 100
    monkeypatch.setattr(native, "_lib", None)
    with pytest.raises(UserError, match="not built"):
        engine.use_evaluator("native", None)


@built
def test_a_server_scores_with_the_cpp_evaluator_by_default(model_dir):  # noqa: F811
    """`cslm serve --self-normalized` on a CPU: the C++ evaluator, its answers those of Moses's in-process mode
    (the same evaluator), its history cache counted in STATS."""
    out, _, _ = model_dir
    engine = Engine.load(str(out), device="cpu", normalized=False)
    reference = native.NativeModel(str(out), 0)
    s = ServerThread(engine, cache_size=0)
    try:
        grams = random_ngrams(engine, 300, 7, seed=3)
        grams[100:, :-1] = grams[:200, :-1]
        with Client("127.0.0.1", s.port) as c, Client("127.0.0.1", s.port) as d:
            for client, part in ((c, grams[:100]), (d, grams[100:120]), (c, grams[120:])):
                assert np.array_equal(client.score(part)[0], reference.score(engine.pad(part), normalized=False))
        with Client("127.0.0.1", s.port) as c:  # alone: up to a full batch scored on the loop's thread
            for part in (grams[:70], grams):
                assert np.array_equal(c.score(part)[0], reference.score(engine.pad(part), normalized=False))
            st = c.stats()
    finally:
        s.stop()
    assert st["model"]["evaluator"] == "native" and st["config"]["evaluator"] == "auto"
    assert st["model"]["kernels"] == native.kernels()
    assert f"the C++ evaluator ({native.kernels()} kernels)" in startup_message(engine, "h", 1)
    hc = st["history_cache"]
    assert hc["capacity"] == 16384 and hc["hits"] > 0 and hc["hits"] + hc["misses"] == 2 * len(grams) + 70


@built
def test_a_server_with_int8_layers_answers_as_the_int8_evaluator(model_dir):  # noqa: F811
    """`cslm serve --self-normalized --precision int8`: the C++ evaluator with its layers after the first in
    8 bits (cslm_local.h, "Precision"), its answers that evaluator's, near float32's but not equal, the
    precision named in STATS and on the startup line; torch or exact scores with int8 are refused in one
    line."""
    out, _, _ = model_dir
    engine = Engine.load(str(out), device="cpu", normalized=False)
    int8, fp32 = native.NativeModel(str(out), 0, precision="int8"), native.NativeModel(str(out), 0)
    s = ServerThread(engine, cache_size=0, precision="int8")
    try:
        grams = random_ngrams(engine, 300, 7, seed=4)
        with Client("127.0.0.1", s.port) as c:
            got = c.score(grams)[0]
            st = c.stats()
    finally:
        s.stop()
    rows = engine.pad(grams)
    assert np.array_equal(got, int8.score(rows, normalized=False))
    diff = np.abs(got - fp32.score(rows, normalized=False))
    assert 0 < diff.max() < 0.1
    assert st["model"]["precision"] == "int8" and st["config"]["precision"] == "int8"
    assert f"({native.kernels()} kernels, int8 layers after the first)" in startup_message(engine, "h", 1)
    with pytest.raises(UserError, match="--precision int8 is the C\\+\\+ evaluator's"):
        ServerThread(engine, precision="int8", evaluator="torch")
    with pytest.raises(UserError, match="--precision int8 does not apply"):
        Engine.load(str(out), device="cpu").use_evaluator("auto", None, "int8")
    with pytest.raises(UserError, match="precision int4: not fp32 or int8"):
        native.NativeModel(str(out), 0, precision="int4")


@built
def test_the_precision_benchmark_compares_int8_with_fp32(model_dir, tmp_path):  # noqa: F811
    """benchmarks/bench_cslm_precision.py on a small text: the score differences, both perplexities and both
    speeds, in its JSON report."""
    out, _, corpus = model_dir
    bench = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_cslm_precision.py"
    r = subprocess.run([sys.executable, str(bench), str(out), "--text", str(corpus), "--sentences", "20",
                        "--seconds", "0.05", "--repeats", "1", "--json", str(tmp_path / "r.json")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["ngrams"] > 20 and 0 < report["abs_diff_selfnorm"]["max"] < 0.1
    assert report["kernels"] == native.kernels()
    assert abs(report["ppl_ratio_int8_over_fp32"] - 1) < 0.01
    assert report["ngrams_per_s"]["fp32"] > 0 and report["ngrams_per_s"]["int8"] > 0
    assert set(report["resident_mib"]) == {"fp32", "int8"}


@built
def test_the_evaluator_names_its_kernels_within_the_cap():
    """native.kernels(): the CPU's widest, at most what CSLM_KERNELS names (read once per process); a name it
    does not know is a one-line error."""
    def run(cap: str) -> subprocess.CompletedProcess:
        code = "from cslm import native; from mtcommon.errors import UserError\n" \
               "try: print(native.kernels())\nexcept UserError as e: print('error:', e)"
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "CSLM_KERNELS": cap})
    widest = native.kernels()
    assert widest in ("amx", "avx512", "avx2", "baseline")
    assert run("").stdout.strip() == widest
    assert run("baseline").stdout.strip() == "baseline"
    assert run("avx512").stdout.strip() != "amx"
    assert run("sse9").stdout.strip() == \
        "error: CSLM_KERNELS=sse9: not amx, avx512, avx2 or baseline (unset it for the CPU's widest)"


@built
@pytest.mark.parametrize("slots, threads", [(0, 1), (7, 1), (64, 2)])
def test_int8_histories_computed_together_equal_one_at_a_time(model_dir, tmp_path, slots, threads):  # noqa: F811
    """With int8 layers a call's histories missing from the cache are computed kBatch (16) at a time, each
    layer's weights read once for all (cslm_local.h, HiddenBatch); the integer sums are exact, so every score
    equals that of its row scored alone, bit for bit (with AMX, fewer than eight go through VNNI's product):
    exact and self-normalised, without a history cache, with one small enough that rows are replaced, and with
    the cache two threads share. Layers of 300, 270 and 30 units cover whole passes of 32 and 64 outputs, the
    last 16, and inputs padded to 64."""
    from test_cslm_local import random_model

    out, loaded, _ = model_dir
    random_model(loaded, (300, 270, 30), 6, 0.1, tmp_path / "wide")
    m = native.NativeModel(str(tmp_path / "wide"), slots, threads=threads, precision="int8")
    engine = Engine.load(str(tmp_path / "wide"), device="cpu", normalized=False)
    grams = random_ngrams(engine, 203, 7, seed=11)
    grams[100:150, :-1] = grams[:50, :-1]  # histories met again, some within one batch
    grams[151:160, :-1] = grams[150, :-1]  # and in consecutive rows
    rows = engine.pad(grams)
    for normalized in (False, True):
        alone = np.concatenate([m.score(rows[i : i + 1], normalized) for i in range(len(rows))])
        together = m.score(rows, normalized)
        assert np.array_equal(together, alone), normalized
        assert np.array_equal(m.score(rows, normalized), alone)  # again, through what the cache kept
        if not slots:  # calls of 1 to 17 rows of distinct histories: batches of every size, each kernel's pass
            for k in range(1, 18):
                assert np.array_equal(m.score(rows[60 : 60 + k], normalized), alone[60 : 60 + k]), k
    fp32 = native.NativeModel(str(tmp_path / "wide"), slots, threads=threads).score(rows, False)
    assert 0 < np.max(np.abs(fp32 - m.score(rows, False))) < 0.2
