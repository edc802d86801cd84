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

from typing import NamedTuple

import torch
import torch.nn as nn

from .modelbase import ModelConfig, OutputLayer, PhraseModel, prev_embeddings, steps


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
        B = src.shape[0]
        H = self.hidden
        x = self.W(self.embed(src))  # input projections of every step at once
        h = src.new_zeros((B, H), dtype=x.dtype)  # h_0 = 0
        for t, x_t in enumerate(steps(x)):
            x_h, x_z, x_r = x_t.split(H, dim=-1)
            u_z, u_r = self.U_zr(h).split(H, dim=-1)
            z = torch.sigmoid(x_z + u_z)  # Eq. 6: update gate
            r = torch.sigmoid(x_r + u_r)  # Eq. 5: reset gate
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
    """Generates y_1..y_T conditioned on c, up to the maxout layer (Appendix A.1.2).

    The output matrix G = G_l G_r is the model's `output` (modelbase.OutputLayer).
    """

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
        self.hidden, self.maxout = H, M

    def context(self, c: torch.Tensor) -> DecoderContext:
        return DecoderContext(torch.tanh(self.V(c)), self.C(c), self.O_c(c))

    def step(self, x: torch.Tensor, h: torch.Tensor, Cc: torch.Tensor) -> torch.Tensor:
        """One GRU step. x = W' e(y_{t-1}) [..., 3H], h = h'_{t-1}, Cc = C c (broadcast) -> h'_t."""
        H = self.hidden
        (x_h, x_z, x_r), (u_h, u_z, u_r), (c_h, c_z, c_r) = (a.split(H, dim=-1) for a in (x, self.U(h), Cc))
        z = torch.sigmoid(x_z + u_z + c_z)  # update gate z'
        r = torch.sigmoid(x_r + u_r + c_r)  # reset gate r'
        h_tilde = torch.tanh(x_h + r * (u_h + c_h))  # r' ⊙ [U' h' + C c]
        return z * h + (1.0 - z) * h_tilde

    def readout(self, h: torch.Tensor, e_prev: torch.Tensor, Oc: torch.Tensor) -> torch.Tensor:
        """Maxout layer s_t (Appendix A.1.2) from h'_t, e(y_{t-1}) and O_c c; any leading shape."""
        s = self.O_h(h) + self.O_y(e_prev) + Oc
        return s.view(*s.shape[:-1], self.maxout, 2).amax(dim=-1)  # s_i = max(s'_{2i-1}, s'_{2i})

    def forward(self, ctx: DecoderContext, tgt: torch.Tensor) -> torch.Tensor:
        """Teacher-forced maxout outputs s_t for every step: tgt [B, T] -> [B, T, M]."""
        e_prev = prev_embeddings(self.embed, tgt)  # e(y_{t-1}), e(y_0) = 0
        x = self.W(e_prev)
        h = ctx.h0
        states = []
        for x_t in steps(x):
            h = self.step(x_t, h, ctx.Cc)
            states.append(h)
        hs = torch.stack(states, dim=1)
        return self.readout(hs, e_prev, ctx.Oc[:, None, :])


class EncoderDecoder(PhraseModel):
    """Cho et al.'s RNN Encoder-Decoder behind the `PhraseModel` interface."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.arch != "encdec":
            raise ValueError(f"EncoderDecoder cannot build arch {cfg.arch!r}")
        self.config = cfg
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.output = OutputLayer(cfg.maxout, cfg.tgt_vocab, cfg.out_rank)  # G = G_l G_r, rank 100

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

    def phrase_vector(self, src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """The summary c = tanh(V h_N) [B, H] (Appendix A.1.1)."""
        return self.encoder(src, src_mask)

    def source_embeddings(self) -> nn.Embedding:
        return self.encoder.embed

    def target_embeddings(self) -> nn.Embedding:
        return self.decoder.embed

    def start_state(self, ctx: DecoderContext) -> torch.Tensor:
        return ctx.h0  # h'_0 = tanh(V' c)

    def step_readout(self, ctx: DecoderContext, h: torch.Tensor, e_prev: torch.Tensor):
        """One decoding step: (maxout s_t of y_t, h'_t) from h'_{t-1} and e(y_{t-1}) (zeros for t = 1)."""
        d = self.decoder
        N, B = h.shape[0], ctx.Cc.shape[0]
        # a context row per group of N / B state rows (`PhraseModel.step_readout`): broadcast, not copied
        h, e_prev = h.reshape(B, -1, h.shape[-1]), e_prev.reshape(B, -1, e_prev.shape[-1])
        h = d.step(d.W(e_prev), h, ctx.Cc[:, None])
        return d.readout(h, e_prev, ctx.Oc[:, None]).view(N, -1), h.view(N, -1)

    def readout_states(self, ctx: DecoderContext, tgt: torch.Tensor) -> torch.Tensor:
        """Teacher-forced maxout outputs s_t [B, T, M]; `tgt` holds the target words then </s>."""
        return self.decoder(ctx, tgt)

    def flops_per_pair(self, src_len: float, tgt_len: float) -> float:
        """Multiply-adds x 2 of one forward pass, for the efficiency benchmark."""
        c = self.config
        H, E, M, R, V = c.hidden, c.embed, c.maxout, c.out_rank, c.tgt_vocab
        enc = src_len * (E * 3 * H + 3 * H * H) + H * H
        ctx = H * H + 3 * H * H + H * 2 * M
        dec = tgt_len * (E * 3 * H + 3 * H * H + H * 2 * M + E * 2 * M + M * R + R * V)
        return 2.0 * (enc + ctx + dec)
