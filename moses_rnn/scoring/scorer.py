"""`PhraseScorer`: log p(target | source) of phrase pairs, each distinct source encoded once and the targets
decoded along a prefix tree.

How the scorer is fast, why a pair's score does not depend on its batch, and the bfloat16 path:
docs/scoring.md, "How the scorer works".
"""

from __future__ import annotations

import itertools
from typing import NamedTuple, Sequence

import numpy as np
import torch

from mtcommon.runtime import amp_dtype, autocast, dtype_name, probe_dtype, resolve_device
from mtcommon.vocab import EOS, Vocabulary

from ..formats.phrasetable import phrase_key
from ..networks.modelbase import log_normalizer_
from ..networks.modelio import LoadedModel, load_model
from .bf16 import bfloat16_copy

# Logits computed at once (rows x shortlist) by the prefix-tree decoder: on a CPU a block that stays in a core's
# L2 cache for the max / exp / sum passes of the in-place normaliser, on a GPU one large enough to fill it. Never
# fewer than 512 rows, so that large shortlists still get matrix products of useful size.
LOGIT_BLOCK = {"cpu": 1 << 18, "cuda": 1 << 26}


def default_node_chunk(device: torch.device, vocab_size: int) -> int:
    """Decoder nodes (rows of the softmax) computed together on `device` for this shortlist size."""
    return max(512, LOGIT_BLOCK.get(device.type, LOGIT_BLOCK["cpu"]) // max(vocab_size, 1))


def phrase_keys(pairs: Sequence[tuple[str, str]]) -> tuple[list[bytes], list[bytes]]:
    """(sources, targets) of (source, target) pairs of str, as `PhraseScorer.score_keys` takes them."""
    return [phrase_key(s) for s, _ in pairs], [phrase_key(t) for _, t in pairs]


class PhraseScores(NamedTuple):
    """What `PhraseScorer.score_keys` gives for each pair, float64 arrays of one value a pair."""

    log_p: np.ndarray  # log p(target | source), natural log
    symbols: np.ndarray  # target symbols scored: units + </s>
    unknown: np.ndarray  # units of source and target that map to [UNK]

    def columns(self, normalize: bool = False, unknown: bool = False) -> np.ndarray:
        """Log-domain feature columns [pairs, 1 or 2]: log p (per symbol with `normalize`), then with
        `unknown` the count of units outside the shortlists."""
        cols = [self.log_p / self.symbols if normalize else self.log_p]
        if unknown:
            cols.append(self.unknown)
        return np.stack(cols, axis=1)


def _unit_ids(phrases: list[bytes], vocab: Vocabulary,
              end: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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


# Pairs of a table's first window that `--dtype auto` times its scoring on (`PhraseScorer.choose_dtype`): a
# call of a fraction of a second for the `paper` preset on a CPU core, so that the probe stays within its budget.
PROBE_PAIRS = 512


class PhraseScorer:
    """A loaded model that scores phrase pairs: `score` for (source, target) pairs of str, `score_keys` for
    phrases as a table window holds them; in float32, or in bfloat16 with `dtype` 'bf16' (or 'auto' where it
    chooses so)."""

    def __init__(self, loaded: LoadedModel, token_budget: int = 16384, model_dir: str | None = None,
                 node_chunk: int | None = None, dtype: str = "fp32"):
        self.model_dir = model_dir  # lets worker processes load the same model
        self.src_vocab, self.tgt_vocab = loaded.src_vocab, loaded.tgt_vocab
        model = loaded.model.eval()
        self.device = next(model.parameters()).device
        # 'fp32' | 'bf16'; 'auto' until the first pairs are scored (`choose_dtype`), float32 meanwhile
        self.dtype = dtype
        self.amp = None if dtype == "auto" else amp_dtype(self.device, dtype)  # None: float32
        self.model = model if self.amp is None else bfloat16_copy(model)
        self.token_budget = token_budget
        self.node_chunk = node_chunk or default_node_chunk(self.device, len(self.tgt_vocab))
        self.eos = self.tgt_vocab.index[EOS]
        self.distinct_sources = 0  # running counts over all calls, for reports and benchmarks
        self.encoder_tokens = 0
        self.decoder_nodes = 0

    @classmethod
    def from_dir(cls, model_dir: str, device: str = "auto", **kw) -> "PhraseScorer":
        return cls(load_model(model_dir, resolve_device(device)), model_dir=model_dir, **kw)

    @property
    def compute_dtype(self) -> str:
        return dtype_name(self.amp)

    def choose_dtype(self, sources: list[bytes], targets: list[bytes], quiet: bool = False, combine=None) -> None:
        """Settle `--dtype auto` (`runtime.probe_dtype`; `combine` as there), once: on a CPU with native
        bfloat16, by timing the scoring of the first `PROBE_PAIRS` of these pairs with the float32 model
        and with its bfloat16 copy. The probe's scores are dropped and the running counts left as they
        were, so what follows is what a scorer made with the chosen dtype gives."""
        if self.dtype != "auto":
            return
        sample = sources[:PROBE_PAIRS], targets[:PROBE_PAIRS]
        models, counts = {None: self.model}, (self.distinct_sources, self.encoder_tokens, self.decoder_nodes)

        def step(amp: torch.dtype | None) -> None:
            if amp not in models:  # in the untimed warm-up call
                models[amp] = bfloat16_copy(models[None])
            self.amp, self.model = amp, models[amp]
            self._scores(*sample)

        amp = probe_dtype(self.device, self.dtype, step, what=f"scoring {len(sample[0])} pairs", quiet=quiet,
                          combine=combine)
        self.amp, self.model = amp, models[amp] if amp in models else bfloat16_copy(models[None])
        self.dtype = dtype_name(amp)  # what worker processes are given
        self.distinct_sources, self.encoder_tokens, self.decoder_nodes = counts

    def _upload(self, array: np.ndarray) -> torch.Tensor:
        """A host array on the scoring device: pinned and copied asynchronously on CUDA (the copy
        queues behind the kernels already launched instead of waiting for them)."""
        t = torch.from_numpy(np.ascontiguousarray(array))
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t

    def _batches(self, lengths: np.ndarray):
        """(length, member indices) batches of sources: one exact length each, under the token budget."""
        for length in np.unique(lengths).tolist():
            members = np.flatnonzero(lengths == length)
            per_batch = max(1, self.token_budget // max(length, 1))
            for i in range(0, len(members), per_batch):
                yield length, members[i : i + per_batch]

    def score(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """log p(target | source) of each (source, target) pair of str, float64 [len(pairs)]."""
        return self.score_keys(*phrase_keys(pairs)).log_p

    def score_keys(self, sources: list[bytes], targets: list[bytes]) -> PhraseScores:
        """The scores of each (sources[i], targets[i]) pair, phrases given as `phrase_key` makes them (a
        `phrasetable.Window`'s sources and targets). The first call settles `--dtype auto` on its own pairs."""
        if self.dtype == "auto":
            self.choose_dtype(sources, targets)
        return self._scores(sources, targets)

    @torch.inference_mode()
    def _scores(self, sources: list[bytes], targets: list[bytes]) -> PhraseScores:
        """`score_keys` in the scorer's current dtype."""
        n = len(sources)
        if n == 0:
            return PhraseScores(np.zeros(0), np.zeros(0), np.zeros(0))
        # distinct phrases of each side, in first-seen order; pairs point at them (all C-level passes)
        src_index = dict(zip(dict.fromkeys(sources), itertools.count()))
        tgt_index = dict(zip(dict.fromkeys(targets), itertools.count()))
        pair_src = np.fromiter(map(src_index.__getitem__, sources), dtype=np.int64, count=n)
        pair_tgt = np.fromiter(map(tgt_index.__getitem__, targets), dtype=np.int64, count=n)
        S, src_len, src_unk = _unit_ids(list(src_index), self.src_vocab)
        T, tgt_len, tgt_unk = _unit_ids(list(tgt_index), self.tgt_vocab, end=self.eos)
        self.distinct_sources += len(src_index)
        self.encoder_tokens += int(src_len.sum())
        with autocast(self.device, self.amp):
            ctx, row_of = self._encode(S, src_len)
            lp = self._decode_prefix_tree(ctx, row_of[pair_src], T[pair_tgt])
        symbols = (tgt_len + 1)[pair_tgt].astype(np.float64)
        return PhraseScores(lp, symbols, (src_unk[pair_src] + tgt_unk[pair_tgt]).astype(np.float64))

    def _encode(self, S: np.ndarray, lengths: np.ndarray):
        """The decoder context of each distinct source (rows of S), and the context row of each."""
        contexts, order = [], []
        for length, members in self._batches(lengths):
            src = self._upload(S[members, :length])  # one exact length: no padding
            contexts.append(self.model.context(src, torch.ones_like(src, dtype=torch.bool)))
            order.append(members)
        row_of = np.empty(len(S), dtype=np.int64)
        row_of[np.concatenate(order)] = np.arange(len(S))
        return type(contexts[0]).cat(contexts), row_of

    def _decode_prefix_tree(self, ctx, pair_row: np.ndarray, Y: np.ndarray) -> np.ndarray:
        """Sum of log p(y_t | y_<t, source) for each pair (row of Y, -1 padded, ending in </s>).

        The decoder state and the output distribution at step t depend only on
        the source and y_<t, so they are computed once per distinct
        (source, prefix): the nodes of a prefix tree, visited level by level.
        Targets of one source often share their first words ("de la ...",
        "le ..."), so the tree has fewer nodes than the targets have words
        (docs/scoring.md). Nodes never mix: a pair's score is the same
        whichever pairs share the call.

        The tree's bookkeeping (which pairs go on, their children) is numpy on
        the host; each level's indices go to the device in one transfer and the
        log-probabilities are summed there, so a GPU is never waited for until
        the end.
        """
        model, V, chunk = self.model, len(self.tgt_vocab), self.node_chunk
        embed = model.target_embeddings()
        out = torch.zeros(len(Y), dtype=torch.float64, device=self.device)
        # level 0: one node per distinct source; pairs point at their node
        node_row, node_of_pair = np.unique(pair_row, return_inverse=True)
        node_tok = np.full(len(node_row), -1, dtype=np.int64)  # e(y_0) = 0
        state = model.start_state(ctx.select(self._upload(node_row)))
        active = np.arange(len(Y))
        for t in range(Y.shape[1]):
            nodes = len(node_row)
            self.decoder_nodes += nodes
            by_node = active[np.argsort(node_of_pair[active], kind="stable")]  # the pairs, grouped by node
            pair_node = node_of_pair[by_node]
            firsts = list(range(0, nodes, chunk))
            bounds = np.searchsorted(pair_node, firsts + [nodes]).tolist()
            rows_d, tok_d = self._upload(node_row), self._upload(node_tok)
            pair_d, node_d, word_d = self._upload(by_node), self._upload(pair_node), self._upload(Y[by_node, t])
            states = []
            for k, a in enumerate(firsts):
                b, p, q = min(a + chunk, nodes), bounds[k], bounds[k + 1]
                tok = tok_d[a:b]
                e_prev = embed(tok.clamp(min=0)) * (tok >= 0)[:, None]
                logits, s = model.step(ctx.select(rows_d[a:b]), state[a:b], e_prev)
                states.append(s)
                local = node_d[p:q] - a
                picked = logits[local, word_d[p:q]]
                out.index_add_(0, pair_d[p:q], (picked - log_normalizer_(logits)[local]).double())
            # children: (node, y_t) for the pairs that go on after y_t
            y = Y[active, t]
            going_on = y != self.eos
            active = active[going_on]
            if len(active) == 0:
                break
            key = node_of_pair[active] * V + y[going_on]
            uniq, node_of_child = np.unique(key, return_inverse=True)
            parent = uniq // V
            node_of_pair[active] = node_of_child
            node_row, node_tok = node_row[parent], uniq % V
            state = torch.cat(states)[self._upload(parent)]
        return out.cpu().numpy()

