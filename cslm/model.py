"""The feed-forward continuous-space language model (CSLM).

Cho et al. (2014), Sec. 4.1.2, after Schwenk (2007): a 7-gram model. The n-1 = 6
previous words are each projected to a 512-dimensional vector by one shared
projection matrix and concatenated (3072 values), fed through two rectified
layers of 1536 and 1024 units, and a softmax over a target shortlist gives
P(w_n | w_1 .. w_{n-1}). All weights start uniform in [-0.01, 0.01].

Deviations: `dropout` (Srivastava et al. 2014; 0 by default, as in the paper) after each
rectified layer while training. One shortlist serves as both the input and the output vocabulary
(Schwenk's toolkit can use a larger input vocabulary); words outside it enter
the history as [UNK]. This keeps one id space for the model, the server and
its clients.

The joint model (NNJM; Devlin et al. 2014, Sec. 2) is the same network with a source input:
`source_window` = m > 0 adds m source words, centred on the source word the predicted target
word is affiliated with (`cslm.data`), each projected by a second matrix over the source
shortlist and concatenated after the n-1 target projections, so that

    P(t_i | t_{i-n+1} .. t_{i-1}, S_i),   S_i = s_{a_i - (m-1)/2} .. s_{a_i + (m-1)/2}   (Devlin et al., Eq. 1)

An input row is the target history (n-1 ids) followed by the source window (m ids of the
source shortlist). m = 0 is the plain CSLM: its config, weights and files are unchanged.
Deviations from Devlin et al. (192-dimensional projections, two hidden layers of 512 tanh
units): the sizes and the rectified layers are the CSLM's presets, and one shortlist size
serves the source and the target unless `source_vocab_size` says otherwise.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from mtcommon.errors import UserError


@dataclass
class CSLMConfig:
    vocab_size: int = 15000  # the shortlist, reserved symbols included
    order: int = 7  # n: n-1 words of history predict the n-th
    embed: int = 512  # projection of each history word
    hidden: tuple[int, ...] = field(default_factory=lambda: (1536, 1024))
    init_range: float = 0.01
    dropout: float = 0.0  # after each rectified layer, in training only (not in the paper; 0: none)
    source_window: int = 0  # m: source words of a joint model's input (odd, centred); 0: the plain CSLM
    source_vocab_size: int = 0  # the source shortlist, reserved symbols included (a joint model only)

    def __post_init__(self) -> None:
        """Every field checked (a config may come from a file): a UserError names the first bad one."""
        for name, least in (("vocab_size", 4), ("order", 2), ("embed", 1)):
            value = getattr(self, name)
            if not _is_int(value) or value < least:
                raise UserError(f"`{name}` must be an integer of at least {least}, not {value!r}")
        if not isinstance(self.hidden, (list, tuple)) or not self.hidden \
                or not all(_is_int(h) and h >= 1 for h in self.hidden):
            raise UserError(f"`hidden` must be a list of layer sizes of at least 1, not {self.hidden!r}")
        self.hidden = tuple(self.hidden)
        d = self.dropout
        if not isinstance(d, (int, float)) or isinstance(d, bool) or not 0 <= d < 1:
            raise UserError(f"`dropout` must be a number in [0, 1), not {d!r}")
        m, vs = self.source_window, self.source_vocab_size
        if not _is_int(m) or m < 0 or (m and m % 2 == 0):
            raise UserError(f"`source_window` must be 0 or an odd number (a window centred on a word), not {m!r}")
        if not _is_int(vs) or (m and vs < 4) or (not m and vs):
            raise UserError(f"`source_vocab_size` must be an integer of at least 4 with a source window "
                            f"(0 without one), not {vs!r}")
        r = self.init_range
        if not isinstance(r, (int, float)) or isinstance(r, bool) or not 0 <= r < float("inf"):
            raise UserError(f"`init_range` must be a finite number of at least 0, not {r!r}")

    @property
    def context(self) -> int:
        """Ids of an input row: the n-1 target history words and the m source words."""
        return self.order - 1 + self.source_window

    @property
    def joint(self) -> bool:
        return self.source_window > 0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["hidden"] = list(self.hidden)
        if not self.joint:  # a plain CSLM's config.json as before the joint model existed
            del d["source_window"], d["source_vocab_size"]
        return d


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# paper: the sizes of Sec. 4.1.2. small: trains on a few CPU cores in minutes to
# hours. tiny: for tests.
PRESETS: dict[str, dict] = {
    "paper": dict(vocab_size=15000, order=7, embed=512, hidden=(1536, 1024)),
    "small": dict(vocab_size=10000, order=7, embed=128, hidden=(512, 256)),
    "tiny": dict(vocab_size=1000, order=7, embed=16, hidden=(64, 64)),
}


def preset_config(name: str, vocab_size: int | None = None, dropout: float = 0.0, order: int | None = None,
                  source_window: int = 0, source_vocab_size: int | None = None) -> CSLMConfig:
    """A preset's sizes; `order`, the shortlists and a joint model's `source_window` replace the preset's.
    A joint model's source shortlist defaults to the target's size."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    p = dict(PRESETS[name], dropout=dropout)
    if vocab_size is not None:
        p["vocab_size"] = vocab_size
    if order is not None:
        p["order"] = order
    if source_window:
        p["source_window"] = source_window
        p["source_vocab_size"] = source_vocab_size if source_vocab_size is not None else p["vocab_size"]
    return CSLMConfig(**p)


