"""cslm.ngram_cache: the server's n-gram cache finds what it holds, only that, and keeps each set's last WAYS."""

from __future__ import annotations

import numpy as np
import pytest

from cslm.ngram_cache import WAYS, NgramCache


def _rows(n: int, seed: int, width: int = 7) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 50_000, size=(n, width), dtype=np.int32)


def _fill(cache: NgramCache, rows: np.ndarray, logp: np.ndarray) -> None:
    found, _, _, hashes = cache.lookup(rows)
    miss = np.flatnonzero(~found)
    cache.insert(rows[miss], hashes[miss], logp[miss], (miss % 3).astype(np.uint8))


def test_finds_what_it_holds_with_its_scores_and_nothing_else():
    cache = NgramCache(100_000)
    rows, logp = _rows(5_000, 1), -np.arange(5_000, dtype=np.float32) / 7
    _fill(cache, rows, logp)
    assert len(cache) == 5_000 and cache.slots >= 100_000
    probe = np.concatenate([rows[::3], _rows(1_000, 2)])
    found, got, flags, _ = cache.lookup(probe)
    held = np.arange(0, 5_000, 3)
    assert found[: len(held)].all() and not found[len(held):].any()
    assert np.array_equal(got[: len(held)], logp[held]) and np.array_equal(flags[: len(held)], held % 3)


def test_a_hash_collision_is_not_a_hit_and_a_set_keeps_its_last_ways():
    cache = NgramCache(64)
    rows = _rows(WAYS + 3, 3)
    cache.lookup(rows[:1])  # sets the width and the multipliers
    cache.mult[:] = 0  # every row now hashes alike: one set, told apart by the ids alone
    logp = np.arange(len(rows), dtype=np.float32)
    found, _, _, hashes = cache.lookup(rows[: WAYS + 2])
    assert not found.any()
    cache.insert(rows[: WAYS + 2], hashes, logp[: WAYS + 2], np.zeros(WAYS + 2, np.uint8))
    found, got, _, _ = cache.lookup(rows)
    assert found.tolist() == [False, False] + [True] * WAYS + [False]  # the last WAYS of the insert stayed
    assert np.array_equal(got[2: WAYS + 2], logp[2: WAYS + 2])
    _, _, _, h = cache.lookup(rows[-1:])
    cache.insert(rows[-1:], h, logp[-1:], np.zeros(1, np.uint8))  # the next slot in turn: the oldest goes
    found, _, _, _ = cache.lookup(rows)
    assert found.tolist() == [False, False, False] + [True] * WAYS
    assert len(cache) == WAYS


@pytest.mark.parametrize("capacity", [1, 3, 4, 5])
def test_small_capacities_hold_at_least_what_was_asked(capacity):
    cache = NgramCache(capacity)
    rows = _rows(capacity, 4)
    _fill(cache, rows, np.zeros(capacity, np.float32))
    assert cache.slots >= capacity
    # rows spread over sets by hash: all held when they fit their sets, and never more than inserted
    assert len(cache) <= capacity and cache.lookup(rows)[0].sum() == len(cache)


def test_rows_of_another_width_are_refused():
    cache = NgramCache(16)
    cache.lookup(_rows(2, 5))
    with pytest.raises(ValueError, match="width 5"):
        cache.lookup(_rows(2, 6, width=5))
    with pytest.raises(ValueError, match="capacity"):
        NgramCache(0)


def test_the_cache_benchmark_reports_a_full_cache(tmp_path):
    """benchmarks/bench_server_cache.py runs and reports each quarter's time, the cache full at the end."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
    subprocess.run([sys.executable, str(root / "benchmarks" / "bench_server_cache.py"), "--capacity", "1000",
                    "--request", "100", "--requests", "40", "--json", str(tmp_path / "r.json")],
                   env=env, check=True, capture_output=True, timeout=120)
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["requests"] == 40 and 0 <= report["hit_fraction"] < 0.05
    assert 900 <= report["held_at_end"] <= 1024  # 4,000 n-grams through 256 sets of 4
    assert 0 < report["ms_per_request_first_quarter"] <= report["ms_per_request_max"]
