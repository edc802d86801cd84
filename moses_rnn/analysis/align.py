"""Soft alignments of an RNNsearch model, drawn as in Bahdanau et al. (2015), Figure 3.

Each row of the matrix is alpha_i (the weights of target word i over the
source words), each column a source word; white is 1, black 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mtcommon.errors import UserError
from mtcommon.vocab import EOS

from ..generation.generate import Generator
from .analyze import _pyplot, save_figure


@dataclass
class Alignment:
    source: list[str]
    target: list[str]  # target words then </s>
    weights: np.ndarray  # alpha [len(target), len(source)]; rows sum to 1


@torch.inference_mode()
def soft_alignment(loaded, source: str, target: str | None = None, beam: int = 5) -> Alignment:
    """alpha of (source, target); with no target, of the model's beam-search translation."""
    model = loaded.model
    if not model.has_attention:
        raise UserError(f"this model has no alignment (architecture {loaded.config.arch!r}); train with --arch rnnsearch")
    if not source.split():
        raise UserError("empty source sentence")
    gen = Generator(loaded)
    if target is None:
        target = gen.beam_search([source], beam=beam)[0][0].text
    # the units the network reads and predicts: words, or subword units (the picture labels each)
    src_words, tgt_words = loaded.src_vocab.units(source), loaded.tgt_vocab.units(target)
    return Alignment(src_words, tgt_words + [EOS], gen.attention(source, target))


def pick_lines(lines: list[str], count: int = 4, shortest: int = 10, longest: int = 20) -> list[int]:
    """0-based indices of the first `count` lines of `shortest` to `longest` words (the paper's Figure 3
    shows sentences of that kind)."""
    return [i for i, line in enumerate(lines) if shortest <= len(line.split()) <= longest][:count]


def draw_alignment(a: Alignment, output: str, title: str = "RNNsearch soft alignment") -> None:
    """The heat map as PNG: source words along the top, target words down the side, a colour bar
    for the weights (white 1, black 0)."""
    draw_alignments([a], output, [title])


def draw_alignments(alignments: list[Alignment], output: str, titles: list[str], suptitle: str | None = None) -> None:
    """Several heat maps in one PNG, two a row (Figure 3's layout), each with its own title and colour bar."""
    plt = _pyplot()
    cell = 0.42
    cols = min(2, len(alignments))
    rows = (len(alignments) + cols - 1) // cols
    width = max(max(4.2, 3.0 + cell * len(a.source)) for a in alignments)
    height = max(max(3.2, 2.0 + cell * len(a.target)) for a in alignments)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax, a, title in zip(axes.flat, alignments, titles):
        S, T = len(a.source), len(a.target)
        image = ax.imshow(a.weights, cmap="gray", vmin=0.0, vmax=1.0, aspect="equal", interpolation="nearest")
        ax.set_xticks(range(S))
        ax.set_xticklabels(a.source, rotation=90, fontsize=10)
        ax.set_yticks(range(T))
        ax.set_yticklabels(a.target, fontsize=10)
        ax.xaxis.tick_top()
        ax.xaxis.set_label_position("top")
        ax.tick_params(length=0)
        ax.set_xlabel("source words j")
        ax.set_ylabel("target words i (and </s>)")
        ax.set_title(title, fontsize=11, pad=10)
        bar = fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
        bar.set_label("alignment weight α_ij (each row sums to 1)")
    for ax in list(axes.flat)[len(alignments):]:
        ax.axis("off")
    if suptitle:
        fig.suptitle(suptitle, fontsize=12)
    fig.tight_layout()
    save_figure(fig, output, dpi=150 if len(alignments) == 1 else 100)
    plt.close(fig)
