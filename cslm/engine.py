"""The batched scoring engine: any number of n-grams in, natural-log probabilities out.

`Engine.score_ids` is the one function the server, `cslm score`, `cslm eval`
and n-best rescoring all call: distinct histories run through the network
once, in chunks, and each n-gram gathers the output it asked for (Eq. (2):
ln P(w|h) = o_w - ln sum_r exp(o_r)). How it keeps results independent of the
batch, the self-normalised path and the two modes for unknown words:
docs/cslm.md, "Library", "What the numbers mean" and "Self-normalised scoring".
"""

from __future__ import annotations

import math
import sys
from typing import Sequence

import numpy as np
import torch

from mtcommon.errors import UserError
from mtcommon.finite import check_finite
from mtcommon.runtime import download, resolve_device, upload
from mtcommon.vocab import BOS, EOS, Vocabulary

from . import modeldir
from .data import sentence_rows
from .graphs import GraphScorer
from .ngrams import left_pad, sentence_ngrams
from .model import CSLM
from .protocol import BACKOFF, UNKNOWN  # noqa: F401 (re-exported)

LN10 = math.log(10.0)
# rows of the C++ evaluator's history cache, shared by its threads, as many as Moses's in-process mode keeps per
# decoder thread (its `history-cache`, docs/moses-feature.md): 16,384 x the last layer x 4 bytes (16 MB for `small`)
NATIVE_HISTORY_SLOTS = 16384
# Histories whose output activations (one row of V words each) the exact softmax computes at once on a CPU
# (`Engine.softmax_rows`, `_chunk`): as many as make 4 MB of float32, which stay in the cache from the product
# through ln Z to the gather (a chunk's 2,048 histories at once made 82 MB for 10,000 words, each pass over them
# from memory), but at least 256. Each block reads the output matrix (V x H) again: only a matrix of at most
# 16 MB is read in blocks (the `paper` preset's 61 MB, whose hidden layers dominate, gained nothing).
SOFTMAX_BLOCK = 1 << 20
SOFTMAX_MIN_ROWS = 256


class KenLMBackoff:
    """ln P(w | history) from a KenLM ARPA or binary model, for words outside the shortlist."""

    def __init__(self, path: str):
        try:
            import kenlm
        except ImportError:  # pragma: no cover - depends on the installation
            raise UserError("back-off mode needs the kenlm package: pip install kenlm") from None
        self._kenlm = kenlm
        self.path = path
        self.model = kenlm.Model(path)
        self.order = self.model.order

    def logprob(self, history: Sequence[str], word: str) -> float:
        """Natural-log P(word | history); a history starting with <s> starts a sentence."""
        kenlm = self._kenlm
        state, out = kenlm.State(), kenlm.State()
        h = list(history)
        if h and h[0] == BOS:
            while h and h[0] == BOS:
                h.pop(0)
            self.model.BeginSentenceWrite(state)
        else:
            self.model.NullContextWrite(state)
        for w in h[-(self.order - 1):] if self.order > 1 else []:
            self.model.BaseScore(state, w, out)
            state, out = out, state
        return self.model.BaseScore(state, word, out) * LN10  # KenLM answers log10

    def full_scores(self, words: Sequence[str]) -> list[tuple[float, bool]]:
        """(natural-log prob, is OOV for KenLM) of each word and </s>."""
        return [(lp * LN10, oov) for lp, _, oov in self.model.full_scores(" ".join(words), bos=True, eos=True)]

    def sentence_logprobs(self, words: Sequence[str]) -> np.ndarray:
        """Natural-log prob of each word and </s> of a sentence (the CSLM's tokens, in its order)."""
        return np.array([lp for lp, _ in self.full_scores(words)])


def train_self_norm(meta: dict) -> float | None:
    """The alpha of the (ln Z)^2 penalty a model was trained with (meta.train_config.self_norm), None if unknown."""
    alpha = (meta or {}).get("train_config", {}).get("self_norm")
    return float(alpha) if alpha is not None else None


