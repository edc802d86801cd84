"""`PhraseScorer`: log p(target | source) of phrase pairs, each distinct source encoded once and the targets
decoded along a prefix tree.

How the scorer is fast, why a pair's score does not depend on its batch, and the bfloat16 path:
docs/scoring.md, "How the scorer works".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np
import torch

from mtcommon.runtime import amp_dtype, autocast, download, dtype_name, probe_dtype, resolve_device, upload

from ..formats.phrasetable import phrase_key
from ..networks.modelbase import log_normalizer_
from ..networks.modelio import LoadedModel, load_model
from .bf16 import bfloat16_copy
from .plan import Planner, ScoringPlan

@dataclass(frozen=True)
class Sizes:
    """How much the scorer does at once on a device (`device_sizes`)."""

    window: int  # table lines read, planned and scored together (`table.score_table`'s default)
    token_budget: int  # source words per encoder batch (rows x width)
    logit_block: int  # logits computed at once by the prefix-tree decoder (nodes x shortlist)

    def node_chunk(self, vocab_size: int) -> int:
        """Decoder nodes (rows of the softmax) computed together for this shortlist size: a logit block's
        worth, and never fewer than 512 rows, so that large shortlists still get matrix products of useful
        size."""
        return max(512, self.logit_block // max(vocab_size, 1))


# On a CPU the time is arithmetic: a logit block stays in a core's L2 cache for the max / exp / sum passes of
# the in-place normaliser.
CPU_SIZES = Sizes(window=8192, token_budget=16384, logit_block=1 << 18)
# On a GPU much of it is the host's: every kernel is launched from Python, so fewer and larger ones. For the
# `paper` preset on the shared table, 0.030 device operations a line on an 80 GB GPU instead of 0.163 with a
# CPU's window and token budget (docs/scoring.md, "The GPU path"). These are the sizes for a 16 GB GPU;
# `gpu_sizes` scales them with the device's memory.
GPU_SIZES = Sizes(window=65536, token_budget=65536, logit_block=1 << 26)


def gpu_sizes(memory: int) -> Sizes:
    """`GPU_SIZES` for a GPU of `memory` bytes: the token budget and logit block times the power of two nearest
    below memory / 15 GiB (a card sold as 16 GB holds a little less than 16 GiB), from 1/2 to 4: 1/2 for 8
    and 12 GB cards, 1 for 16 and 24 GB, 2 for 32 to 48 GB, 4 for 80 GB and more. The window is halved on
    the cards of 1/2, never grown."""
    scale = 2.0 ** min(2, max(-1, math.floor(math.log2(max(memory, 1) / (15 << 30)))))
    # the window only down: its distinct sources' encoder contexts stay on the GPU; with the `paper` RNNsearch
    # a window of 65,536 lines of the shared table holds up to 43,524 sources x 7 positions x 3,000 floats of
    # annotations and keys, about 3.6 GB
    return Sizes(window=int(GPU_SIZES.window * min(scale, 1)), token_budget=int(GPU_SIZES.token_budget * scale),
                 logit_block=int(GPU_SIZES.logit_block * scale))


def device_sizes(device: torch.device) -> Sizes:
    """The sizes the scorer uses on `device`: `CPU_SIZES`, or a CUDA device's `gpu_sizes`."""
    if device.type != "cuda":
        return CPU_SIZES
    index = device.index if device.index is not None else torch.cuda.current_device()
    return gpu_sizes(torch.cuda.get_device_properties(index).total_memory)


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


# Pairs of a table's first window that `--dtype auto` times its scoring on (`PhraseScorer.choose_dtype`): a
# call of a fraction of a second for the `paper` preset on a CPU core, so that the probe stays within its budget.
PROBE_PAIRS = 512


