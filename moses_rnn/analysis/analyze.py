"""The paper's qualitative analysis (Cho et al. 2014, Section 4.4): Table 2 and Figures 3-5.

- `table2`: for long source phrases (4 words or more), frequent and rare
  ones, the top targets by the translation model's direct probability
  p(target | source) beside the top targets by the RNN column that
  `moses-rnn score` appended. Frequent/rare is read from the counts field
  Moses writes ("count(target) count(source) count(pair)").
- `score_scatter` (Figure 3): RNN log-probability against the translation
  model's log-probability for the pairs of a scored table, a uniform random
  sample of them when the table is large.
- `embedding_map` / `phrase_map` (Figures 4 and 5): t-SNE maps
  (scikit-learn) of the source word embeddings and of the phrase
  representations c of long phrases, with labels on a subset chosen so that
  no two labels overlap; the raw vectors are written in the TensorBoard
  projector's TSV format for other tools.

Every picture is written atomically as PNG with matplotlib's Agg backend.
"""

from __future__ import annotations

import heapq
import html
import itertools
import math
import random
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np
import torch

from mtcommon.errors import UserError
from mtcommon.textio import InputError
from mtcommon.outputs import atomic_output
from mtcommon.checkpoint import Checkpoint, Evaluation

from ..formats.phrasetable import PhrasePair, read_phrase_table, source_groups


# ---------------------------------------------------------------------------
# The columns of a scored table

#: Scores of a phrase table written by Moses's train-model.perl, before `moses-rnn score` appends its columns.
MOSES_SCORES = 4


def _is_count(value: float) -> bool:
    """Whether a score is e^k for a whole k >= 0, as `score --unknown` writes the unknown-word count
    (7 significant digits: ln within 1e-6 of k)."""
    if value < 1.0:
        return False
    k = math.log(value)
    return abs(k - round(k)) < 1e-6


def find_rnn_column(rows: Sequence[Sequence[float]], table: str) -> int:
    """The 0-based score column that `moses-rnn score` wrote, from the scores of a table's first lines.

    `score` appends the RNN's e^(log p) (at most 1) and, with `--unknown`, after it the unknown-word
    count as e^count (a whole power of e). So: the last column if it is not such a count on every
    line, else the one before it; behind at least Moses's 4 scores, and at most 1 on every line.
    Anything else is refused: the table's columns cannot be told apart without --rnn-column.
    """
    if not rows:
        return -1  # an empty table: nothing will be read
    n = len(rows[0])
    unknown = all(_is_count(r[-1]) for r in rows)
    col = n - 2 if unknown else n - 1
    if col < MOSES_SCORES or not all(r[col] <= 1.0 for r in rows):
        raise InputError(table, None, f"cannot tell which of its {n} scores is the RNN's (`moses-rnn score` writes "
                         f"e^(log p) <= 1 after Moses's {MOSES_SCORES}, then with --unknown a whole power of e): "
                         "give --rnn-column")
    return col


def scored_pairs(table: str, rnn_column: int | None = None,
                 lookahead: int = 1000) -> tuple[int, Iterator[PhrasePair]]:
    """(the RNN's column, the table's pairs): `rnn_column`, or where `find_rnn_column` finds it in the
    first `lookahead` lines. The table is read once (a stream on stdin works)."""
    pairs = read_phrase_table(table)
    if rnn_column is not None:
        return rnn_column, pairs
    head = list(itertools.islice(pairs, lookahead))
    return find_rnn_column([p.scores for p in head], table), itertools.chain(head, pairs)


def tm_and_rnn(pair: PhrasePair, table: str, tm_column: int, rnn_column: int) -> tuple[float, float]:
    """(p(target | source) of the translation model, the RNN's log p) of one line."""
    s = pair.scores
    try:
        tm, rnn = s[tm_column], s[rnn_column]
    except IndexError:
        raise InputError(table, pair.lineno, f"{len(s)} scores: no column {tm_column} or {rnn_column}") from None
    if rnn > 1.0:
        raise InputError(table, pair.lineno, f"score column {rnn_column} is {rnn:g}, more than 1: not the RNN's "
                         "e^(log p) (see --rnn-column)")
    return tm, math.log(rnn)


# ---------------------------------------------------------------------------
# Table 2


@dataclass
class SourceEntry:
    source: str
    count: float  # count(source) from the counts field
    by_tm: list[tuple[str, float]]  # (target, p(target | source)), best first
    by_rnn: list[tuple[str, float]]  # (target, log p_RNN), best first