def trained_self_normalized(meta: dict) -> bool:
    """Whether a model's training made its unnormalised scores o_w log-probabilities, nearly: the (ln Z)^2
    penalty (train_config.self_norm > 0) or noise-contrastive estimation (train_config.objective "nce").
    cslm/cpp/cslm_local.cc's LocalModel::self_normalized reads the same two."""
    config = (meta or {}).get("train_config", {})
    return (train_self_norm(meta) or 0.0) > 0 or config.get("objective") == "nce"


class HistoryCache:
    """The last hidden layer h of recently scored histories, in a direct-mapped table: a history met again
    costs one output row (`CSLM.output_rows`), not the network's layers. A decoder expands each hypothesis
    with many phrases whose first words share its history, in request after request; the C++ evaluator keeps
    the same kind of cache per decoder thread (cslm/cpp/cslm_local.h, `LocalModel::Scratch`).

    Each history hashes to one of `slots` rows; a row holds the last history stored there, so a lookup and
    an update are a few vectorised array operations per call, whatever the number of histories. The values
    are those the engine computed for the history in an earlier batch, so cached scores equal uncached ones
    bit for bit where the engine's results do not depend on the batch (on the CPU, docs/cslm.md "Library")."""

    def __init__(self, slots: int, context: int, width: int, device: torch.device):
        self.slots = slots
        self.keys = np.full((slots, context), -1, np.int64)  # the history in each row; -1: empty
        self.values = torch.zeros((slots, width), dtype=torch.float32, device=device)
        # odd multipliers of a multiplicative hash over the n-1 ids (fixed: the same table on every run)
        self.mult = np.random.default_rng(12345).integers(1, 1 << 62, size=context, dtype=np.int64) | 1
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return int((self.keys[:, 0] >= 0).sum())

    def features(self, histories: np.ndarray, compute) -> torch.Tensor:
        """(U, n-1) histories -> (U, width) h: the cached rows, and `compute(missed histories)` for the
        others, which then take their rows (the first of several missed histories with the same row)."""
        ids = histories.astype(np.int64)
        with np.errstate(over="ignore"):  # the hash wraps around on purpose
            mixed = (ids * self.mult).sum(axis=1)
        slot = (mixed ^ (mixed >> 29)) % self.slots  # (U,) rows; a non-negative remainder for a positive modulus
        hit = (self.keys[slot] == ids).all(axis=1)
        miss = np.flatnonzero(~hit)
        self.misses += len(miss)
        self.hits += len(ids) - len(miss)
        if not len(miss):
            return self.values[self._index(slot)]
        h = compute(np.ascontiguousarray(histories[miss]))[: len(miss)]
        found = np.flatnonzero(hit)
        rows, first = np.unique(slot[miss], return_index=True)  # one history per row
        found_at, found_slot, miss_at, rows_at, first_at = upload([found, slot[found], miss, rows, first],
                                                                  self.values.device)
        if len(found):
            out = torch.empty((len(ids), self.values.shape[1]), dtype=torch.float32, device=self.values.device)
            out[found_at] = self.values[found_slot]  # read before the rows change
            out[miss_at] = h
        else:
            out = h
        self.keys[rows] = ids[miss[first]]
        self.values[rows_at] = h[first_at]
        return out

    def _index(self, positions: np.ndarray) -> torch.Tensor:
        return upload([positions], self.values.device)[0]


