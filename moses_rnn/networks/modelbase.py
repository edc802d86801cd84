"""What every phrase model builds on: its configuration, the preset sizes,
the shared output layer, and the interface the tools call.

Imports flow one way:

    modelbase  <-  model (the encoder-decoder), rnnsearch (the attention model)
               <-  modelio (build_model, load_model: the one place that knows both)
               <-  train, score, generate, analyze, align

The tools (training, `PhraseScorer`, `Generator`, the analysis and alignment
pictures) call only the methods `PhraseModel` declares here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F

from mtcommon.errors import UserError

from . import ARCHITECTURES, ARCHS


@dataclass
class ModelConfig:
    arch: str = "encdec"  # "encdec" (Cho et al., 2014; model.py) or "rnnsearch" (Bahdanau et al., 2015; rnnsearch.py)
    src_vocab: int = 15000  # source shortlist size (reserved symbols included)
    tgt_vocab: int = 15000  # target shortlist size (reserved symbols included)
    embed: int = 100  # word-embedding size (the rank of the encdec's input matrices)
    hidden: int = 1000  # GRU units: encdec encoder and decoder; RNNsearch each encoder direction and decoder
    maxout: int = 500  # maxout units (2 * maxout pre-activations)
    # Rank of the output matrix. The encdec always factors it, G = G_l G_r
    # (Cho et al.'s rank 100); RNNsearch factors it only when out_rank < maxout
    # and otherwise uses the paper's single full matrix W_o.
    out_rank: int = 100
    align: int = 0  # RNNsearch only: alignment-model hidden units (0: same as hidden); must be 0 for encdec
    # What the vocabularies' units are: "words" (shortlists, src.vocab / tgt.vocab) or "sentencepiece"
    # (subword units, src.spm / tgt.spm, mtcommon.subword), with each model file's SHA-256, checked at load.
    segmentation: str = "words"
    src_sha256: str = ""
    tgt_sha256: str = ""

    SIZES = ("src_vocab", "tgt_vocab", "embed", "hidden", "maxout", "out_rank", "align")
    SEGMENTATIONS = ("words", "sentencepiece")

    def __post_init__(self) -> None:
        """Every field checked (a config may come from a file): a UserError names the first bad one."""
        if self.arch not in ARCHS:
            raise UserError(f"unknown architecture {self.arch!r}; choose from {', '.join(ARCHS)}")
        for name in self.SIZES:
            value, least = getattr(self, name), 0 if name in ("out_rank", "align") else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise UserError(f"`{name}` must be an integer of at least {least}, not {value!r}")
        if self.arch != "rnnsearch" and self.align:
            raise UserError(f"`align` sizes the RNNsearch alignment model: it must be 0 with architecture {self.arch!r}")
        if self.segmentation not in self.SEGMENTATIONS:
            raise UserError(f"unknown segmentation {self.segmentation!r}; choose from {', '.join(self.SEGMENTATIONS)}")
        for name in ("src_sha256", "tgt_sha256"):
            value = getattr(self, name)
            subwords = self.segmentation != "words"
            if not isinstance(value, str) or (subwords and not _is_sha256(value)) or (not subwords and value):
                raise UserError(f"`{name}` must be {'a SHA-256 in hex' if subwords else 'empty for word units'}, "
                                f"not {value!r}")

    def to_dict(self) -> dict:
        return asdict(self)


def _is_sha256(value: str) -> bool:
    return len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def _preset(name: str, arch: str) -> dict:
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; choose from {', '.join(ARCHS)}")
    presets = ARCHITECTURES[arch].presets
    if name not in presets:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(presets)}")
    return presets[name]


def preset_vocab(name: str, arch: str = "encdec") -> int:
    """The shortlist size (each side) of preset `name` of architecture `arch`."""
    return _preset(name, arch)["vocab"]


def preset_config(name: str, src_vocab: int | None = None, tgt_vocab: int | None = None,
                  arch: str = "encdec") -> ModelConfig:
    """`arch`'s preset `name`, with the actual shortlist sizes (default: the preset's own)."""
    p = dict(_preset(name, arch))
    vocab = p.pop("vocab")
    return ModelConfig(arch=arch, src_vocab=src_vocab or vocab, tgt_vocab=tgt_vocab or vocab, **p)


def log_normalizer_(logits: torch.Tensor) -> torch.Tensor:
    """log Z = log sum_j exp(logits_j) of each row [N, V] -> [N], computed in place on `logits`
    (left overwritten): m + log sum exp(logits - m), m the row max; without autograd about three
    times faster on CPU than torch.logsumexp."""
    m = logits.amax(dim=1, keepdim=True)
    return logits.sub_(m).exp_().sum(dim=1).log_().add_(m.squeeze(1))


def prev_embeddings(embed: nn.Embedding, tgt: torch.Tensor) -> torch.Tensor:
    """Teacher forcing's inputs: the embeddings of y_{t-1} for t = 1..T [B, T, E], zeros for y_0."""
    e = embed(tgt[:, :-1])
    return torch.cat([e.new_zeros(e.shape[0], 1, e.shape[2]), e], dim=1)