@dataclass
class Table2:
    frequent: list[SourceEntry] = field(default_factory=list)
    rare: list[SourceEntry] = field(default_factory=list)
    long_sources: int = 0

    def markdown(self) -> str:
        out = []
        for title, rows in (("Frequent source phrases", self.frequent), ("Rare source phrases", self.rare)):
            out.append(f"### {title}\n")
            out.append("| Source | count | Translation model (p(e\\|f)) | RNN Encoder-Decoder (log p) |")
            out.append("|---|---:|---|---|")
            for e in rows:
                tm = "<br>".join(f"{_md(t)} ({p:.3g})" for t, p in e.by_tm)
                rnn = "<br>".join(f"{_md(t)} ({lp:.2f})" for t, lp in e.by_rnn)
                out.append(f"| {_md(e.source)} | {e.count:g} | {tm} | {rnn} |")
            if not rows:
                out.append("| (none) | | | |")
            out.append("")
        return "\n".join(out)


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def source_count(pair, table: str) -> float:
    """count(source) (`PhrasePair.source_count`); a line without it is an InputError naming its line."""
    try:
        count = pair.source_count
    except ValueError:
        raise InputError(table, pair.lineno, f"count {pair.fields[1].split()[1]!r} is not a number") from None
    if count is None:
        raise InputError(table, pair.lineno, "no counts field 'count(target) count(source) count(pair)' "
                         "(needed to split frequent from rare phrases)")
    return count


def table2(
    table: str,
    tm_column: int = 2,
    rnn_column: int | None = None,
    min_words: int = 4,
    per_group: int = 5,
    top: int = 3,
    rare_max: float = 2,
    min_targets: int = 2,
    seed: int = 1,
) -> Table2:
    """Table 2 from a table scored by `moses-rnn score` (its RNN column is `rnn_column`, found
    by `find_rnn_column` when None).

    Frequent: the `per_group` long sources with the highest count(source).
    Rare: `per_group` long sources drawn at random (seeded) among those with
    count(source) <= `rare_max`. Only sources with at least `min_targets`
    targets are considered. The table must be grouped by source phrase, as
    Moses writes it; it is streamed, so any size works.
    """
    rng = random.Random(seed)
    frequent: list[tuple[float, str, SourceEntry]] = []  # min-heap on count
    rare: list[SourceEntry] = []
    rare_seen = 0
    seen: set[int] = set()
    result = Table2()
    rnn_column, pairs = scored_pairs(table, rnn_column)
    for source, group in source_groups(pairs):
        if len(source.split()) < min_words:
            continue
        key = hash(source)
        if key in seen:
            raise InputError(table, group[0].lineno, f"source {source!r} seen again: the table is not grouped by source")
        seen.add(key)
        result.long_sources += 1
        if len(group) < min_targets:
            continue
        count = source_count(group[0], table)
        is_rare = count <= rare_max
        if not is_rare and len(frequent) == per_group and (count, source) <= frequent[0][:2]:
            continue
        if is_rare:  # reservoir sampling: each rare source kept with probability per_group / seen
            rare_seen += 1
            slot = len(rare) if len(rare) < per_group else rng.randrange(rare_seen)
            if slot >= per_group:
                continue
        scored = [(p.target, *tm_and_rnn(p, table, tm_column, rnn_column)) for p in group]
        by_tm = sorted(scored, key=lambda x: (-x[1], x[0]))[:top]
        by_rnn = sorted(scored, key=lambda x: (-x[2], x[0]))[:top]
        entry = SourceEntry(source, count, [(t, p) for t, p, _ in by_tm], [(t, lp) for t, _, lp in by_rnn])
        if is_rare:
            if slot < len(rare):
                rare[slot] = entry
            else:
                rare.append(entry)
        elif len(frequent) < per_group:
            heapq.heappush(frequent, (count, source, entry))
        else:
            heapq.heapreplace(frequent, (count, source, entry))
    result.frequent = [e for _, _, e in sorted(frequent, key=lambda x: (-x[0], x[1]))]
    result.rare = sorted(rare, key=lambda e: e.source)
    return result


# ---------------------------------------------------------------------------
# Figure 3


