"""Learning statistics of a trained network: Bahdanau et al.'s Table 2 (updates, epochs, hours,
device, train and dev NLL) for one model directory.

The training run is read back from the directory: `config.json` (the saved model's step, the data
and the training config) and `checkpoint.pt` (each held-out evaluation's step, training seconds and
rows seen). The NLLs are computed again, in float32, with the scorer that `score` and
`rescore-nbest` use: the negative natural-log probability of each target sentence (its units and
</s>) given its source, averaged over sentence pairs, as the paper's Table 2 gives it.

- train: a seeded sample of the pairs the network was trained on, rebuilt exactly as the trainer
  split them (the same file reading, --max-len filter and held-out split);
- held-out: the trainer's own held-out pairs (the perplexity it stopped and saved on);
- dev: any parallel text given, e.g. the pipeline's dev set (all its pairs, whatever their length).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from mtcommon import modeldir
from mtcommon.errors import UserError
from mtcommon.checkpoint import Checkpoint

from ..networks import modelio
from ..scoring.scorer import PhraseScorer, phrase_keys
from ..training.train import read_corpus_pairs, read_unique_pairs, split_indices


@dataclass
class NLL:
    """Summed negative log-likelihood of some sentence pairs."""

    pairs: int
    target_symbols: int  # target units + one </s> each
    total: float

    @property
    def per_pair(self) -> float:
        return self.total / max(self.pairs, 1)

    @property
    def perplexity(self) -> float:
        """Per target symbol (units and </s>)."""
        return math.exp(self.total / max(self.target_symbols, 1))


def corpus_nll(scorer: PhraseScorer, sources: list[str], targets: list[str], batch: int = 2000) -> NLL:
    """−log p(target | source) of the pairs, summed, with the target symbols it is over."""
    total, symbols = 0.0, 0
    for i in range(0, len(sources), batch):
        scores = scorer.score_keys(*phrase_keys(list(zip(sources[i : i + batch], targets[i : i + batch]))))
        total -= float(scores.log_p.sum())
        symbols += int(scores.symbols.sum())
    return NLL(len(sources), symbols, total)


@dataclass
class LearningStats:
    """One row of Table 2."""

    model_dir: str
    arch: str
    parameters: int
    updates: int  # of the saved (best) model
    epochs: float | None  # passes over the training pairs up to it; None without checkpoint.pt
    hours: float | None  # time in training steps up to it (start-up and evaluations excluded)
    device: str  # as the trainer was told (auto: a GPU where there is one), with its dtype and threads
    train_pairs: int
    train: NLL  # the sample of training pairs
    heldout: NLL
    dev: NLL | None

    def as_json(self) -> dict:
        out = asdict(self)
        for name in ("train", "heldout", "dev"):
            part = getattr(self, name)
            if part is not None:
                out[name] = {**asdict(part), "per_pair": part.per_pair, "perplexity": part.perplexity}
        return out


def learning_stats(model_dir: str, dev: tuple[str, str] | None = None, sample: int = 1000, seed: int = 1,
                   device: str = "cpu") -> LearningStats:
    """Table 2's numbers for the network in `model_dir` (trained on a table or on sentence pairs);
    `dev`: (source, target) files of tokenized text, one sentence a line; `sample`: training pairs
    to compute the train NLL on, drawn with `seed`."""
    loaded = modelio.load_model(model_dir, device)
    meta, train_cfg = loaded.meta, loaded.meta.get("train_config", {})
    if "corpus" in meta:
        sources, targets = read_corpus_pairs(*meta["corpus"], meta.get("max_len") or 0)
    elif "table" in meta:
        sources, targets = read_unique_pairs(meta["table"])
    else:
        raise UserError(f"{model_dir}: its config.json does not name the data it was trained on")
    if len(sources) != meta.get("pairs"):
        raise UserError(f"{model_dir}: trained on {meta.get('pairs')} pairs, but its data now has {len(sources)} "
                        "(changed since training?)")
    train_idx, valid_idx = split_indices(len(sources), train_cfg.get("valid_pairs", 0), train_cfg.get("seed", 1))
    chosen = np.sort(np.random.default_rng([seed, 0x7AB2]).permutation(train_idx)[:sample])
    scorer = PhraseScorer(loaded)

    def nll(index) -> NLL:
        return corpus_nll(scorer, [sources[i] for i in index], [targets[i] for i in index])

    dev_nll = None
    if dev:
        dev_sources, dev_targets = read_corpus_pairs(*dev)
        dev_nll = corpus_nll(scorer, dev_sources, dev_targets)
    step, epochs, hours = meta.get("step", 0), None, None
    try:
        history = Checkpoint.load(model_dir).loop.history
    except FileNotFoundError:
        history = []
    at = [h for h in history if h.step == step]
    if at:
        epochs, hours = at[-1].examples_seen / max(len(train_idx), 1), at[-1].train_seconds / 3600
    threads = train_cfg.get("threads")
    where = meta.get("device") or train_cfg.get("device", "?")
    return LearningStats(
        model_dir=model_dir, arch=loaded.config.arch, parameters=modeldir.parameter_count(loaded.model),
        updates=step, epochs=epochs, hours=hours,
        device=f"{where}, {train_cfg.get('dtype', 'fp32')}" + (f", {threads} thread(s)" if threads else ""),
        train_pairs=len(train_idx), train=nll(chosen), heldout=nll(valid_idx), dev=dev_nll)


def markdown(rows: list[tuple[str, dict]]) -> str:
    """Table 2 as Markdown: one row per (label, `LearningStats.as_json()`)."""
    lines = ["| Model | updates | epochs | hours | device | train NLL | held-out NLL | dev NLL |",
             "|---|---:|---:|---:|---|---:|---:|---:|"]
    for label, s in rows:
        epochs = f"{s['epochs']:.1f}" if s.get("epochs") is not None else "–"
        hours = f"{s['hours']:.2f}" if s.get("hours") is not None else "–"
        dev = f"{s['dev']['per_pair']:.1f}" if s.get("dev") else "–"
        lines.append(f"| {label} | {s['updates']:,} | {epochs} | {hours} | {s['device']} | "
                     f"{s['train']['per_pair']:.1f} | {s['heldout']['per_pair']:.1f} | {dev} |")
    return "\n".join(lines) + "\n"