class Engine:
    def __init__(self, model: CSLM, vocab: Vocabulary, device: str | torch.device = "cpu",
                 backoff: KenLMBackoff | None = None, chunk: int = 2048, normalized: bool = True,
                 name: str = "the model", src_vocab: Vocabulary | None = None):
        self.model = model.eval()
        self.name = name  # the model directory, named by the error a non-finite score raises
        self.vocab = vocab
        self.device = torch.device(device)
        self.backoff = backoff
        self.chunk = chunk
        self.normalized = normalized  # False: o_w (self-normalised scores) instead of o_w - ln Z
        self.order = model.config.order
        self.window = model.config.source_window  # m: a joint model's source words (0: a plain CSLM)
        self.src_vocab = src_vocab  # a joint model's source shortlist
        if self.window and src_vocab is None:
            raise ValueError("a joint model's engine needs its source vocabulary")
        self.bos_id, self.eos_id, self.unk_id = vocab.index[BOS], vocab.index[EOS], vocab.unk_id
        self.mode = "backoff" if backoff is not None else "unk"
        self.min_rows = max(32, 4 * torch.get_num_threads())
        V, H = model.out.out_features, model.out.in_features
        self.softmax_rows = max(SOFTMAX_MIN_ROWS, SOFTMAX_BLOCK // V) if V * H <= 4 * SOFTMAX_BLOCK else None
        self.train_self_norm: float | None = None  # alpha of the training's (ln Z)^2 penalty, if known (load())
        self.trained_self_normalized = False  # the (ln Z)^2 penalty or NCE in training (load())
        self._tables: torch.Tensor | None = None
        self.history_cache: HistoryCache | None = None  # `cache_histories`
        self.native = None  # cslm.native.NativeModel: the self-normalised path in C++ (`use_evaluator`)
        self.graphs = None  # cslm.graphs.GraphScorer: the scores on a GPU as CUDA graphs (`use_evaluator`)

    @classmethod
    def load(cls, model_dir: str, device: str = "auto", kenlm: str | None = None, chunk: int = 2048,
             normalized: bool = True) -> "Engine":
        dev = resolve_device(device)
        m = modeldir.load(model_dir, dev)
        eng = cls(m.model, m.vocab, dev, KenLMBackoff(kenlm) if kenlm else None, chunk, normalized, model_dir,
                  m.src_vocab)
        eng.train_self_norm = train_self_norm(m.meta)
        eng.trained_self_normalized = trained_self_normalized(m.meta)
        return eng

    def cache_histories(self, capacity: int) -> None:
        """Keep the last hidden layer of up to `capacity` recent histories (`HistoryCache`; 0: none). Only the
        self-normalised path uses it: the exact one needs every output row anyway."""
        cfg = self.model.config
        self.history_cache = HistoryCache(capacity, cfg.context, cfg.hidden[-1], self.device) if capacity > 0 else None

    def use_evaluator(self, evaluator: str, history_cache: int | None, precision: str = "fp32",
                      max_rows: int = 8192) -> str:
        """Who computes the scores; returns the one chosen, "native", "graphs" or "torch".

        * "native": on a CPU, the C++ evaluator of Moses's in-process mode (cslm.native): one history at a time
          (up to sixteen with int8), a call's rows shared out over as many threads as torch has, which share one cache of
          `history_cache` last hidden layers (None: NATIVE_HISTORY_SLOTS), its layers after the first in
          `precision` ("fp32", or "int8": cslm_local.h, "Precision");
        * "graphs": on a GPU, the network (self-normalised or exact) recorded as CUDA graphs over batch sizes
          up to `max_rows` (cslm.graphs), replayed with one launch a call;
        * "torch": this engine's batched path (`_chunk`, `_chunk_self_normalized`), with a `HistoryCache` of
          `history_cache` rows for self-normalised scores (None: none);
        * "auto": "native" on a CPU where the library is built, "graphs" on a GPU (unless a history cache is
          asked for, which is torch's), else "torch".

        They give the same scores within float rounding. On a CPU exact scores and a joint model (which the
        server does not serve) keep torch: a UserError if "native", "graphs" or "int8" is asked where it does
        not apply. On a GPU where "auto" finds the graphs cannot be recorded, a one-line warning and torch."""
        from . import native

        if evaluator not in ("auto", "native", "torch", "graphs"):
            raise ValueError(f"evaluator must be auto, native, graphs or torch, got {evaluator!r}")
        fits = not self.normalized and self.device.type == "cpu" and not self.joint
        gpu_fits = self.device.type == "cuda"
        needs_native = evaluator == "native" or precision != "fp32"
        if precision != "fp32" and evaluator in ("torch", "graphs"):
            raise ValueError(f"precision {precision} is the C++ evaluator's, not {evaluator}'s")
        if needs_native and not fits:
            why = "as a joint model" if self.joint else "with exact scores" if self.normalized else f"on {self.device}"
            fix = "--evaluator torch" if precision == "fp32" else f"--precision {precision} does not apply"
            raise UserError(f"the C++ evaluator computes a plain CSLM's self-normalised scores (--self-normalized) "
                            f"on a CPU; {self.name} is served {why}: {fix}")
        if evaluator == "graphs" and (not gpu_fits or history_cache):
            why = f"on {self.device}" if not gpu_fits else f"with a history cache of {history_cache} rows"
            raise UserError(f"CUDA graphs replay a model's scores on a GPU, without a history cache; {self.name} "
                            f"is served {why}: --evaluator torch")
        self.native = self.graphs = None
        if needs_native or (evaluator == "auto" and fits and native.library_path() is not None):
            model = native.NativeModel(self.name, NATIVE_HISTORY_SLOTS if history_cache is None else history_cache,
                                       torch.get_num_threads(), precision)
            if model.row_size != self.order or model.vocab_size != len(self.vocab):
                raise UserError(f"{self.name}: the C++ evaluator reads order {model.row_size} and "
                                f"{model.vocab_size} words, torch order {self.order} and {len(self.vocab)}")
            self.native, self.history_cache = model, None
            return "native"
        if evaluator == "graphs" or (evaluator == "auto" and gpu_fits and not history_cache):
            try:
                self.graphs = GraphScorer(self.model, None if self.normalized else self.tables, self.device,
                                          max_rows, name=self.name)
                self.history_cache = None
                return "graphs"
            except UserError as e:
                if evaluator == "graphs":
                    raise
                print(f"cslm: warning: {e}", file=sys.stderr)
        self.cache_histories(0 if self.normalized else history_cache or 0)  # the exact path needs every output row
        return "torch"

    @property
    def full_batch(self) -> int | None:
        """Rows of a `score_rows` call past which a larger one costs as much per row: the C++ evaluator's
        `full_rows` (it computes the histories one at a time); None for torch, whose matrix products gain
        from every row more (docs/cslm.md, "Server")."""
        return self.native.full_rows if self.native is not None else None

    @property
    def scores(self) -> str:
        """What the numbers are: "exact" (o_w - ln Z, log-probabilities) or "self-normalized" (o_w)."""
        return "exact" if self.normalized else "self-normalized"

    def self_norm_warning(self, name: str = "the model") -> str | None:
        """A one-line warning when unnormalised scores are asked of a model not trained to be self-normalised."""
        if self.normalized or self.trained_self_normalized:
            return None
        how = "without self-normalisation (self_norm = 0)" if self.train_self_norm is not None else \
            "with no recorded self_norm"
        return (f"cslm: warning: {name} was trained {how}: its unnormalised scores o_w are not log-probabilities "
                f"(ln Z is not ~0); train with --self-norm ALPHA > 0 or --objective nce for that")

    @property
    def tables(self) -> torch.Tensor:
        """The premultiplied first layer, (n-1, V, H1) float32, built on first use
        (docs/cslm.md, "Self-normalised scoring")."""
        if self._tables is None:
            with torch.no_grad():
                self._tables = self.model.first_layer_tables(torch.float32)
        return self._tables

    @property
    def joint(self) -> bool:
        return self.window > 0

    def check_source(self, given: bool) -> None:
        """A UserError unless a source is given exactly when the model has a source window."""
        if self.joint and not given:
            raise UserError(f"{self.name} is a joint model (a source window of {self.window} words): it scores a "
                            f"target text with its source text and alignment (--source, --alignment of cslm eval "
                            f"and cslm score; --source of cslm rescore-nbest)")
        if given and not self.joint:
            raise UserError(f"{self.name} is a target-only CSLM: a source text and alignment are for a joint model")

    # -- the batched core -------------------------------------------------
    def pad(self, ngrams: np.ndarray) -> np.ndarray:
        """(N, n) ids with 1 <= n <= order -> (N, order) int32, left-padded with <s>; validates ids.
        A joint model's rows are whole: (N, order + m), the target history, the source window, the word."""
        ngrams = np.asarray(ngrams)
        if self.joint:
            width = self.order + self.window
            if ngrams.ndim != 2 or ngrams.shape[1] != width:
                raise ValueError(f"a joint model's rows must be an (N, {width}) array (target history, source "
                                 f"window, target word), got shape {ngrams.shape}")
            src = ngrams[:, self.order - 1 : -1]
            if src.size and (src.min() < 0 or src.max() >= len(self.src_vocab)):
                raise ValueError(f"source word id outside the source vocabulary (0..{len(self.src_vocab) - 1})")
            tgt = np.concatenate([ngrams[:, : self.order - 1], ngrams[:, -1:]], axis=1)
        elif ngrams.ndim != 2 or not 1 <= ngrams.shape[1] <= self.order:
            raise ValueError(f"n-grams must be an (N, n) array with 1 <= n <= {self.order}, got shape {ngrams.shape}")
        else:
            tgt = ngrams
        if tgt.size and (tgt.min() < 0 or tgt.max() >= len(self.vocab)):
            raise ValueError(f"word id outside the vocabulary (0..{len(self.vocab) - 1})")
        return self.left_pad(ngrams) if not self.joint else np.ascontiguousarray(ngrams, np.int32)

    def left_pad(self, ngrams: np.ndarray) -> np.ndarray:
        """`pad` without its checks, for ids already checked (the server's SCORE requests)."""
        ngrams = ngrams.astype(np.int32, copy=False)
        if ngrams.shape[1] < self.order:
            pad = np.full((len(ngrams), self.order - ngrams.shape[1]), self.bos_id, np.int32)
            ngrams = np.concatenate([pad, ngrams], axis=1)
        return np.ascontiguousarray(ngrams)

    def score_ids(self, ngrams: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(N, n) word ids -> (N,) float32 scores, (N,) uint8 flags.

        The scores are ln P(last | previous) (exact softmax), or with `normalized=False`
        the unnormalised activations o_w of the self-normalised path."""
        return self.score_rows(self.pad(ngrams))

    def score_rows(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`score_ids` of rows already padded (`pad`, `left_pad`, `word_rows`): (N, order) int32, contiguous."""
        flags = (rows[:, -1] == self.unk_id).astype(np.uint8) * UNKNOWN
        if self.graphs is not None or (self.native is not None and not self.normalized):
            out = self.graphs.score(rows) if self.graphs is not None else self.native.score(rows, normalized=False)
            check_finite(out, self.name, lambda i: f"for n-gram {i + 1} of {len(out)}")
            return out, flags
        out = self._run(rows, self._chunk if self.normalized else self._chunk_self_normalized, 1)
        return out[:, 0], flags

    def score_ids_log_z(self, ngrams: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(N, n) word ids -> exact ln P (N,) float32, flags (N,) uint8, ln Z(history) (N,) float32.

        Always the full softmax, whatever `normalized` says; ln P + ln Z is o_w."""
        ngrams = self.pad(ngrams)
        flags = (ngrams[:, -1] == self.unk_id).astype(np.uint8) * UNKNOWN
        out = self._run(ngrams, self._chunk, 2)
        return np.ascontiguousarray(out[:, 0]), flags, np.ascontiguousarray(out[:, 1])

    def _run(self, ngrams: np.ndarray, chunk_fn, width: int) -> np.ndarray:
        """Padded (N, order) n-grams -> (N, width) float32: chunk_fn over the distinct histories; every value
        finite, else NonFiniteScores naming the model (`mtcommon.finite`), before any caller sees one."""
        res = self._run_chunks(ngrams, chunk_fn, width)
        check_finite(res, self.name, lambda i: f"for n-gram {i // width + 1} of {len(res)}")
        return res

    @torch.no_grad()
    def _run_chunks(self, ngrams: np.ndarray, chunk_fn, width: int) -> np.ndarray:
        """`_run` without its check. Each chunk_fn(histories, local, targets, width) -> (len(local), width) tensor
        on the device; the chunks' results stay there until the call's one copy back (`download`): on a GPU the
        host prepares the next chunk while the last one computes."""
        n = len(ngrams)
        if n == 0:
            return np.empty((0, width), np.float32)
        ctx = np.ascontiguousarray(ngrams[:, :-1])
        targets = ngrams[:, -1].astype(np.int64)
        if n <= self.min_rows:  # a decoder's typical request: one padded chunk either way, no de-duplication
            return download(chunk_fn(ctx, np.arange(n), targets, width))
        # Distinct histories: view each row's n-1 ids as one opaque value and sort.
        keys = ctx.view(np.dtype((np.void, ctx.dtype.itemsize * ctx.shape[1]))).ravel()
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        uniq = ctx[first]  # (U, n-1), in key order; inverse maps n-gram -> its history
        order = np.argsort(inverse, kind="stable")  # n-grams grouped by history
        bounds = np.searchsorted(inverse[order], np.arange(0, len(uniq) + self.chunk, self.chunk))
        inverse = inverse.astype(np.int64).reshape(-1)
        res = torch.empty((n, width), dtype=torch.float32, device=self.device)
        for c, start in enumerate(range(0, len(uniq), self.chunk)):
            sel = order[bounds[c] : bounds[c + 1]]
            res[upload([sel], self.device)[0]] = chunk_fn(uniq[start : start + self.chunk], inverse[sel] - start,
                                                           targets[sel], width)
        return download(res)

    def _padded(self, rows: np.ndarray) -> torch.Tensor:
        """Histories as a tensor, padded to at least min_rows rows, so that the CPU kernels sum in the same
        order whatever the batch (docs/cslm.md, "Library": results are then batch-independent)."""
        if len(rows) < self.min_rows:
            rows = np.concatenate([rows, np.repeat(rows[:1], self.min_rows - len(rows), axis=0)])
        return upload([rows], self.device)[0]

    def _chunk(self, rows: np.ndarray, local: np.ndarray, targets: np.ndarray, width: int = 1) -> torch.Tensor:
        """ln P(targets[i] | rows[local[i]]) (and ln Z, width 2) for one chunk of (n-1)-word histories, on the
        device. `local` is non-decreasing: `_run_chunks` groups the n-grams by history."""
        m = len(rows)
        h = self.model.features(self._padded(rows))  # (C, H): the hidden layers of every history at once
        local, targets = upload([local, targets], self.device)
        # On a CPU the output layer and its normaliser take the histories a block at a time (`softmax_rows`),
        # so that a block's activations stay in the cache from the product through ln Z to the gather. `local`
        # being non-decreasing, each block's n-grams are one run of them.
        step = self.softmax_rows if self.device.type == "cpu" and self.softmax_rows else len(h)
        starts = list(range(0, len(h), step))
        if len(starts) > 1 and len(h) - starts[-1] < self.min_rows:
            starts.pop()  # a last block as short as a padded chunk joins the block before it
        cuts = torch.searchsorted(local, torch.tensor(starts[1:], dtype=local.dtype, device=local.device)).tolist()
        logp, log_z = [], []
        for a, b, lo, hi in zip(starts, starts[1:] + [len(h)], [0, *cuts], [*cuts, len(local)]):
            logits = self.model.out(h[a:b]).float()  # (rows, V) activations o of the block's histories
            z = torch.logsumexp(logits[: max(0, min(b, m) - a)], dim=1)  # ln sum_r exp(o_r), Eq. (2); no padding
            at = local[lo:hi] - a
            logp.append(logits[at, targets[lo:hi]] - z[at])  # o_w - ln Z
            log_z.append(z[at])
        logp, log_z = (torch.cat(x) if len(x) > 1 else x[0] for x in (logp, log_z))
        return logp[:, None] if width == 1 else torch.stack([logp, log_z], dim=1)

    def _chunk_self_normalized(self, rows: np.ndarray, local: np.ndarray, targets: np.ndarray,
                               width: int = 1) -> torch.Tensor:
        """o_w = out.weight[w] . h + out.bias[w] for one chunk, on the device: premultiplied first layer, one
        output row each."""
        def features(histories: np.ndarray) -> torch.Tensor:  # (C, H) float32, C >= len(histories)
            return self.model.features_from_tables(self.tables, self._padded(histories))

        cache = self.history_cache
        h = features(rows) if cache is None else cache.features(rows, features)
        local, targets = upload([local, targets], self.device)
        return self.model.output_rows(h[local], targets)[:, None]

    # -- word strings -------------------------------------------------------
    def score_words(self, ngrams: Sequence[Sequence[str]]) -> tuple[np.ndarray, np.ndarray]:
        """N-grams as word lists (1..order words each); back-off applies to unknown predicted words."""
        self.check_source(False)  # target n-grams alone: no source window to give a joint model
        if not ngrams:
            return np.empty(0, np.float32), np.zeros(0, np.uint8)
        logp, flags = self.score_rows(self.word_rows(ngrams))
        if self.backoff is not None:
            self.apply_backoff(ngrams, logp, flags)
        return logp, flags

    def word_rows(self, ngrams: Sequence[Sequence[str]]) -> np.ndarray:
        """N-grams as word lists (1..order words each) -> padded (N, order) int32 ids, as `score_rows` takes."""
        rows = np.full((len(ngrams), self.order), self.bos_id, np.int32)
        for i, g in enumerate(ngrams):
            if not 1 <= len(g) <= self.order:
                raise ValueError(f"n-gram {i + 1} has {len(g)} words; allowed 1..{self.order}")
            rows[i] = self.vocab.encode(left_pad(g, self.order, BOS))
        return rows

    def apply_backoff(self, ngrams: Sequence[Sequence[str]], logp: np.ndarray, flags: np.ndarray) -> None:
        """Replace the [UNK]-class value of unknown predicted words with the n-gram model's."""
        for i in np.flatnonzero(flags & UNKNOWN):
            g = ngrams[i]
            logp[i] = self.backoff.logprob(left_pad(g, self.order, BOS)[:-1], g[-1])
            flags[i] |= BACKOFF

    def sentence_ngrams(self, words: Sequence[str], source: Sequence[str] | None = None,
                        alignment: Sequence[tuple[int, int]] | None = None) -> np.ndarray:
        """The rows `score_ids` takes for one sentence: its n-grams, and a joint model's source windows
        (`source` its words, `alignment` its (source, target) index pairs: `cslm.data.affiliations`)."""
        if not self.joint:
            return sentence_ngrams(self.vocab.encode(words), self.order, self.bos_id, self.eos_id)
        return sentence_rows(words, self.vocab, self.order, source, alignment, self.src_vocab, self.window)

    def score_sentences(self, sentences: Sequence[Sequence[str]], sources: Sequence[Sequence[str]] | None = None,
                        alignments: Sequence[Sequence[tuple[int, int]]] | None = None
                        ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per sentence: (len+1,) ln P of each word and </s>, and their flags; one batched call.
        A joint model needs each sentence's source words and alignment (and a plain CSLM refuses them)."""
        return [(lp, fl) for lp, fl, _ in self._sentences(sentences, self.score_ids, sources, alignments)]

    def score_sentences_log_z(self, sentences: Sequence[Sequence[str]], sources=None, alignments=None
                              ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per sentence: exact ln P of each word and </s>, flags, and ln Z of each token's history."""
        return self._sentences(sentences, self.score_ids_log_z, sources, alignments)

    def _sentences(self, sentences, score, sources=None, alignments=None
                   ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
        self.check_source(sources is not None or alignments is not None)
        if self.joint and (sources is None or alignments is None or len(sources) != len(sentences)
                           or len(alignments) != len(sentences)):
            raise ValueError("a joint model needs one source sentence and one alignment per sentence")
        if not sentences:
            return []
        if self.joint:
            rows = [self.sentence_ngrams(*x) for x in zip(sentences, sources, alignments)]
        else:
            rows = [self.sentence_ngrams(s) for s in sentences]
        logp, flags, *rest = score(np.concatenate(rows))
        log_z = rest[0] if rest else None
        out, at = [], 0
        for s, r in zip(sentences, rows):
            lp, fl = logp[at : at + len(r)], flags[at : at + len(r)]
            lz = log_z[at : at + len(r)] if log_z is not None else None
            at += len(r)
            if self.backoff is not None and fl.any():
                self.apply_backoff(sentence_ngrams(s, self.order, BOS, EOS), lp, fl)
            out.append((lp, fl, lz))
        return out
