"""RNNsearch: the attention model of Bahdanau, Cho and Bengio (2015), "Neural
Machine Translation by Jointly Learning to Align and Translate", behind the
`modelbase.PhraseModel` interface the encoder-decoder implements too.

Comments cite the equation of the paper's Appendix A each line implements
(A.1.2 alignment model, A.2.1 encoder, A.2.2 decoder). The equations, the GRU
conventions that differ from the encoder-decoder's, and the deliberate
deviations (biases, padding, low-rank W_o, E y_0 = 0, shortlists):
docs/analysis.md, "RNNsearch". tests/test_rnnsearch.py checks the model
against a word-by-word transcription of the equations.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .modelbase import ModelConfig, OutputLayer, PhraseModel, prev_embeddings, steps


class GRULayer(nn.Module):
    """One direction of the encoder GRU (A.2.1): h_j = (1 - z_j) ∘ h_{j-1} + z_j ∘ h~_j."""

    def __init__(self, E: int, H: int):
        super().__init__()
        self.W = nn.Linear(E, 3 * H)  # [W; W_z; W_r] E x_j
        self.U_zr = nn.Linear(H, 2 * H, bias=False)  # [U_z; U_r] h_{j-1}
        self.U = nn.Linear(H, H, bias=False)  # U [r_j ∘ h_{j-1}]
        self.hidden = H

    def forward(self, emb: torch.Tensor, mask: torch.Tensor, reverse: bool = False) -> torch.Tensor:
        """emb [B, T, E], mask [B, T] -> states [B, T, H] (h_j for every position j)."""
        B, T, _ = emb.shape
        H = self.hidden
        x = self.W(emb)  # input projections of every position at once
        h = x.new_zeros(B, H)  # h_0 = 0 (h<-_{T+1} = 0 for the backward layer)
        out = [None] * T
        xs = steps(x)
        for j in (range(T - 1, -1, -1) if reverse else range(T)):
            x_h, x_z, x_r = xs[j].split(H, dim=-1)
            u_z, u_r = self.U_zr(h).split(H, dim=-1)
            z = torch.sigmoid(x_z + u_z)  # update gate z_j
            r = torch.sigmoid(x_r + u_r)  # reset gate r_j
            h_tilde = torch.tanh(x_h + self.U(r * h))  # h~_j = tanh(W E x_j + U [r_j ∘ h_{j-1}])
            h = torch.where(mask[:, j, None], (1.0 - z) * h + z * h_tilde, h)  # padding: state unchanged
            out[j] = h
        return torch.stack(out, dim=1)


class AttentionContext(NamedTuple):
    """What the decoder needs from one source phrase, computed once per phrase."""

    annotations: torch.Tensor  # h_j = [h->_j ; h<-_j]   [B, T, 2H]
    keys: torch.Tensor  # U_a h_j (precomputed; A.1.2) [B, T, A]
    mask: torch.Tensor  # True on real source words [B, T]
    s0: torch.Tensor  # s_0 = tanh(W_s h<-_1)    [B, H]

    def select(self, index: torch.Tensor) -> "AttentionContext":
        """Rows `index`, trimmed to the longest real source among them."""
        mask = self.mask[index]
        T = int(mask.sum(1).max()) if mask.shape[0] else 1
        return AttentionContext(self.annotations[index, :T], self.keys[index, :T], mask[:, :T], self.s0[index])

    @classmethod
    def cat(cls, parts: list["AttentionContext"]) -> "AttentionContext":
        """Stack contexts of batches with different source lengths, right-padding with mask False."""
        T = max(p.mask.shape[1] for p in parts)

        def pad(t: torch.Tensor) -> torch.Tensor:
            return F.pad(t, (0, 0, 0, T - t.shape[1])) if t.dim() == 3 else F.pad(t, (0, T - t.shape[1]))

        return cls(
            torch.cat([pad(p.annotations) for p in parts]),
            torch.cat([pad(p.keys) for p in parts]),
            torch.cat([pad(p.mask) for p in parts]),  # pads with False
            torch.cat([p.s0 for p in parts]),
        )


class AttentionDecoder(nn.Module):
    """The decoder with the alignment model (A.2.2), up to the maxout layer t_i.

    The output matrix W_o is the model's `output` (modelbase.OutputLayer).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        H, E, M, A = cfg.hidden, cfg.embed, cfg.maxout, cfg.align or cfg.hidden
        self.embed = nn.Embedding(cfg.tgt_vocab, E)  # E y
        self.W_s = nn.Linear(H, H)  # s_0 = tanh(W_s h<-_1)
        # alignment model: a one-hidden-layer feed-forward network (A.1.2)
        self.W_a = nn.Linear(H, A)  # W_a s_{i-1}
        self.U_a = nn.Linear(2 * H, A, bias=False)  # U_a h_j, precomputed once per source
        self.v_a = nn.Linear(A, 1, bias=False)  # v_a^T tanh(.)
        # GRU (A.2.2)
        self.W = nn.Linear(E, 3 * H)  # [W; W_z; W_r] E y_{i-1}
        self.U = nn.Linear(H, 3 * H, bias=False)  # [U; U_z; U_r] s_{i-1}
        self.C = nn.Linear(2 * H, 3 * H, bias=False)  # [C; C_z; C_r] c_i
        # maxout readout t~_i = U_o s_{i-1} + V_o E y_{i-1} + C_o c_i
        self.U_o = nn.Linear(H, 2 * M)
        self.V_o = nn.Linear(E, 2 * M, bias=False)
        self.C_o = nn.Linear(2 * H, 2 * M, bias=False)
        self.hidden, self.maxout = H, M

    def attend(self, ctx: AttentionContext, s_prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """alpha_i [N, T] and c_i [N, 2H] from s_{i-1} [N, H] (A.1.2). ctx holds B = N / G sources, each
        attended by G consecutive states (G = 1 in training; a beam's hypotheses in beam search), which
        read its keys and annotations where they are, without a copy per state."""
        B, T = ctx.mask.shape
        q = self.W_a(s_prev).view(B, -1, 1, self.W_a.out_features)  # W_a s_{i-1}  [B, G, 1, A]
        # e_ij = v_a^T tanh(W_a s_{i-1} + U_a h_j)  [B, G, T]; tanh in place: one [B, G, T, A] tensor, not two
        e = self.v_a(torch.tanh_(q + ctx.keys[:, None])).squeeze(-1)
        e = e.masked_fill(~ctx.mask[:, None], -math.inf)  # padded positions get no weight
        alpha = torch.softmax(e, dim=-1)
        c = torch.bmm(alpha, ctx.annotations)  # c_i = sum_j alpha_ij h_j  [B, G, 2H]
        return alpha.view(-1, T), c.view(-1, c.shape[-1])

    def gru(self, x: torch.Tensor, s: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """s_i from x = W E y_{i-1} [B, 3H], s = s_{i-1}, c = c_i (A.2.2)."""
        H = self.hidden
        U, U_zr = self.U.weight[:H], self.U.weight[H:]  # U, [U_z; U_r]
        (x_h, x_z, x_r), (u_z, u_r), (c_h, c_z, c_r) = (a.split(H, dim=-1) for a in (x, F.linear(s, U_zr), self.C(c)))
        z = torch.sigmoid(x_z + u_z + c_z)  # z_i
        r = torch.sigmoid(x_r + u_r + c_r)  # r_i
        s_tilde = torch.tanh(x_h + F.linear(r * s, U) + c_h)  # tanh(W E y + U [r ∘ s] + C c)
        return (1.0 - z) * s + z * s_tilde  # s_i = (1 - z_i) ∘ s_{i-1} + z_i ∘ s~_i

    def readout(self, s_prev: torch.Tensor, e_prev: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """Maxout t_i from s_{i-1}, E y_{i-1}, c_i; any leading shape."""
        t = self.U_o(s_prev) + self.V_o(e_prev) + self.C_o(c)
        return t.view(*t.shape[:-1], self.maxout, 2).amax(dim=-1)  # t_i,k = max(t~_i,2k-1, t~_i,2k)

    def step(self, ctx: AttentionContext, s_prev: torch.Tensor, e_prev: torch.Tensor):
        """One decoding step: (maxout t_i [B, M], s_i, alpha_i) from s_{i-1} and E y_{i-1}."""
        alpha, c = self.attend(ctx, s_prev)
        return self.readout(s_prev, e_prev, c), self.gru(self.W(e_prev), s_prev, c), alpha

    def forward(self, ctx: AttentionContext, tgt: torch.Tensor):
        """Teacher-forced maxout outputs t_i [B, T, M] and alignments alpha [B, T, T_src]."""
        e_prev = prev_embeddings(self.embed, tgt)  # E y_{i-1}, E y_0 = 0
        x = self.W(e_prev)
        s = ctx.s0
        states, contexts, alphas = [], [], []
        for x_i in steps(x):
            alpha, c = self.attend(ctx, s)
            states.append(s)  # the readout uses s_{i-1}
            contexts.append(c)
            alphas.append(alpha)
            s = self.gru(x_i, s, c)
        t = self.readout(torch.stack(states, 1), e_prev, torch.stack(contexts, 1))
        return t, torch.stack(alphas, 1)


class RNNSearch(PhraseModel):
    """Bahdanau et al.'s RNNsearch behind the `PhraseModel` interface."""

    has_attention = True

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.arch != "rnnsearch":
            raise ValueError(f"RNNSearch cannot build arch {cfg.arch!r}")
        self.config = cfg
        self.src_embed = nn.Embedding(cfg.src_vocab, cfg.embed)  # E x (shared by both directions)
        self.fwd = GRULayer(cfg.embed, cfg.hidden)
        self.bwd = GRULayer(cfg.embed, cfg.hidden)
        self.decoder = AttentionDecoder(cfg)
        # p(y_i | ...) ∝ exp(y_i^T W_o t_i); W_o = G_l G_r below full rank
        self.output = OutputLayer(cfg.maxout, cfg.tgt_vocab, cfg.out_rank if cfg.out_rank < cfg.maxout else None)

    def init_weights(self) -> None:
        """Appendix B.1 of Bahdanau et al.: orthogonal recurrent matrices, N(0, 0.001^2) for
        W_a and U_a, zeros for v_a and every bias, N(0, 0.01^2) for everything else."""
        H = self.config.hidden
        d = self.decoder
        recurrent = {self.fwd.U_zr.weight, self.fwd.U.weight, self.bwd.U_zr.weight, self.bwd.U.weight, d.U.weight}
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("bias") or p is d.v_a.weight:
                    p.zero_()
                elif p in recurrent:
                    for k in range(p.shape[0] // H):  # each H x H gate block on its own
                        nn.init.orthogonal_(p[k * H : (k + 1) * H])
                elif p is d.W_a.weight or p is d.U_a.weight:
                    p.normal_(0.0, 0.001)
                else:
                    p.normal_(0.0, 0.01)

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward and backward annotations, each [B, T, H]."""
        emb = self.src_embed(src)
        return self.fwd(emb, src_mask), self.bwd(emb, src_mask, reverse=True)

    def context(self, src: torch.Tensor, src_mask: torch.Tensor) -> AttentionContext:
        fwd, bwd = self.encode(src, src_mask)
        h = torch.cat([fwd, bwd], dim=-1)  # h_j = [h->_j ; h<-_j]
        s0 = torch.tanh(self.decoder.W_s(bwd[:, 0]))  # s_0 = tanh(W_s h<-_1)
        return AttentionContext(h, self.decoder.U_a(h), src_mask, s0)

    def phrase_vector(self, src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """A fixed-length phrase representation [B, 2H]: [h->_N ; h<-_1].

        RNNsearch has no single summary c; the last forward and first backward
        states are the two that have read the whole phrase.
        """
        fwd, bwd = self.encode(src, src_mask)
        last = src_mask.sum(1) - 1
        return torch.cat([fwd[torch.arange(src.shape[0]), last], bwd[:, 0]], dim=-1)

    def source_embeddings(self) -> nn.Embedding:
        return self.src_embed

    def target_embeddings(self) -> nn.Embedding:
        return self.decoder.embed

    def start_state(self, ctx: AttentionContext) -> torch.Tensor:
        return ctx.s0

    def step_readout(self, ctx: AttentionContext, state: torch.Tensor, e_prev: torch.Tensor):
        """Generation step: (maxout t_i of y_i, s_i) from s_{i-1} and E y_{i-1} (zeros for i = 1)."""
        t, state, _ = self.decoder.step(ctx, state, e_prev)
        return t, state

    def readout_states(self, ctx: AttentionContext, tgt: torch.Tensor) -> torch.Tensor:
        """Teacher-forced maxout outputs t_i [B, T, M]; `tgt` holds the target words then </s>."""
        return self.decoder(ctx, tgt)[0]

    @torch.no_grad()
    def alignment(self, src: torch.Tensor, src_mask: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """Soft alignments alpha [B, T_tgt, T_src] of teacher-forced target rows."""
        return self.decoder(self.context(src, src_mask), tgt)[1]

    def flops_per_pair(self, src_len: float, tgt_len: float) -> float:
        """Multiply-adds x 2 of one forward pass, for the efficiency benchmark."""
        c = self.config
        H, E, M, V, A = c.hidden, c.embed, c.maxout, c.tgt_vocab, c.align or c.hidden
        out = M * V if c.out_rank >= M else M * c.out_rank + c.out_rank * V
        enc = 2 * src_len * (E * 3 * H + 3 * H * H) + H * H + src_len * 2 * H * A
        att = H * A + src_len * (A + A + 2 * H)  # W_a s, tanh(. + U_a h) v_a, sum alpha h
        dec = tgt_len * (att + E * 3 * H + 3 * H * H + 2 * H * 3 * H + H * 2 * M + E * 2 * M + 2 * H * 2 * M + out)
        return 2.0 * (enc + dec)