class CSLM(nn.Module):
    def __init__(self, config: CSLMConfig):
        super().__init__()
        self.config = config
        # The shared projection matrix: row w is the continuous representation of word w.
        self.embed = nn.Embedding(config.vocab_size, config.embed)
        # The joint model's source projection (Devlin et al. 2014, Sec. 2: source and target words have
        # separate embeddings); None in a plain CSLM, whose weights are then what they always were.
        self.src_embed = nn.Embedding(config.source_vocab_size, config.embed) if config.joint else None
        sizes = [config.context * config.embed, *config.hidden]
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.out = nn.Linear(sizes[-1], config.vocab_size)

    def init_weights(self) -> None:
        """Every weight and bias uniform in [-r, r], r = 0.01 (Sec. 4.1.2)."""
        r = self.config.init_range
        for p in self.parameters():
            nn.init.uniform_(p, -r, r)

    def features(self, context: torch.Tensor) -> torch.Tensor:
        """(B, n-1+m) ids (target history, then the source window) -> (B, H) output of the last rectified layer."""
        B = context.shape[0]
        x = self.embed(context[:, : self.config.order - 1]).reshape(B, -1)  # the n-1 projections: (B, (n-1)*embed)
        if self.src_embed is not None:  # the m source projections after them: (B, (n-1+m)*embed)
            x = torch.cat([x, self.src_embed(context[:, self.config.order - 1 :]).reshape(B, -1)], dim=1)
        for layer in self.hidden:
            x = F.relu(layer(x))  # rectified layers of 1536 and 1024 units
            if self.config.dropout:  # deviation, off by default: Srivastava et al. (2014), training only
                x = F.dropout(x, self.config.dropout, self.training)
        return x

    def forward(self, context: torch.Tensor) -> torch.Tensor:
        """(B, n-1+m) ids -> (B, V) unnormalised scores; softmax gives P(w_n | history), Eq. (2)."""
        return self.out(self.features(context))

    # -- the decoder's self-normalised path (premultiplied first layer) --------------
    def first_layer_tables(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The first hidden layer premultiplied into per-position word tables (as NPLM does).

        The first rectified layer is h1 = relu(b1 + W1 [e(w_1); ...; e(w_{n-1})]), the
        projections concatenated (Sec. 4.1.2). W1 splits into one block per history
        position, W1 = [W1_1 ... W1_{n-1}] with W1_p = W1[:, p*E:(p+1)*E], so

            h1 = relu(b1 + sum_p W1_p e(w_p)) = relu(b1 + sum_p T_p[w_p]),  T_p[w] = W1_p e(w).

        Returns T: (n-1, V, H1), T[p, w] = W1_p @ embed[w]. Memory: (n-1) * V * H1 values,
        4 bytes each in float32: 123 MB for the `small` preset, 553 MB for `paper`.

        A joint model's source positions q split the same way, S_q[s] = W1_{n-1+q} src_embed[s]
        (Devlin et al. 2014, "pre-computing the hidden layer", do the same for every position): T is then
        (n-1+m, R, H1), R = max(V, source V), each position's table padded with zero rows to R.
        """
        E, cfg = self.config.embed, self.config
        W1 = self.hidden[0].weight.detach().to(dtype)  # (H1, (n-1+m)*E)
        embs = [self.embed.weight] * (cfg.order - 1) + [self.src_embed.weight] * cfg.source_window \
            if cfg.joint else [self.embed.weight] * cfg.context
        rows = max(e.shape[0] for e in embs)
        tables = [e.detach().to(dtype) @ W1[:, p * E : (p + 1) * E].T for p, e in enumerate(embs)]
        return torch.stack([F.pad(t, (0, 0, 0, rows - t.shape[0])) for t in tables])

    def features_from_tables(self, tables: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """(B, n-1+m) ids -> (B, H) last rectified layer, the first layer read from `first_layer_tables`:
        h1 = relu(b1 + sum_p T_p[w_p] (+ sum_q S_q[s_q])), then h_{k+1} = relu(W_k h_k + b_k) as in `features`."""
        V = tables.shape[1]
        offsets = torch.arange(self.config.context, device=context.device) * V  # row of T_p[w] in T viewed (C*V, H1)
        # sum_p T_p[w_p]: one lookup-and-add per history word (embedding_bag: no (B, n-1, H1) intermediate)
        summed = F.embedding_bag(context + offsets, tables.reshape(-1, tables.shape[-1]), mode="sum")
        x = F.relu(self.hidden[0].bias.detach().to(tables.dtype) + summed)
        for layer in self.hidden[1:]:
            x = F.relu(F.linear(x, layer.weight.detach().to(tables.dtype), layer.bias.detach().to(tables.dtype)))
        return x

    def output_rows(self, h: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """(B, H) features, (B,) word ids -> (B,) activations o_w = out.weight[w] . h + out.bias[w]:
        one output row per n-gram instead of the whole (B, V) layer. With a self-normalised model
        (ln Z ~ 0) o_w is used as ln P(w | h) directly; the exact value is o_w - ln sum_r exp(o_r), Eq. (2)."""
        w = F.embedding(target, self.out.weight.detach().to(h.dtype))  # (B, H)
        return (w * h).sum(dim=1) + self.out.bias.detach().to(h.dtype)[target]
