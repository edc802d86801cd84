"""Training the CSLM on a tokenized monolingual corpus.

Cho et al. (2014), Sec. 4.1.2: 7-grams of the target corpus, weights uniform in
[-0.01, 0.01], a random 0.1% held out, training stopped once held-out
perplexity has not improved for 10 epochs; the best weights are kept.

Deviations: the paper does not name its optimiser; we use Adam (lr 1e-3),
which reaches a given perplexity in far fewer updates than the plain SGD of
the CSLM toolkit (`--optimizer sgd` is available). Two recipes: `paper`
(minibatches of 256 n-grams, float32) and `fast`, the default (minibatches of
1,024 n-grams, `--dtype auto`: bfloat16 autocast with float32 master weights
where the hardware computes in bfloat16 natively and, on a CPU, that is the
faster on the run's first batch): larger matrix products run nearer the
machine's arithmetic rate, at the same objective.

Noise-contrastive estimation (`objective="nce"`, beside the paper's softmax; Mnih & Teh 2012,
Vaswani et al. 2013, as NPLM trains the LMs Moses loads): instead of normalising over the
shortlist, each update tells the observed word from `noise_samples` words drawn from the
training unigram distribution q, the model's unnormalised score o_w standing for ln P(w | h)
(Z fixed at 1). The output layer costs k+1 rows an n-gram instead of V. The model is
self-normalised by construction, and decoders use o_w as they do after `self_norm` training.
Held-out perplexity stays exact. It is an option, not the default: what it gave at the
pipeline's budget is in docs/cslm.md ("Training").

Self-normalisation (Devlin et al., 2014, Sec. 2.1): `self_norm` = alpha adds
alpha * (log Z(h))^2 to each n-gram's loss, Z(h) the softmax normaliser of its
history, so that a decoder may use the unnormalised score (log Z ~ 0) and
skip the softmax. 0 (the default) trains the plain normalised model; held-out
perplexity is always measured with the exact softmax. The held-out set is 0.1% of
the *sentences* (at least one), so no held-out n-gram shares a sentence with a
training n-gram; `valid_text` measures held-out perplexity on another text instead
(the held-out sentences still stay out of training), so that early stopping and the
best weights follow the test's domain, where a longer run can fit the training domain
at the test domain's expense (docs/cslm.md). An "epoch" is one pass over the training n-grams unless
`epoch_ngrams` makes it shorter (useful on large corpora: evaluation,
checkpointing and early stopping then happen every `epoch_ngrams` n-grams).

The joint model (NNJM, `cslm.model`) trains on the same loop: `source` and `alignment` name the
source text and the word alignment beside the target corpus (`cslm.data.SourceSide`). They are
training data as the corpus is: a resumed run must be given the same files (compared by their bytes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from mtcommon.errors import UserError
from mtcommon.runtime import is_big, upload
from mtcommon.trainer import Schedule, Trainer, adam, apply_recipe, lr_factor
from mtcommon.vocab import BOS, EOS

from . import modeldir
from .data import RESERVED, SourceSide, build_vocab, heldout_ngrams, scan_corpus, stream_batches
from .model import CSLM, preset_config

RECIPES: dict[str, dict] = {
    "paper": dict(batch_size=256, dtype="fp32"),
    "fast": dict(batch_size=1024, dtype="auto"),
}


@dataclass
class TrainConfig:
    preset: str = "small"
    recipe: str = "fast"  # "paper" or "fast"; fields left None take the recipe's value
    vocab_size: int | None = None  # shortlist size; default: the preset's
    order: int | None = None  # n; default: the preset's (7), a joint model's 4 (Devlin et al. 2014)
    source: str | None = None  # a joint model's source text, one line per corpus line
    alignment: str | None = None  # its word alignment (Moses's `i-j` pairs), one line per corpus line
    source_window: int | None = None  # m source words, odd; default with a source: 11 (Devlin et al. 2014)
    source_vocab_size: int | None = None  # the source shortlist; default: the target's size
    batch_size: int | None = None
    dtype: str | None = None  # "auto" (the faster where both run, runtime.probe_dtype), "bf16" or "fp32"
    optimizer: str = "adam"
    lr: float | None = None  # default: 1e-3 (adam), 0.05 (sgd)
    lr_schedule: str = "constant"  # "constant" (the paper), "linear" or "cosine" to 0 over the budget (mtcommon.trainer)
    dropout: float = 0.0  # after each rectified layer while training (CSLMConfig.dropout); 0: none, as in the paper
    self_norm: float = 0.0  # alpha of the (log Z)^2 penalty (Devlin et al. 2014); 0: none
    objective: str = "softmax"  # "softmax" (the paper's cross-entropy) or "nce" (noise-contrastive estimation)
    noise_samples: int = 100  # k: noise words per update under "nce", shared by the batch's n-grams
    valid_fraction: float = 0.001
    valid_text: str | None = None  # measure held-out perplexity here instead (text of the test's domain)
    patience: int = 10  # epochs without held-out improvement before stopping
    max_epochs: int = 100
    max_minutes: float | None = None
    epoch_ngrams: int | None = None  # n-grams per epoch; default: one pass over the corpus
    seed: int = 1
    device: str = "auto"
    threads: int | None = None  # CPU threads; default: tuned while training

    def __post_init__(self):
        apply_recipe(self, RECIPES)
        if self.objective not in OBJECTIVES:
            raise UserError(f"objective must be one of {', '.join(OBJECTIVES)}, not {self.objective!r}")
        if self.objective == "nce" and self.self_norm:
            raise UserError("--self-norm is a penalty on the softmax's ln Z; NCE self-normalises by itself: "
                            "give one of --objective nce and --self-norm")
        lr_factor(self.lr_schedule, 0.0)  # an unknown schedule is a UserError here
        if (self.source is None) != (self.alignment is None):
            raise UserError("a joint model trains on --source and --alignment together: give both")
        if self.source is None:
            for name in ("source_window", "source_vocab_size"):
                if getattr(self, name) is not None:
                    raise UserError(f"--{name.replace('_', '-')} is for a joint model: give --source and --alignment")
        else:
            if self.source_window is None:
                self.source_window = DEFAULT_SOURCE_WINDOW
            if self.order is None:
                self.order = DEFAULT_JOINT_ORDER
            if self.valid_text:
                raise UserError("--valid-text measures a target-only model: a joint model's held-out perplexity "
                                "is measured on held-out sentences of its own corpus")
            if self.source_vocab_size is not None and (not isinstance(self.source_vocab_size, int)
                                                       or self.source_vocab_size <= len(RESERVED)):
                raise UserError(f"--source-vocab-size must be more than the {len(RESERVED)} reserved symbols, "
                                f"not {self.source_vocab_size!r}")
        if self.vocab_size is not None and (not isinstance(self.vocab_size, int) or self.vocab_size <= len(RESERVED)):
            raise UserError(f"--vocab-size must be more than the {len(RESERVED)} reserved symbols, "
                            f"not {self.vocab_size!r}")
        # the model's fields, checked before the data is read
        shortlist = self.model_config().vocab_size
        if not isinstance(self.noise_samples, int) or self.noise_samples < 1 or \
                (self.objective == "nce" and self.noise_samples > shortlist):
            # k noise words an update, each a row of the output layer: more than the shortlist's words
            # is no better an estimate, only slower (at a million, minutes an update)
            raise UserError(f"--noise-samples must be between 1 and the shortlist's {shortlist} words, "
                            f"not {self.noise_samples}")


    def model_config(self):
        """The model's sizes: the preset's, with the sizes this config gives (checked: a UserError)."""
        return preset_config(self.preset, self.vocab_size, self.dropout, self.order, self.source_window or 0,
                             self.source_vocab_size)


OBJECTIVES = ("softmax", "nce")
# Devlin et al. (2014): a 4-gram target history (n = 4: three words before the predicted one) and an
# 11-word source window
DEFAULT_JOINT_ORDER = 4
DEFAULT_SOURCE_WINDOW = 11


@torch.no_grad()
def heldout_nll(model: CSLM, ngrams: np.ndarray, device, batch_size: int = 4096) -> tuple[float, int]:
    """(sum of -ln P(w_n | history), number of n-grams), with the exact softmax."""
    total = 0.0
    for i in range(0, len(ngrams), batch_size):
        b = torch.from_numpy(ngrams[i : i + batch_size].astype(np.int64)).to(device)
        total += float(F.cross_entropy(model(b[:, :-1]), b[:, -1], reduction="sum"))
    return total, len(ngrams)


class NgramObjective(torch.nn.Module):
    """Sum over the batch of -ln P(w_n | w_1..w_{n-1}) (+ alpha (log Z)^2, Devlin et al. 2014)."""

    def __init__(self, model: CSLM, self_norm: float):
        super().__init__()
        self.model, self.self_norm = model, self_norm

    def forward(self, context: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = self.model(context).float()
        if not self.self_norm:
            return F.cross_entropy(logits, target, reduction="sum")
        log_z = torch.logsumexp(logits, dim=1)
        picked = logits.gather(1, target[:, None]).squeeze(1)
        return (log_z - picked).sum() + self.self_norm * (log_z * log_z).sum()


class NceObjective(torch.nn.Module):
    """Noise-contrastive estimation (Mnih & Teh 2012; Vaswani et al. 2013), summed over the batch.

    With the model's unnormalised score s(w, h) = o_w as ln P(w | h) (Z = 1) and k noise words
    from the unigram distribution q, D(w, h) = s(w, h) - ln(k q(w)) is the log-odds that w came
    from the data rather than the noise; the loss of an n-gram with word w and noise words n_1..n_k is

        -ln sigmoid(D(w, h)) - sum_j ln sigmoid(-D(n_j, h)).

    Deviation: the k noise words are drawn once per update and shared by its n-grams (one (B, H) x
    (H, k) product instead of B gathers of k rows), as sampled-softmax implementations do."""

    def __init__(self, model: CSLM, log_kq: torch.Tensor):
        super().__init__()
        self.model = model
        self.register_buffer("log_kq", log_kq, persistent=False)  # ln(k q(w)) of every shortlist word

    def forward(self, context: torch.Tensor, target: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        h = self.model.features(context)
        out = self.model.out
        data = (h * out.weight[target]).sum(1).float() + out.bias[target].float() - self.log_kq[target]
        noise_scores = (h @ out.weight[noise].T).float() + out.bias[noise].float() - self.log_kq[noise]
        return -(F.logsigmoid(data).sum() + F.logsigmoid(-noise_scores).sum())


def noise_distribution(vocab, counts, sentences: int) -> np.ndarray:
    """q(w) over the shortlist: the training corpus's unigram frequencies of the words the model predicts,
    [UNK] taking the words outside the shortlist, </s> one per sentence, <s> never predicted (0)."""
    freq = np.array([counts.get(w, 0) for w in vocab.words], np.float64)
    freq[vocab.index[BOS]] = 0.0
    freq[vocab.index[EOS]] = sentences
    freq[vocab.unk_id] = sum(counts.values()) - sum(counts.get(w, 0) for w in vocab.words if w != vocab.unk)
    return freq / freq.sum()


class NgramTrainer(Trainer):
    unit = "ngrams"
    data_fields = ("source", "alignment")  # a joint model's data beside the corpus: fingerprinted with it
    path_fields = ("valid_text",)

    def data_paths(self, cfg) -> list[str]:
        return [self.data] + ([cfg.source, cfg.alignment] if cfg.source else [])

    def prepare(self) -> Schedule:
        cfg = self.cfg
        self.side = SourceSide(cfg.source, cfg.alignment, cfg.source_window) if cfg.source else None
        self.info = info = scan_corpus(self.data, cfg.valid_fraction, cfg.seed, self.side)
        if self.resumed:
            self.model_cfg, _ = modeldir.read_config(self.model_dir)
            self.vocab = modeldir.load_vocab(self.model_dir, self.model_cfg.vocab_size)
            if self.side:
                self.side.vocab = modeldir.load_vocab(self.model_dir, self.model_cfg.source_vocab_size,
                                                      modeldir.SRC_VOCAB)
        else:
            self.model_cfg = cfg.model_config()
            self.vocab = build_vocab(info.counts, self.model_cfg.vocab_size)
            self.model_cfg.vocab_size = len(self.vocab)  # a small corpus may have fewer distinct words
            if self.side:
                self.side.vocab = build_vocab(info.source_counts, self.model_cfg.source_vocab_size)
                self.model_cfg.source_vocab_size = len(self.side.vocab)
            if self.dist.is_main:
                modeldir.save_vocab(self.model_dir, self.vocab)
                if self.side:
                    modeldir.save_vocab(self.model_dir, self.side.vocab, modeldir.SRC_VOCAB)
        if cfg.valid_text:  # early stopping and the best weights follow the test's domain, not the corpus's
            self.valid = heldout_ngrams(cfg.valid_text, self.vocab, None, self.model_cfg.order)
            if not len(self.valid):
                raise UserError(f"{cfg.valid_text}: no sentence to measure perplexity on")
        else:
            self.valid = heldout_ngrams(self.data, self.vocab, info.heldout_lines, self.model_cfg.order, self.side)
        per_pass = info.train_ngrams // cfg.batch_size
        if per_pass == 0:
            raise UserError(f"{self.data}: {info.train_ngrams} training n-grams, fewer than one batch of "
                             f"{cfg.batch_size}")
        steps_per_epoch = max(1, min(per_pass, (cfg.epoch_ngrams or info.train_ngrams) // cfg.batch_size))
        self._stream = None
        self.noise_q = None
        if cfg.objective == "nce":
            self.noise_q = noise_distribution(self.vocab, info.counts, info.lines - len(info.heldout_lines))
        return Schedule(cfg.max_epochs * steps_per_epoch, steps_per_epoch, cfg.patience, limit="max_epochs")

    def big_model(self) -> bool:
        return is_big(self.model_cfg)

    def build_model(self) -> CSLM:
        model = CSLM(self.model_cfg)
        model.init_weights()  # uniform in [-0.01, 0.01] (Sec. 4.1.2)
        if self.cfg.objective == "nce":
            # Vaswani et al. (2013), Sec. 2: output biases start at -ln V, so that Z(h) ~ 1 from the first
            # update. NCE never normalises, and a word the noise seldom draws keeps the score it starts
            # with: from 0 (Z ~ V), ln Z(h) stayed near 14 after an epoch of the shared corpus.
            with torch.no_grad():
                model.out.bias.fill_(-math.log(self.model_cfg.vocab_size))
        return model

    def build_optimizer(self, model):
        cfg = self.cfg
        if cfg.optimizer == "adam":
            return adam(model.parameters(), cfg.lr or 1e-3)
        if cfg.optimizer == "sgd":
            return torch.optim.SGD(model.parameters(), lr=cfg.lr or 0.05)
        raise ValueError(f"unknown optimizer {cfg.optimizer!r}; choose adam or sgd")

    def build_objective(self, model):
        if self.noise_q is not None:
            k = self.cfg.noise_samples
            with np.errstate(divide="ignore"):  # q = 0 (<s>): never a target, never drawn
                log_kq = torch.from_numpy(np.log(k * self.noise_q)).float().to(self.device)
            return NceObjective(model, log_kq)
        return NgramObjective(model, self.cfg.self_norm)

    def batch(self, step: int):
        if self._stream is None:  # the stream is a pure function of (seed, step): start it where we are
            cfg = self.cfg
            self._stream = stream_batches(self.data, self.vocab, self.info.heldout_lines, self.model_cfg.order,
                                          cfg.batch_size, cfg.seed, step, side=self.side)
        b = next(self._stream)
        mine = b[self.dist.rank :: self.dist.world]
        if self.noise_q is None:
            (mine,) = upload([mine], self.device)  # on a GPU without waiting for the step before
            return (mine[:, :-1], mine[:, -1]), len(b)
        # the update's noise words: a function of (seed, step), the same on every rank, so a resumed run
        # draws what the interrupted one would have
        rng = np.random.default_rng([self.cfg.seed, step, 0x4E4345])
        mine, noise = upload([mine, rng.choice(len(self.noise_q), size=self.cfg.noise_samples, p=self.noise_q)],
                             self.device)
        return (mine[:, :-1], mine[:, -1], noise), len(b)

    def heldout(self, model) -> tuple[float, int]:
        return heldout_nll(model, self.valid[self.dist.rank :: self.dist.world], self.device)

    def save_best(self, model, meta: dict) -> None:
        modeldir.save_weights(self.model_dir, model, meta)

    def describe(self) -> dict:
        out = {"corpus": self.data, "sentences": self.info.lines, "train_ngrams": self.info.train_ngrams,
               "valid_ngrams": int(len(self.valid)), "valid_text": self.cfg.valid_text}
        if self.side:
            out.update(source=self.side.source, alignment=self.side.alignment)
        return out


def train(corpus: str, model_dir: str, cfg: TrainConfig, resume: bool = False, progress: bool = True,
          trace: bool = False, given: frozenset[str] | None = None, overwrite: bool = False) -> dict:
    """Train (or resume) a CSLM on `corpus` into `model_dir`; returns a summary. `given`, `overwrite`:
    what a resumed run may change and whether a model already in `model_dir` is replaced (`Trainer`).

    An epoch is `epoch_ngrams` n-grams (default: one pass); held-out perplexity
    is measured after each, training stops after `patience` epochs without
    improvement, `max_epochs` or `max_minutes`. The summary has `ngrams_seen`,
    `train_seconds`, `epochs` and the perplexity history.
    """
    trainer = NgramTrainer(corpus, model_dir, cfg, resume, progress, trace, given, overwrite)
    summary = trainer.run()
    summary["epochs"] = summary["steps"] // trainer.schedule.eval_every
    return summary
