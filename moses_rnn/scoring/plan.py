"""`Planner`: the host's half of scoring phrase pairs, made without the network: which distinct sources the
encoder reads in which batches, and the decoder's prefix tree level by level, as integer arrays. `PhraseScorer`
runs a plan on its device; a plan is plain numpy and pickles, so that processes without the model (scoring
workers beside a GPU) can make the plans while the process that holds the GPU runs them.

Why the work splits this way: every index the prefix-tree decoder follows (which pairs go on, their nodes, the
nodes' parents) depends only on the word ids, never on a score, so the whole tree is known before the first
kernel runs. docs/scoring.md, "How the scorer works".
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from mtcommon.vocab import EOS, Vocabulary


def unit_ids(phrases: list[bytes], vocab: Vocabulary, end: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Id matrix [phrases, longest (+1 with `end`)] right-padded with -1 (`end` appended to every row),
    the number of units of each phrase, and how many of them map to `[UNK]`.

    `phrases` are keys as `phrasetable.Window` and `phrase_key` make them: words joined by single
    spaces, which `vocab.encode_keys` turns into units (words, or subword units)."""
    ids, lens = vocab.encode_keys(phrases)
    width = int(lens.max(initial=0)) + (end is not None)
    matrix = np.full((len(phrases), max(width, 1)), -1, dtype=np.int64)
    matrix[np.arange(matrix.shape[1])[None, :] < lens[:, None]] = ids  # row-major: phrase by phrase
    if end is not None:
        matrix[np.arange(len(phrases)), lens] = end
    unknown = np.bincount(np.repeat(np.arange(len(phrases)), lens)[ids == vocab.unk_id], minlength=len(phrases))
    return matrix, lens, unknown


@dataclass
class TreeLevel:
    """One level t of the prefix tree: its nodes (distinct (source, y_<t)) and the pairs still going on,
    grouped by node. Nodes are computed in chunks [a, a + chunk); `bounds[k]` is where chunk k's pairs
    start in `pairs` (one more entry at the end)."""

    rows: np.ndarray  # the encoder context row of each node
    tokens: np.ndarray  # y_{t-1} of each node (-1 at level 0: e(y_0) = 0)
    pairs: np.ndarray  # the pairs going on at this level, grouped by node
    pair_node: np.ndarray  # the node of each of `pairs`
    words: np.ndarray  # y_t of each of `pairs`
    bounds: list[int]
    parent: np.ndarray | None  # for each node of the next level, its node here (None: the last level)


@dataclass
class ScoringPlan:
    """Everything about scoring a list of pairs that does not need the network (`Planner.plan`)."""

    pairs: int
    encoder: list[np.ndarray]  # id matrices of distinct sources, one exact length each, in encoder order
    levels: list[TreeLevel]
    chunk: int  # decoder nodes computed together
    symbols: np.ndarray  # target symbols of each pair (units + </s>), float64
    unknown: np.ndarray  # units of source and target that map to [UNK], float64
    distinct_sources: int
    encoder_tokens: int

    @property
    def decoder_nodes(self) -> int:
        return sum(len(level.rows) for level in self.levels)


class Planner:
    """Makes `ScoringPlan`s for a model's vocabularies, encoder token budget and decoder chunk."""

    def __init__(self, src_vocab: Vocabulary, tgt_vocab: Vocabulary, token_budget: int, chunk: int):
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
        self.token_budget, self.chunk = token_budget, chunk
        self.eos = tgt_vocab.index[EOS]

    def batches(self, lengths: np.ndarray):
        """(length, member indices) batches of sources: one exact length each, under the token budget."""
        for length in np.unique(lengths).tolist():
            members = np.flatnonzero(lengths == length)
            per_batch = max(1, self.token_budget // max(length, 1))
            for i in range(0, len(members), per_batch):
                yield length, members[i : i + per_batch]

    def plan(self, sources: list[bytes], targets: list[bytes]) -> ScoringPlan:
        """The plan of scoring each (sources[i], targets[i]) pair, phrases as `phrase_key` makes them."""
        n = len(sources)
        # distinct phrases of each side, in first-seen order; pairs point at them (all C-level passes)
        src_index = dict(zip(dict.fromkeys(sources), itertools.count()))
        tgt_index = dict(zip(dict.fromkeys(targets), itertools.count()))
        pair_src = np.fromiter(map(src_index.__getitem__, sources), dtype=np.int64, count=n)
        pair_tgt = np.fromiter(map(tgt_index.__getitem__, targets), dtype=np.int64, count=n)
        S, src_len, src_unk = unit_ids(list(src_index), self.src_vocab)
        T, tgt_len, tgt_unk = unit_ids(list(tgt_index), self.tgt_vocab, end=self.eos)
        # each distinct source is encoded once; its context row is its place in encoder order
        encoder, order = [], []
        for length, members in self.batches(src_len):
            encoder.append(np.ascontiguousarray(S[members, :length]))  # one exact length: no padding
            order.append(members)
        row_of = np.empty(len(S), dtype=np.int64)
        if order:
            row_of[np.concatenate(order)] = np.arange(len(S))
        levels = self._tree(row_of[pair_src], T[pair_tgt]) if n else []
        return ScoringPlan(n, encoder, levels, self.chunk, (tgt_len + 1)[pair_tgt].astype(np.float64),
                           (src_unk[pair_src] + tgt_unk[pair_tgt]).astype(np.float64), len(src_index),
                           int(src_len.sum()))

    def _tree(self, pair_row: np.ndarray, Y: np.ndarray) -> list[TreeLevel]:
        """The prefix tree of the pairs' targets (rows of Y, -1 padded, ending in </s>), level by level.

        The decoder state and the output distribution at step t depend only on the source and y_<t, so they
        are computed once per distinct (source, prefix): a node. Targets of one source often share their
        first words ("de la ...", "le ..."), so the tree has fewer nodes than the targets have words."""
        V, chunk, levels = len(self.tgt_vocab), self.chunk, []
        # level 0: one node per distinct source; pairs point at their node
        node_row, node_of_pair = np.unique(pair_row, return_inverse=True)
        node_tok = np.full(len(node_row), -1, dtype=np.int64)
        active = np.arange(len(Y))
        for t in range(Y.shape[1]):
            nodes = len(node_row)
            by_node = active[np.argsort(node_of_pair[active], kind="stable")]  # the pairs, grouped by node
            pair_node = node_of_pair[by_node]
            bounds = np.searchsorted(pair_node, list(range(0, nodes, chunk)) + [nodes]).tolist()
            level = TreeLevel(node_row, node_tok, by_node, pair_node, Y[by_node, t], bounds, None)
            levels.append(level)
            # children: (node, y_t) for the pairs that go on after y_t
            y = Y[active, t]
            going_on = y != self.eos
            active = active[going_on]
            if len(active) == 0:
                break
            key = node_of_pair[active] * V + y[going_on]
            uniq, node_of_child = np.unique(key, return_inverse=True)
            level.parent = uniq // V
            node_of_pair[active] = node_of_child
            node_row, node_tok = node_row[level.parent], uniq % V
        return levels