def sample_scores(table: str, tm_column: int = 2, rnn_column: int | None = None, max_points: int = 50000,
                  seed: int = 1):
    """(log p_TM, log p_RNN, total pairs) for a uniform random sample (reservoir) of the table's pairs
    (`rnn_column` None: found by `find_rnn_column`)."""
    rng = random.Random(seed)
    xs, ys, n = [], [], 0
    rnn_column, pairs = scored_pairs(table, rnn_column)
    for pair in pairs:
        tm, y = tm_and_rnn(pair, table, tm_column, rnn_column)
        x = math.log(tm)
        n += 1
        if len(xs) < max_points:
            xs.append(x)
            ys.append(y)
        else:
            j = rng.randrange(n)
            if j < max_points:
                xs[j], ys[j] = x, y
    return np.array(xs), np.array(ys), n


def missing_extra(e: ImportError) -> UserError:
    """The one-line error for a package of the `analysis` extra that is not installed."""
    package = (e.name or "matplotlib").split(".")[0]
    return UserError(f"{package} is not installed; the analysis pictures need the `analysis` extra: "
                     "pip install 'moses-rnn[analysis]'")


def _pyplot():
    try:
        import matplotlib
    except ImportError as e:
        raise missing_extra(e) from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str, dpi: int = 150) -> None:
    with atomic_output(path, compress=False) as f:
        fig.savefig(f, format="png", dpi=dpi, bbox_inches="tight")


def score_scatter(table: str, output: str, tm_column: int = 2, rnn_column: int | None = None,
                  max_points: int = 50000, seed: int = 1) -> dict:
    """Figure 3 as PNG; returns the number of pairs, points drawn and the correlations."""
    x, y, n = sample_scores(table, tm_column, rnn_column, max_points, seed)
    if len(x) == 0:
        raise InputError(table, None, "no phrase pairs")
    pearson = float(np.corrcoef(x, y)[0, 1]) if len(x) > 1 and x.std() > 0 and y.std() > 0 else float("nan")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    alpha = float(np.clip(2000 / len(x), 0.05, 0.8))
    ax.scatter(x, y, s=4, alpha=alpha, color="tab:blue", edgecolors="none", rasterized=True)
    ax.set_xlabel("translation model log p(target | source)")
    ax.set_ylabel("RNN log p(target | source)")
    drawn = f"{len(x):,} of {n:,} pairs" if len(x) < n else f"{n:,} pairs"
    ax.set_title(f"Phrase-pair scores ({drawn}), Pearson r = {pearson:.2f}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend([ax.scatter([], [], s=12, color="tab:blue")],
              ["one phrase pair" + (" (a uniform sample)" if len(x) < n else "")], loc="lower left", fontsize=9)
    save_figure(fig, output)
    plt.close(fig)
    return {"pairs": n, "points": len(x), "pearson": pearson}


# ---------------------------------------------------------------------------
# Figures 4 and 5


def tsne_2d(vectors: np.ndarray, seed: int = 1, perplexity: float = 30.0) -> np.ndarray:
    """2-D t-SNE (scikit-learn, Barnes-Hut) of the rows of `vectors`."""
    try:
        from sklearn.manifold import TSNE
    except ImportError as e:
        raise missing_extra(e) from None

    n = len(vectors)
    if n < 3:
        raise UserError(f"t-SNE needs at least 3 points, got {n}")
    perplexity = min(perplexity, (n - 1) / 3)  # scikit-learn requires perplexity < n
    return TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed).fit_transform(
        np.asarray(vectors, dtype=np.float32)
    )


def write_vectors(path: str, labels: Sequence[str], vectors: np.ndarray) -> tuple[str, str]:
    """PATH.vectors.tsv and PATH.labels.tsv (TensorBoard projector format), written atomically."""
    vec_path, lab_path = f"{path}.vectors.tsv", f"{path}.labels.tsv"
    with atomic_output(vec_path, compress=False) as f:
        f.write("".join("\t".join(f"{v:.6g}" for v in row) + "\n" for row in np.asarray(vectors).tolist()).encode())
    with atomic_output(lab_path, compress=False) as f:
        f.write("".join(label.replace("\t", " ") + "\n" for label in labels).encode("utf-8"))
    return vec_path, lab_path


Box = tuple[float, float, float, float]  # x0, y0, x1, y1 in display units (pixels)

# Where a label may go beside its point, in order of preference: right-above, left-above, right-below, left-below.
LABEL_CORNERS = ((1, 1), (-1, 1), (1, -1), (-1, -1))


def _apart(a: Box, b: Box, gap: float) -> bool:
    """Whether boxes `a` and `b` are at least `gap` apart along x or along y."""
    return a[0] >= b[2] + gap or b[0] >= a[2] + gap or a[1] >= b[3] + gap or b[1] >= a[3] + gap


