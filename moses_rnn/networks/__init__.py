"""The phrase models: their base and interface (modelbase), the RNN Encoder-Decoder (model),
RNNsearch (rnnsearch), and a phrase model's directory (modelio)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Architecture:
    """One network, as `--arch` and a config.json name it."""

    title: str  # the name the literature gives it (Bahdanau et al.'s), which reports show
    model: str  # the name of its class in this package (`modelio` builds it)
    presets: dict[str, dict]  # preset name -> sizes (`modelbase.preset_config`)


#: The architectures, the one list of them, without torch (for the command line). Sizes: the encoder-decoder's
#: `paper` is Cho et al.'s supplementary material; RNNsearch's, Bahdanau et al., 2015, Section 4.2 (620-d
#: embeddings, 1000 hidden units per direction and in the decoder and alignment model, 500 maxout units,
#: a full-rank output matrix); the others keep each one's structure at sizes that train on a laptop CPU.
ARCHITECTURES: dict[str, Architecture] = {
    "encdec": Architecture("RNNencdec", "EncoderDecoder", {
        "paper": dict(vocab=15000, embed=100, hidden=1000, maxout=500, out_rank=100),
        "small": dict(vocab=15000, embed=64, hidden=256, maxout=128, out_rank=64),
        "tiny": dict(vocab=256, embed=16, hidden=32, maxout=16, out_rank=16),
    }),
    "rnnsearch": Architecture("RNNsearch", "RNNSearch", {
        "paper": dict(vocab=15000, embed=620, hidden=1000, align=1000, maxout=500, out_rank=500),
        "small": dict(vocab=15000, embed=64, hidden=256, align=256, maxout=128, out_rank=64),
        "tiny": dict(vocab=2000, embed=16, hidden=32, align=32, maxout=16, out_rank=16),
    }),
}

ARCHS = tuple(ARCHITECTURES)
ARCH_TITLES = {name: a.title for name, a in ARCHITECTURES.items()}
#: The preset names every architecture has: what `--preset` offers.
PRESET_NAMES = tuple(name for name in ARCHITECTURES[ARCHS[0]].presets
                     if all(name in a.presets for a in ARCHITECTURES.values()))