class PhraseScorer:
    """A loaded model that scores phrase pairs: `score` for (source, target) pairs of str, `score_keys` for
    phrases as a table window holds them; in float32, or in bfloat16 with `dtype` 'bf16' (or 'auto' where it
    chooses so)."""

    def __init__(self, loaded: LoadedModel, token_budget: int | None = None, model_dir: str | None = None,
                 node_chunk: int | None = None, dtype: str = "fp32", sizes: Sizes | None = None):
        self.model_dir = model_dir  # lets worker processes load the same model
        self.src_vocab, self.tgt_vocab = loaded.src_vocab, loaded.tgt_vocab
        model = loaded.model.eval()
        self.device = next(model.parameters()).device
        # 'fp32' | 'bf16'; 'auto' until the first pairs are scored (`choose_dtype`), float32 meanwhile
        self.dtype = dtype
        self.amp = None if dtype == "auto" else amp_dtype(self.device, dtype)  # None: float32
        self.model = model if self.amp is None else bfloat16_copy(model)
        # unless given: the device's (`device_sizes`); `sizes.window` is what `score_table` reads by default
        self.sizes = sizes or device_sizes(self.device)
        self.token_budget = token_budget or self.sizes.token_budget
        self.node_chunk = node_chunk or self.sizes.node_chunk(len(self.tgt_vocab))
        self.planner = Planner(self.src_vocab, self.tgt_vocab, self.token_budget, self.node_chunk)
        self.eos = self.planner.eos
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

    def score(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """log p(target | source) of each (source, target) pair of str, float64 [len(pairs)]."""
        return self.score_keys(*phrase_keys(pairs)).log_p

    def score_keys(self, sources: list[bytes], targets: list[bytes]) -> PhraseScores:
        """The scores of each (sources[i], targets[i]) pair, phrases given as `phrase_key` makes them (a
        `phrasetable.Window`'s sources and targets). The first call settles `--dtype auto` on its own pairs."""
        if self.dtype == "auto":
            self.choose_dtype(sources, targets)
        return self._scores(sources, targets)

    def _scores(self, sources: list[bytes], targets: list[bytes]) -> PhraseScores:
        """`score_keys` in the scorer's current dtype: the host's plan (`plan.Planner`), run on the device."""
        plan = self.planner.plan(sources, targets)
        return PhraseScores(self.run(plan), plan.symbols, plan.unknown)

    @torch.inference_mode()
    def run(self, plan: ScoringPlan) -> np.ndarray:
        """log p(target | source) of each pair of `plan` (made by a `Planner` with this scorer's vocabularies,
        token budget and chunk, in this process or another), float64. Every index array of the plan goes to
        the device in one transfer; the device is waited for only at the end."""
        if plan.chunk != self.node_chunk:
            raise ValueError(f"a plan made for chunks of {plan.chunk} decoder nodes, not {self.node_chunk}")
        self.distinct_sources += plan.distinct_sources
        self.encoder_tokens += plan.encoder_tokens
        self.decoder_nodes += plan.decoder_nodes
        if plan.pairs == 0:
            return np.zeros(0)
        fields = ("rows", "tokens", "pairs", "pair_node", "words")
        arrays = plan.encoder + [getattr(level, f) for level in plan.levels for f in fields]
        arrays += [level.parent for level in plan.levels if level.parent is not None]
        on_device = iter(upload(arrays, self.device))
        encoder = [next(on_device) for _ in plan.encoder]
        levels = [dict(zip(fields, (next(on_device) for _ in fields))) for _ in plan.levels]
        parents = list(on_device)
        with autocast(self.device, self.amp):
            contexts = [self.model.context(src, torch.ones_like(src, dtype=torch.bool)) for src in encoder]
            ctx = type(contexts[0]).cat(contexts)  # row r: the r-th distinct source in encoder order
            return self._decode_prefix_tree(ctx, plan, levels, parents)

    def _decode_prefix_tree(self, ctx, plan: ScoringPlan, levels: list[dict], parents: list[torch.Tensor]) -> np.ndarray:
        """Sum of log p(y_t | y_<t, source) for each pair of `plan`, its prefix tree's nodes computed level by
        level (`plan.Planner._tree`), `plan.chunk` nodes at a time. Nodes never mix: a pair's score is the same
        whichever pairs share the call. `levels` and `parents` are the plan's arrays on the device."""
        model, chunk = self.model, plan.chunk
        embed = model.target_embeddings()
        out = torch.zeros(plan.pairs, dtype=torch.float64, device=self.device)
        state = model.start_state(ctx.select(levels[0]["rows"]))
        for t, (host, level) in enumerate(zip(plan.levels, levels)):
            nodes, bounds, states = len(host.rows), host.bounds, []
            for k, a in enumerate(range(0, nodes, chunk)):
                b, p, q = min(a + chunk, nodes), bounds[k], bounds[k + 1]
                tok = level["tokens"][a:b]
                e_prev = embed(tok.clamp(min=0)) * (tok >= 0)[:, None]  # e(y_0) = 0
                logits, s = model.step(ctx.select(level["rows"][a:b]), state[a:b], e_prev)
                states.append(s)
                local = level["pair_node"][p:q] - a
                picked = logits[local, level["words"][p:q]]
                out.index_add_(0, level["pairs"][p:q], (picked - log_normalizer_(logits)[local]).double())
            if host.parent is not None:
                state = torch.cat(states)[parents[t]]
        return download(out)