def place_label(anchor: tuple[float, float], size: tuple[float, float], labels: Sequence[Box], dots: Sequence[Box],
                frame: Box, gap: float, shift: float) -> Box | None:
    """The box of a label of `size` (width, height) beside the point at `anchor`: the first corner of
    LABEL_CORNERS, `shift` away from the point, whose box lies inside `frame`, `gap` away from every
    label already drawn and clear of every labelled point (`dots`); None when no corner is free."""
    (x, y), (w, h) = anchor, size
    for sx, sy in LABEL_CORNERS:
        x0 = x + shift if sx > 0 else x - shift - w
        y0 = y + shift if sy > 0 else y - shift - h
        box = (x0, y0, x0 + w, y0 + h)
        inside = frame[0] <= x0 and box[2] <= frame[2] and frame[1] <= y0 and box[3] <= frame[3]
        if inside and all(_apart(box, t, gap) for t in labels) and all(_apart(box, d, 0) for d in dots):
            return box
    return None


def labelled_map(points: np.ndarray, labels: Sequence[str], output: str, title: str,
                 max_labels: int = 150, fontsize: float = 7.0, figsize=(11, 9),
                 what: str = "words") -> list[tuple[int, Box]]:
    """Scatter `points` (a t-SNE map) and label them in order of `labels` (most important first):
    each label at the first free corner beside its point (`place_label`), at least half a font size
    from every label and labelled point already drawn, or not at all. Returns (index, box) of each
    label drawn, its box as measured on the figure (display units)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=figsize)
    ax.scatter(points[:, 0], points[:, 1], s=6, color="0.6", edgecolors="none")
    ax.set_title(title, fontsize=11)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_xlabel("t-SNE dimension 1")
    ax.set_ylabel("t-SNE dimension 2")
    pad = 0.03 * (points.max(0) - points.min(0) + 1e-9)
    ax.set_xlim(points[:, 0].min() - pad[0], points[:, 0].max() + pad[0])
    ax.set_ylim(points[:, 1].min() - pad[1], points[:, 1].max() + pad[1])
    renderer = fig.canvas.get_renderer()
    frame = tuple(ax.get_window_extent(renderer).extents)
    px = fig.dpi / 72  # display units per point
    gap, shift, dot = 0.5 * fontsize * px, 2 * px, 1.5 * px
    taken: list[Box] = []  # the labels drawn
    dots: list[Box] = []  # their points
    drawn: list[tuple[int, Box]] = []
    for i, label in enumerate(labels[: len(points)]):
        if len(drawn) >= max_labels:
            break
        # Moses-escaped tokens (&apos; &quot; &#124; ...) are shown unescaped
        text = ax.text(0, 0, html.unescape(label), fontsize=fontsize, ha="left", va="bottom")
        extent = text.get_window_extent(renderer)
        x, y = ax.transData.transform(points[i])
        box = place_label((x, y), (extent.width, extent.height), taken, dots, frame, gap, shift)
        if box is None:
            text.remove()
            continue
        text.set_position(ax.transData.inverted().transform((box[0], box[1])))
        drawn.append((i, tuple(text.get_window_extent(renderer).extents)))
        taken.append(box)
        dots.append((x - dot, y - dot, x + dot, y + dot))
        ax.scatter(points[i, 0], points[i, 1], s=8, color="tab:red", edgecolors="none")
    handles = [ax.scatter([], [], s=12, color="tab:red"), ax.scatter([], [], s=12, color="0.6")]
    ax.legend(handles, [f"{what}, labelled (most frequent first, where a label fits)", f"other {what}"],
              loc="upper center", bbox_to_anchor=(0.5, -0.04), ncol=2, frameon=False, fontsize=9)
    save_figure(fig, output)
    plt.close(fig)
    return drawn


@dataclass
class MapResult:
    points: int
    labels: int
    vectors: tuple[str, str] | None


def embedding_map(loaded, output: str, words: int = 1000, labels: int = 150, side: str = "source",
                  vectors: str | None = None, seed: int = 1) -> MapResult:
    """Figure 4: the `words` most frequent shortlist words' embeddings, t-SNE to 2-D."""
    model = loaded.model
    if side == "source":
        vocab, table = loaded.src_vocab, model.source_embeddings()
    elif side == "target":
        vocab, table = loaded.tgt_vocab, model.target_embeddings()
    else:
        raise ValueError(f"side must be 'source' or 'target', not {side!r}")
    ids = [i for i, w in enumerate(vocab.words) if vocab.counts[i] > 0][:words]  # reserved symbols have count 0
    names = vocab.decode(ids)
    emb = table.weight.detach()[ids].float().cpu().numpy()
    points = tsne_2d(emb, seed)
    drawn = labelled_map(points, names, output, f"{side.capitalize()} word embeddings (t-SNE, {len(ids)} "
                         f"most frequent words)", labels, what="words")
    return MapResult(len(ids), len(drawn), write_vectors(vectors, names, emb) if vectors else None)


