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
        r = self.init_range
        if not isinstance(r, (int, float)) or isinstance(r, bool) or not 0 <= r < float("inf"):
            raise UserError(f"`init_range` must be a finite number of at least 0, not {r!r}")

    @property
    def context(self) -> int:
        return self.order - 1

    def to_dict(self) -> dict:
        d = asdict(self)
        d["hidden"] = list(self.hidden)
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


def preset_config(name: str, vocab_size: int | None = None, dropout: float = 0.0) -> CSLMConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    p = dict(PRESETS[name], dropout=dropout)
    if vocab_size is not None:
        p["vocab_size"] = vocab_size
    return CSLMConfig(**p)


class CSLM(nn.Module):
    def __init__(self, config: CSLMConfig):
        super().__init__()
        self.config = config
        # The shared projection matrix: row w is the continuous representation of word w.
        self.embed = nn.Embedding(config.vocab_size, config.embed)
        sizes = [config.context * config.embed, *config.hidden]
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.out = nn.Linear(sizes[-1], config.vocab_size)

    def init_weights(self) -> None:
        """Every weight and bias uniform in [-r, r], r = 0.01 (Sec. 4.1.2)."""
        r = self.config.init_range
        for p in self.parameters():
            nn.init.uniform_(p, -r, r)

    def features(self, context: torch.Tensor) -> torch.Tensor:
        """(B, n-1) word ids -> (B, H) output of the last rectified layer."""
        B = context.shape[0]
        x = self.embed(context).reshape(B, -1)  # concatenate the n-1 projections: (B, (n-1)*embed)
        for layer in self.hidden:
            x = F.relu(layer(x))  # rectified layers of 1536 and 1024 units
            if self.config.dropout:  # deviation, off by default: Srivastava et al. (2014), training only
                x = F.dropout(x, self.config.dropout, self.training)
        return x

    def forward(self, context: torch.Tensor) -> torch.Tensor:
        """(B, n-1) word ids -> (B, V) unnormalised scores; softmax gives P(w_n | history), Eq. (2)."""
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
        """
        E = self.config.embed
        emb = self.embed.weight.detach().to(dtype)  # (V, E)
        W1 = self.hidden[0].weight.detach().to(dtype)  # (H1, (n-1)*E)
        return torch.stack([emb @ W1[:, p * E : (p + 1) * E].T for p in range(self.config.context)])

    def features_from_tables(self, tables: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """(B, n-1) word ids -> (B, H) last rectified layer, the first layer read from `first_layer_tables`:
        h1 = relu(b1 + sum_p T_p[w_p]), then h_{k+1} = relu(W_k h_k + b_k) as in `features`."""
        V = self.config.vocab_size
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
