"""The RNN Encoder-Decoder of Cho et al. (2014), as in its supplementary material.

Notation follows the paper ("Learning Phrase Representations using RNN
Encoder-Decoder for Statistical Machine Translation", Sections 2-3 and
Appendix A). Equation numbers refer to that paper.

Deviations, all deliberate:
- Every affine map applied to an input carries a bias; the paper omits
  biases "for readability". Recurrent (U) and context (C) maps have none,
  since the input map already supplies one per gate.
- Source padding: a batch of unequal-length phrases is right-padded and the
  encoder state is frozen on padded positions, so h_N is the state after the
  phrase's own last word whatever its batch holds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class ModelConfig:
    arch: str = "encdec"
    src_vocab: int = 15000  # source shortlist size (reserved symbols included)
    tgt_vocab: int = 15000  # target shortlist size (reserved symbols included)
    embed: int = 100  # rank of the input matrices = word-embedding size
    hidden: int = 1000  # GRU units, encoder and decoder
    maxout: int = 500  # maxout units (2 * maxout pre-activations)
    out_rank: int = 100  # rank of the output matrix G = G_l G_r
    align: int = 0  # RNNsearch alignment-model hidden units (0: same as hidden; unused by encdec)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown model config keys: {sorted(unknown)}")
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)


# Sizes of the shipped presets. `paper` is the supplementary material's model;
# the others keep its structure at sizes that train on a laptop CPU.
PRESETS: dict[str, dict] = {
    "paper": dict(vocab=15000, embed=100, hidden=1000, maxout=500, out_rank=100),
    "small": dict(vocab=15000, embed=64, hidden=256, maxout=128, out_rank=64),
    "tiny": dict(vocab=256, embed=16, hidden=32, maxout=16, out_rank=16),
}

# RNNsearch sizes (Bahdanau et al., 2015, Section 4.2: 620-d embeddings, 1000
# hidden units per direction and in the decoder and alignment model, 500
# maxout units, a full-rank output matrix). Shortlists as for the encdec.
RNNSEARCH_PRESETS: dict[str, dict] = {
    "paper": dict(vocab=15000, embed=620, hidden=1000, align=1000, maxout=500, out_rank=500),
    "small": dict(vocab=15000, embed=64, hidden=256, align=256, maxout=128, out_rank=64),
    "tiny": dict(vocab=2000, embed=16, hidden=32, align=32, maxout=16, out_rank=16),
}


def preset_config(name: str, src_vocab: int, tgt_vocab: int, arch: str = "encdec") -> ModelConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    presets = RNNSEARCH_PRESETS if arch == "rnnsearch" else PRESETS
    p = {k: v for k, v in presets[name].items() if k != "vocab"}
    return ModelConfig(arch=arch, src_vocab=src_vocab, tgt_vocab=tgt_vocab, **p)


class Encoder(nn.Module):
    """Reads x_1..x_N into the fixed-length summary c (Eqs. 5-8, Appendix A.1.1)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        H = cfg.hidden
        self.embed = nn.Embedding(cfg.src_vocab, cfg.embed)  # e(x): the rank-100 factor of W
        self.W = nn.Linear(cfg.embed, 3 * H)  # [W; W_z; W_r] e(x_t)
        self.U_zr = nn.Linear(H, 2 * H, bias=False)  # [U_z; U_r] h_{t-1}
        self.U = nn.Linear(H, H, bias=False)  # U (r ⊙ h_{t-1})
        self.V = nn.Linear(H, H)  # c = tanh(V h_N)
        self.hidden = H

    def forward(self, src: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """src [B, T] ids, mask [B, T] bool (True on real words) -> c [B, H]."""
        B, T = src.shape
        H = self.hidden
        x = self.W(self.embed(src))  # input projections of every step at once
        h = src.new_zeros((B, H), dtype=x.dtype)  # h_0 = 0
        for t in range(T):
            x_h, x_z, x_r = x[:, t, :H], x[:, t, H : 2 * H], x[:, t, 2 * H :]
            zr = self.U_zr(h)
            z = torch.sigmoid(x_z + zr[:, :H])  # Eq. 6: update gate
            r = torch.sigmoid(x_r + zr[:, H:])  # Eq. 5: reset gate
            h_tilde = torch.tanh(x_h + self.U(r * h))  # Eq. 8: reset applied to h before U
            h_new = z * h + (1.0 - z) * h_tilde  # Eq. 7
            h = torch.where(mask[:, t, None], h_new, h)  # padding leaves h unchanged
        return torch.tanh(self.V(h))  # summary c


class DecoderContext(NamedTuple):
    """What the decoder needs from c, computed once per source phrase."""

    h0: torch.Tensor  # h'_0 = tanh(V' c)            [B, H]
    Cc: torch.Tensor  # [C c; C_z c; C_r c]           [B, 3H]
    Oc: torch.Tensor  # O_c c                          [B, 2M]

    def select(self, index: torch.Tensor) -> "DecoderContext":
        return DecoderContext(self.h0[index], self.Cc[index], self.Oc[index])

    @classmethod
    def cat(cls, parts: list["DecoderContext"]) -> "DecoderContext":
        """Stack the contexts of several batches of source phrases, in order."""
        return cls(*(torch.cat(p) for p in zip(*parts)))


class Decoder(nn.Module):
    """Generates y_1..y_T conditioned on c (Appendix A.1.2)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        H, E, M = cfg.hidden, cfg.embed, cfg.maxout
        self.embed = nn.Embedding(cfg.tgt_vocab, E)  # e(y): rank-100 factor of W'
        self.W = nn.Linear(E, 3 * H)  # [W'; W'_z; W'_r] e(y_{t-1})
        self.U = nn.Linear(H, 3 * H, bias=False)  # [U'; U'_z; U'_r] h'_{t-1}
        self.C = nn.Linear(H, 3 * H, bias=False)  # [C; C_z; C_r] c
        self.V = nn.Linear(H, H)  # h'_0 = tanh(V' c)
        self.O_h = nn.Linear(H, 2 * M)  # s' = O_h h'_t
        self.O_y = nn.Linear(E, 2 * M, bias=False)  #      + O_y e(y_{t-1})
        self.O_c = nn.Linear(H, 2 * M, bias=False)  #      + O_c c
        self.G_r = nn.Linear(M, cfg.out_rank, bias=False)  # G = G_l G_r, rank 100
        self.G_l = nn.Linear(cfg.out_rank, cfg.tgt_vocab)
        self.hidden, self.maxout = H, M

    def context(self, c: torch.Tensor) -> DecoderContext:
        return DecoderContext(torch.tanh(self.V(c)), self.C(c), self.O_c(c))

    def prev_embeddings(self, tgt: torch.Tensor) -> torch.Tensor:
        """e(y_{t-1}) for t = 1..T, with e(y_0) = 0."""
        e = self.embed(tgt[:, :-1])
        return torch.cat([e.new_zeros(e.shape[0], 1, e.shape[2]), e], dim=1)

    def step(self, x: torch.Tensor, h: torch.Tensor, Cc: torch.Tensor) -> torch.Tensor:
        """One GRU step. x = W' e(y_{t-1}) [B, 3H], h = h'_{t-1}, Cc = C c -> h'_t."""
        H = self.hidden
        u = self.U(h)
        z = torch.sigmoid(x[:, H : 2 * H] + u[:, H : 2 * H] + Cc[:, H : 2 * H])  # update gate z'
        r = torch.sigmoid(x[:, 2 * H :] + u[:, 2 * H :] + Cc[:, 2 * H :])  # reset gate r'
        h_tilde = torch.tanh(x[:, :H] + r * (u[:, :H] + Cc[:, :H]))  # r' ⊙ [U' h' + C c]
        return z * h + (1.0 - z) * h_tilde

    def readout(self, h: torch.Tensor, e_prev: torch.Tensor, Oc: torch.Tensor) -> torch.Tensor:
        """Maxout layer s_t (Appendix A.1.2) from h'_t, e(y_{t-1}) and O_c c; any leading shape."""
        s = self.O_h(h) + self.O_y(e_prev) + Oc
        return s.view(*s.shape[:-1], self.maxout, 2).amax(dim=-1)  # s_i = max(s'_{2i-1}, s'_{2i})

    def logits(self, s: torch.Tensor) -> torch.Tensor:
        return self.G_l(self.G_r(s))  # g_j^T s_t for every target word j

    def forward(self, ctx: DecoderContext, tgt: torch.Tensor) -> torch.Tensor:
        """Teacher-forced maxout outputs s_t for every step: tgt [B, T] -> [B, T, M]."""
        e_prev = self.prev_embeddings(tgt)
        x = self.W(e_prev)
        h = ctx.h0
        states = []
        for t in range(tgt.shape[1]):
            h = self.step(x[:, t], h, ctx.Cc)
            states.append(h)
        hs = torch.stack(states, dim=1)
        return self.readout(hs, e_prev, ctx.Oc[:, None, :])


def token_log_probs(decoder: Decoder, s: torch.Tensor, y: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """log p(y_n | ...) for flat maxout outputs s [N, M] and words y [N].

    The softmax runs over the whole target shortlist, `chunk` rows at a time
    so memory stays bounded for large scoring batches. Without autograd the
    normaliser is computed in place (max, exp, sum on the logits buffer),
    about three times faster on CPU than torch.logsumexp; with autograd the
    same quantity comes from the fused cross-entropy.
    """
    out = []
    for i in range(0, s.shape[0], chunk):
        logits = decoder.logits(s[i : i + chunk])
        yi = y[i : i + chunk]
        if torch.is_grad_enabled():
            out.append(-F.cross_entropy(logits, yi, reduction="none"))
            continue
        picked = logits.gather(1, yi[:, None]).squeeze(1)
        m = logits.amax(dim=1, keepdim=True)
        log_z = logits.sub_(m).exp_().sum(dim=1).log_().add_(m.squeeze(1))
        out.append(picked - log_z)
    return torch.cat(out) if out else s.new_zeros(0)


class EncoderDecoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.arch != "encdec":
            raise ValueError(f"EncoderDecoder cannot build arch {cfg.arch!r}")
        self.config = cfg
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)

    def init_weights(self) -> None:
        """N(0, 0.01) for every weight, orthogonal recurrent matrices, zero biases (Appendix A.2)."""
        H = self.config.hidden
        recurrent = {self.encoder.U_zr.weight, self.encoder.U.weight, self.decoder.U.weight}
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                elif p in recurrent:
                    for k in range(p.shape[0] // H):  # each H x H gate block on its own
                        nn.init.orthogonal_(p[k * H : (k + 1) * H])
                else:
                    p.normal_(0.0, 0.01)

    def context(self, src: torch.Tensor, src_mask: torch.Tensor) -> DecoderContext:
        return self.decoder.context(self.encoder(src, src_mask))

    def start_state(self, ctx: DecoderContext) -> torch.Tensor:
        return ctx.h0  # h'_0 = tanh(V' c)

    def step(self, ctx: DecoderContext, h: torch.Tensor, e_prev: torch.Tensor):
        """One decoding step: (logits of y_t, h'_t) from h'_{t-1} and e(y_{t-1}) (zeros for t = 1)."""
        d = self.decoder
        h = d.step(d.W(e_prev), h, ctx.Cc)
        return d.logits(d.readout(h, e_prev, ctx.Oc)), h

    def log_prob(self, ctx: DecoderContext, tgt: torch.Tensor, tgt_mask: torch.Tensor) -> torch.Tensor:
        """Sum of log p(y_t | y_<t, c) over the masked positions of each row: [B].

        `tgt` holds the target words followed by the end-of-phrase symbol.
        """
        s = self.decoder(ctx, tgt)
        flat = token_log_probs(self.decoder, s[tgt_mask], tgt[tgt_mask])
        out = s.new_zeros(tgt.shape[0])
        rows = torch.arange(tgt.shape[0], device=tgt.device)[:, None].expand_as(tgt)[tgt_mask]
        return out.index_add_(0, rows, flat)

    def forward(self, src, src_mask, tgt, tgt_mask) -> torch.Tensor:
        return self.log_prob(self.context(src, src_mask), tgt, tgt_mask)

    def flops_per_pair(self, src_len: float, tgt_len: float) -> float:
        """Multiply-adds x 2 of one forward pass, for the efficiency benchmark."""
        c = self.config
        H, E, M, R, V = c.hidden, c.embed, c.maxout, c.out_rank, c.tgt_vocab
        enc = src_len * (E * 3 * H + 3 * H * H) + H * H
        ctx = H * H + 3 * H * H + H * 2 * M
        dec = tgt_len * (E * 3 * H + 3 * H * H + H * 2 * M + E * 2 * M + M * R + R * V)
        return 2.0 * (enc + ctx + dec)


def build_model(cfg: ModelConfig) -> nn.Module:
    if cfg.arch == "encdec":
        return EncoderDecoder(cfg)
    if cfg.arch == "rnnsearch":
        from .rnnsearch import RNNSearch  # imports this module; built on demand

        return RNNSearch(cfg)
    raise ValueError(f"unknown architecture {cfg.arch!r}")


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