def long_sources(table: str, min_words: int = 4, limit: int = 1000) -> list[str]:
    """The `limit` long source phrases of `table` with the highest count(source) (first seen if no counts)."""
    heap: list[tuple[float, int, str]] = []
    seen: set[str] = set()
    order = 0
    for pair in read_phrase_table(table):
        s = pair.source
        if s in seen or len(s.split()) < min_words:
            continue
        seen.add(s)
        f = pair.fields
        counts = f[1].split() if len(f) >= 2 else []
        count = float(counts[1]) if len(counts) >= 2 else 0.0
        order += 1
        item = (count, -order, s)  # ties: earlier phrase first
        if len(heap) < limit:
            heapq.heappush(heap, item)
        elif item > heap[0]:
            heapq.heapreplace(heap, item)
    return [s for _, _, s in sorted(heap, reverse=True)]


@torch.inference_mode()
def phrase_vectors(loaded, phrases: Sequence[str], batch: int = 256) -> np.ndarray:
    """Phrase representations (PhraseModel.phrase_vector): the summary c = tanh(V h_N) of the
    encoder-decoder (Cho et al., Appendix A.1.1); for RNNsearch, [h->_N ; h<-_1]."""
    model = loaded.model
    dev = next(model.parameters()).device
    out = []
    for i in range(0, len(phrases), batch):
        flat, lens = loaded.src_vocab.encode_phrases(phrases[i : i + batch])
        ids = [x.tolist() for x in np.split(flat, np.cumsum(lens)[:-1])]
        T = max(len(x) for x in ids)
        src = torch.tensor([x + [0] * (T - len(x)) for x in ids], dtype=torch.long, device=dev)
        mask = torch.tensor([[True] * len(x) + [False] * (T - len(x)) for x in ids], device=dev)
        v = model.phrase_vector(src, mask)
        out.append(v.float().cpu().numpy())
    return np.concatenate(out)


def phrase_map(loaded, table: str, output: str, phrases: int = 1000, labels: int = 60, min_words: int = 4,
               vectors: str | None = None, seed: int = 1) -> MapResult:
    """Figure 5: t-SNE map of the representations of the table's most frequent long source phrases."""
    chosen = long_sources(table, min_words, phrases)
    if len(chosen) < 3:
        raise InputError(table, None, f"only {len(chosen)} source phrases of {min_words} or more words")
    vecs = phrase_vectors(loaded, chosen)
    points = tsne_2d(vecs, seed)
    drawn = labelled_map(points, chosen, output, f"Phrase representations (t-SNE, {len(chosen)} source phrases "
                         f"of {min_words}+ words)", labels, fontsize=6.5, what="phrases")
    return MapResult(len(chosen), len(drawn), write_vectors(vectors, chosen, vecs) if vectors else None)


def training_history(model_dir: str) -> list[Evaluation]:
    """Held-out perplexity after each evaluation of a training run (from its checkpoint.pt).
    Works for both networks."""
    return Checkpoint.load(model_dir).loop.history


def training_curves(runs: Sequence[tuple[str, list[Evaluation]]], output: str, title: str = "Held-out perplexity",
                    reference: tuple[str, float] | None = None, log_y: bool = True, x: str = "minutes") -> None:
    """Held-out perplexity against training minutes (`x="updates"`: against updates), one line per
    (label, history) run.

    `reference` (label, perplexity) draws a horizontal line, e.g. a KenLM
    5-gram's perplexity on the same held-out tokens.
    """
    if x not in ("minutes", "updates"):
        raise ValueError(f"x must be 'minutes' or 'updates', not {x!r}")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, history in runs:
        if not history:
            raise UserError(f"run {label!r} has no held-out evaluation yet")
        ax.plot([h.train_seconds / 60 if x == "minutes" else h.step for h in history],
                [h.valid_ppl for h in history], marker="o", markersize=3, label=label)
    if reference is not None:
        ax.axhline(reference[1], color="grey", linestyle="--", label=f"{reference[0]} ({reference[1]:.1f})")
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel("training minutes (steps only, evaluation excluded)" if x == "minutes" else "updates")
    ax.set_ylabel("held-out perplexity per word")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    save_figure(fig, output)
    plt.close(fig)
