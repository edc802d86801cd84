"""The report's figures: dev BLEU per tuning iteration, the tuners side by side, the phrase
networks' training curves, and test BLEU by source length."""

from __future__ import annotations

import textwrap
from pathlib import Path

from files import save_png
from runs import PHRASE_NETWORKS
from systems import label


def _pyplot():
    """matplotlib's pyplot without a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_dev_curves(curves: dict[str, dict[str, list[float]]], output: str, title: str, tuner: str = "mert") -> None:
    """Dev BLEU per iteration of every tuning (health.dev_bleu_curves): a colour per system, a line style per seed."""
    plt = _pyplot()

    n = sum(len(runs) for runs in curves.values())
    fig, ax = plt.subplots(figsize=(7, 4.2 + 0.12 * ((n + 1) // 2)), dpi=120)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (system, runs) in enumerate(curves.items()):
        for j, (name, scores) in enumerate(runs.items()):
            ax.plot(range(1, len(scores) + 1), scores, marker="o", markersize=3, color=colours[i % len(colours)],
                    linestyle=["-", "--", ":", "-."][j % 4], label=f"{label(system)} {name}".strip())
    ax.set_xlabel(f"{tuner} iteration (1: the starting weights)")
    ax.set_ylabel("dev BLEU (tokenized, lowercased)")
    ax.set_title(textwrap.fill(title, 110), fontsize=8)  # a long label (BUDGET=1) on several lines
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.16))  # below: no curve hidden
    fig.tight_layout()
    save_png(fig, output)


def plot_tuners(curves: dict[str, dict[str, list[float]]], tuners: list[str], output: str, title: str = "") -> None:
    """Dev BLEU per iteration of every tuning: a panel per system, a colour per tuner, a line style per seed."""
    plt = _pyplot()
    import matplotlib.ticker

    fig, axes = plt.subplots(1, len(curves), figsize=(5.2 * len(curves), 4.4), dpi=120, squeeze=False, sharey=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (system, runs) in zip(axes[0], curves.items()):
        for run, scores in runs.items():
            tuner, _, seed = run.rpartition("-")
            ax.plot(range(1, len(scores) + 1), scores, marker="o", markersize=3,
                    color=colours[tuners.index(tuner) % len(colours)] if tuner in tuners else "grey",
                    linestyle=["-", "--", ":", "-."][(int(seed) - 1) % 4 if seed.isdigit() else 0],
                    label=f"{tuner}, seed {seed}")
        ax.set_title(label(system), fontsize=9)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_xlabel("tuning iteration (1: the starting weights)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=len(tuners), loc="upper center", bbox_to_anchor=(0.5, -0.2))
    axes[0][0].set_ylabel("dev BLEU (tokenized, lowercased)")
    fig.suptitle(textwrap.fill(title or "dev BLEU of each tuning iteration's 1-best output, by tuner", 120), fontsize=9)
    fig.tight_layout()
    save_png(fig, output)



def plot_training(work: Path, output: str) -> bool:
    """The held-out perplexity (per target word and </s>) of each phrase network trained under `work`
    against its updates, from the checkpoints (`moses-rnn analyze curves --x updates`); False if none."""
    from moses_rnn.analysis.analyze import training_curves, training_history

    runs = [(name, training_history(str(work / folder / "model"))) for folder, name in PHRASE_NETWORKS.items()
            if (work / folder / "model" / "checkpoint.pt").exists()]
    if runs:
        training_curves(runs, output, "Phrase networks: held-out perplexity per target word\n"
                                      "(a word model's [UNK] is one easy word: its figure reads low)", x="updates")
    return bool(runs)


def plot_lengths(buckets: list[str], series: list[tuple[str, list[float]]], output: str) -> None:
    """Test BLEU by source length (sections.length_bleu's buckets, each named with its sentence
    count) of each system or network, a line each (Bahdanau et al., Figure 2)."""
    plt = _pyplot()
    fig = plt.figure(figsize=(7, 4.2), dpi=120)
    ax = fig.add_subplot()
    for name, scores in series:
        ax.plot(range(len(buckets)), scores, marker="o", label=name)
    ax.set_xticks(range(len(buckets)), buckets)
    ax.set_xlabel("source sentence length in words (sentences)")
    ax.set_ylabel("BLEU (lowercased)")
    ax.set_title("Test BLEU by source length (tunings pooled)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, output, crop=False)
