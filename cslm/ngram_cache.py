"""The server's n-gram cache: scores of padded n-grams (rows of word ids) already computed, looked up and filled
a whole request at a time with array operations.

A dictionary keyed by each n-gram's bytes costs about 1 us of Python per n-gram, and its FIFO eviction rescans
the deleted front of the dictionary, so a full cache of a million n-grams cost 2.5 ms per request of 620
(docs/cslm.md, "Server"): more than a GPU takes to compute them. Here the cache is a set-associative table: an
n-gram's 64-bit hash picks one set of WAYS slots, the n-gram is found by its hash among the set's and confirmed
by comparing its ids (so a hit is never a different n-gram), and a new one takes its set's next slot in turn
(FIFO within the set). Every step is a NumPy operation over the request's rows.
"""

from __future__ import annotations

import numpy as np

WAYS = 4  # slots per set
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: the top bits of h * 2^64/phi pick the set


class NgramCache:
    """At least `capacity` n-grams (the table rounds its sets up to a power of two), rows of one width (the
    first rows it sees set it). `lookup` then `insert` the misses; not thread-safe (the batcher calls one at a
    time)."""

    def __init__(self, capacity: int):
        if capacity <= 0:
            raise ValueError("an n-gram cache needs a capacity > 0")
        self.bits = max(0, int(np.ceil(np.log2(max(1, -(-capacity // WAYS))))))
        self.sets = 1 << self.bits
        self.width = 0
        # by slot, set k's WAYS slots at k * WAYS ...
        self.keys: np.ndarray | None = None  # (slots, width) int32
        self.logp = np.zeros(self.slots, np.float32)
        self.flags = np.zeros(self.slots, np.uint8)
        self.hashes = np.zeros(self.slots, np.uint64)  # 0: an empty slot
        self.next = np.zeros(self.sets, np.int64)  # the way each set fills next
        self.mult: np.ndarray | None = None

    @property
    def slots(self) -> int:
        return self.sets * WAYS

    def __len__(self) -> int:
        """N-grams held."""
        return int(np.count_nonzero(self.hashes))

    def _hash(self, rows: np.ndarray) -> np.ndarray:
        """A 64-bit hash of each row (never 0, which marks an empty slot)."""
        if self.keys is None:
            self.width = rows.shape[1]
            self.keys = np.zeros((self.slots, self.width), np.int32)
            # odd 64-bit multipliers, one per position: h = (sum_i id_i * m_i) * golden (mod 2^64)
            self.mult = np.random.default_rng(0x5EED).integers(1, 2**63, self.width, dtype=np.uint64) | np.uint64(1)
        elif rows.shape[1] != self.width:
            raise ValueError(f"n-grams of width {rows.shape[1]} in a cache of width {self.width}")
        h = (rows.astype(np.uint64) * self.mult).sum(axis=1, dtype=np.uint64) * _GOLDEN
        h |= np.uint64(1)  # odd: never the empty mark
        return h

    def lookup(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(found, log-probs, flags, hashes) for int32 `rows` (n, width): log-probs and flags are filled where
        `found`; `hashes` is for `insert`."""
        h = self._hash(rows)
        sets = (h >> np.uint64(64 - self.bits)).astype(np.intp) if self.bits else np.zeros(len(rows), np.intp)
        same = self.hashes.reshape(self.sets, WAYS)[sets] == h[:, None]  # (n, WAYS): candidates, ids to confirm
        cand = np.flatnonzero(same.any(axis=1))
        first = sets[cand] * WAYS
        ways = self.keys[first[:, None] + np.arange(WAYS)]  # (candidates, WAYS, width)
        real = same[cand] & (ways == rows[cand][:, None, :]).all(axis=2)  # the same n-gram, not only the same hash
        hit = real.any(axis=1)
        cand, slot = cand[hit], first[hit] + real[hit].argmax(axis=1)
        found = np.zeros(len(rows), bool)
        found[cand] = True
        logp = np.empty(len(rows), np.float32)
        flags = np.empty(len(rows), np.uint8)
        logp[cand] = self.logp[slot]
        flags[cand] = self.flags[slot]
        return found, logp, flags, h

    def insert(self, rows: np.ndarray, hashes: np.ndarray, logp: np.ndarray, flags: np.ndarray) -> None:
        """Keep `rows` (their `hashes` from `lookup`) with their scores, each in its set's next slot; where more
        than WAYS of them share a set, the last WAYS stay."""
        n = len(rows)
        if not n:
            return
        sets = (hashes >> np.uint64(64 - self.bits)).astype(np.intp) if self.bits else np.zeros(n, np.intp)
        order = np.argsort(sets, kind="stable")
        s = sets[order]
        first = np.empty(n, bool)
        first[0] = True
        np.not_equal(s[1:], s[:-1], out=first[1:])
        if first.all():  # one row per set (the usual case in a large table)
            way = self.next[s]
            self.next[s] = (way + 1) % WAYS
        else:
            start = np.flatnonzero(first)  # where each set's run begins
            counts = np.diff(np.append(start, n))
            rank = np.arange(n) - np.repeat(start, counts)  # place within its set's run
            keep = rank >= np.repeat(counts, counts) - WAYS  # the last WAYS of each run
            way = (self.next[s] + rank) % WAYS
            self.next[s[start]] = (self.next[s[start]] + counts) % WAYS
            s, way, order = s[keep], way[keep], order[keep]
        slot = s * WAYS + way
        self.hashes[slot] = hashes[order]
        self.keys[slot] = rows[order]
        self.logp[slot] = logp[order]
        self.flags[slot] = flags[order]
