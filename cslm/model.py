"""The feed-forward continuous-space language model (CSLM).

Cho et al. (2014), Sec. 4.1.2, after Schwenk (2007): a 7-gram model. The n-1 = 6
previous words are each projected to a 512-dimensional vector by one shared
projection matrix and concatenated (3072 values), fed through two rectified
layers of 1536 and 1024 units, and a softmax over a target shortlist gives
P(w_n | w_1 .. w_{n-1}). All weights start uniform in [-0.01, 0.01].

Deviation: one shortlist serves as both the input and the output vocabulary
(Schwenk's toolkit can use a larger input vocabulary); words outside it enter
the history as [UNK]. This keeps one id space for the model, the server and
its clients.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class CSLMConfig:
    vocab_size: int = 15000  # the shortlist, reserved symbols included
    order: int = 7  # n: n-1 words of history predict the n-th
    embed: int = 512  # projection of each history word
    hidden: tuple[int, ...] = field(default_factory=lambda: (1536, 1024))
    init_range: float = 0.01

    @property
    def context(self) -> int:
        return self.order - 1

    def to_dict(self) -> dict:
        d = asdict(self)
        d["hidden"] = list(self.hidden)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "CSLMConfig":
        known = {k: d[k] for k in ("vocab_size", "order", "embed", "hidden", "init_range") if k in d}
        if "hidden" in known:
            known["hidden"] = tuple(int(h) for h in known["hidden"])
        cfg = cls(**known)
        if cfg.order < 2 or cfg.vocab_size < 4 or cfg.embed < 1 or not cfg.hidden:
            raise ValueError(f"invalid CSLM configuration: {d}")
        return cfg


# paper: the sizes of Sec. 4.1.2. small: trains on a few CPU cores in minutes to
# hours. tiny: for tests.
PRESETS: dict[str, dict] = {
    "paper": dict(vocab_size=15000, order=7, embed=512, hidden=(1536, 1024)),
    "small": dict(vocab_size=10000, order=7, embed=128, hidden=(512, 256)),
    "tiny": dict(vocab_size=1000, order=7, embed=16, hidden=(64, 64)),
}


def preset_config(name: str, vocab_size: int | None = None) -> CSLMConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    p = dict(PRESETS[name])
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
        return x

    def forward(self, context: torch.Tensor) -> torch.Tensor:
        """(B, n-1) word ids -> (B, V) unnormalised scores; softmax gives P(w_n | history), Eq. (2)."""
        return self.out(self.features(context))

    def loss(self, context: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean negative natural-log likelihood of the targets."""
        return F.cross_entropy(self(context), target)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