def steps(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A recurrence's per-step inputs [B, T, ...] as T views [B, ...]. Their gradients come back as one
    stacked tensor; a slice x[:, t] per step gave back a zero-filled [B, T, ...] of its own, T of them added
    together (with the gates' slices, a seventh of a `small` training step)."""
    return x.unbind(1)


class OutputLayer(nn.Module):
    """The softmax over the target shortlist, from maxout outputs s [..., M].

    p(y = j | ...) ∝ exp(g_j^T s + b_j): Cho et al.'s G (Appendix A.1.2),
    Bahdanau et al.'s W_o (Appendix A.2.2). With `rank` R, G = G_l G_r:
    G_r [R x M] projects s, G_l [V x R] (with the bias b) scores every word.
    With `rank` None, the single full matrix is G_l [V x M] (with b) and G_r
    is the identity. Either way `G_l` holds one row and one bias per word.
    """

    def __init__(self, maxout: int, vocab: int, rank: int | None):
        super().__init__()
        self.G_r = nn.Linear(maxout, rank, bias=False) if rank else nn.Identity()
        self.G_l = nn.Linear(rank or maxout, vocab)

    def logits(self, s: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """g_j^T s + b_j for every target word j: [..., M] -> [..., V]; with `rows` (word ids
        [K]), for those words only, in that order: [..., K] (a sampled softmax's candidates)."""
        if rows is None:
            return self.G_l(self.G_r(s))
        return F.linear(self.G_r(s), self.G_l.weight[rows], self.G_l.bias[rows])

    def log_probs(self, s: torch.Tensor, y: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
        """log p(y_n | ...) for flat maxout outputs s [N, M] and words y [N] -> [N].

        The softmax runs over the whole target shortlist, `chunk` rows at a time
        so memory stays bounded for large scoring batches. Without autograd the
        normaliser is computed in place (`log_normalizer_`); with autograd the
        same quantity comes from the fused cross-entropy.
        """
        out = []
        for i in range(0, s.shape[0], chunk):
            logits = self.logits(s[i : i + chunk])
            yi = y[i : i + chunk]
            if torch.is_grad_enabled():
                out.append(-F.cross_entropy(logits, yi, reduction="none"))
                continue
            picked = logits.gather(1, yi[:, None]).squeeze(1)
            out.append(picked - log_normalizer_(logits))
        return torch.cat(out) if out else s.new_zeros(0)


class Context(Protocol):
    """What `PhraseModel.context` returns: per-source tensors, one row per source phrase."""

    def select(self, index: torch.Tensor) -> "Context":
        """Rows `index` (repeats allowed), in that order."""
        ...

    @classmethod
    def cat(cls, parts: list) -> "Context":
        """The rows of several contexts (of batches of any source lengths), in order."""
        ...


class PhraseModel(nn.Module, ABC):
    """A model of p(target phrase | source phrase): the interface every architecture implements.

    Shapes: src, src_mask [B, S] (ids; True on real words, right-padded);
    tgt, tgt_mask [B, T] (target words then </s>; True on real symbols);
    E embedding size, H decoder state size, M maxout units, V target shortlist.
    Subclasses set `config` first and `output` (an `OutputLayer`) last in
    __init__, so the output parameters come last, where saved optimizer
    states expect them.
    """

    config: ModelConfig
    output: OutputLayer  # logits(s), log_probs(s, y); G_l, G_r
    has_attention: bool = False  # True: `alignment` returns soft-alignment weights

    # -- encoding -----------------------------------------------------------
    @abstractmethod
    def context(self, src: torch.Tensor, src_mask: torch.Tensor) -> Context:
        """Everything the decoder needs from each source phrase, computed once per phrase."""

    @abstractmethod
    def phrase_vector(self, src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """A fixed-length representation of each source phrase [B, D] (Cho et al., Figure 5)."""

    @abstractmethod
    def source_embeddings(self) -> nn.Embedding:
        """The source word-embedding table [src_vocab, E]."""

    @abstractmethod
    def target_embeddings(self) -> nn.Embedding:
        """The target word-embedding table [tgt_vocab, E]: what `step` takes as e_prev."""

    # -- decoding, one word at a time (scoring by prefix tree, sampling, beam search)
    @abstractmethod
    def start_state(self, ctx: Context) -> torch.Tensor:
        """The decoder state before the first target word [B, H]; rows follow ctx's."""

    @abstractmethod
    def step_readout(self, ctx: Context, state: torch.Tensor,
                     e_prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the maxout output s_t of y_t [N, M], the next state [N, H]) from the state before y_t
        and e_prev = the embedding of y_{t-1} [N, E] (zeros for t = 1): `output.logits(s_t)` are
        y_t's logits, which a caller may compute a few rows at a time (beam search does).

        ctx holds B = N / G rows: context row b serves the G consecutive state rows b*G .. b*G+G-1
        (G = 1: one each; G = K: the K hypotheses of a source's beam, which share its context
        without copies of it)."""

    def step(self, ctx: Context, state: torch.Tensor, e_prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits of y_t [N, V], the next state [N, H]): `step_readout` through the output layer (its rows
        as there: a context row may serve a group of state rows)."""
        s, state = self.step_readout(ctx, state, e_prev)
        return self.output.logits(s), state

    # -- teacher forcing (training, scoring of whole batches) ------------------
    @abstractmethod
    def readout_states(self, ctx: Context, tgt: torch.Tensor) -> torch.Tensor:
        """The maxout outputs s_t of every target position [B, T, M], teacher-forced on
        `tgt`, before the output matrix: `output.logits(s)[:, t]` are the logits of y_t."""

    def log_prob(self, ctx: Context, tgt: torch.Tensor, tgt_mask: torch.Tensor) -> torch.Tensor:
        """Sum of log p(y_t | y_<t, source) over the masked positions of each row: [B]."""
        s = self.readout_states(ctx, tgt)
        flat = self.output.log_probs(s[tgt_mask], tgt[tgt_mask])
        rows = torch.arange(tgt.shape[0], device=tgt.device)[:, None].expand_as(tgt)[tgt_mask]
        return s.new_zeros(tgt.shape[0]).index_add_(0, rows, flat)

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor, tgt: torch.Tensor,
                tgt_mask: torch.Tensor) -> torch.Tensor:
        """log p(target | source) of each row [B]: `log_prob` of the sources' `context`."""
        return self.log_prob(self.context(src, src_mask), tgt, tgt_mask)

    def alignment(self, src: torch.Tensor, src_mask: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """Soft alignments [B, T, S] of teacher-forced targets; rows sum to 1 over real source
        words. Only models with `has_attention`; the others raise ValueError."""
        raise ValueError(f"this model has no attention (architecture {self.config.arch!r}), hence no soft alignment")

    # -- training and measurement -----------------------------------------
    @abstractmethod
    def init_weights(self) -> None:
        """Initialise every parameter in place as the architecture's paper prescribes."""

    @abstractmethod
    def flops_per_pair(self, src_len: float, tgt_len: float) -> float:
        """Multiply-adds x 2 of one forward pass of a pair of these lengths (benchmarks)."""
