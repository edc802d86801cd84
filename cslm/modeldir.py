"""A CSLM model directory, loadable without executing code.

    MODEL_DIR/config.json        {"format": "cslm", "model": CSLMConfig, "meta": training metadata}
    MODEL_DIR/model.safetensors  the best weights so far (safetensors: plain tensors, no pickle)
    MODEL_DIR/cslm.vocab         the shortlist, `word<TAB>count` per line in id order
    MODEL_DIR/cslm.src.vocab     a joint model's source shortlist (config "source_window" > 0), as cslm.vocab
    MODEL_DIR/checkpoint.pt      training state for --resume (loaded with weights_only=True)

The files are written and read by `mtcommon.modeldir`, as the phrase
models' are; only the CSLM's config, vocabulary and model class are here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial

import torch

from mtcommon import modeldir
from mtcommon.vocab import Vocabulary

from .model import CSLM, CSLMConfig

VOCAB = "cslm.vocab"
SRC_VOCAB = "cslm.src.vocab"
FORMAT = "cslm"


# meta.train_config's fields that loading reads (`cslm.engine`: how the model was normalised)
TRAIN_FIELDS = {"self_norm": modeldir.NON_NEGATIVE, "objective": modeldir.TEXT}


@dataclass
class LoadedCSLM:
    model: CSLM
    vocab: Vocabulary
    config: CSLMConfig
    meta: dict
    path: str = "the model"  # the model directory, for messages
    src_vocab: Vocabulary | None = None  # a joint model's source shortlist


def save_vocab(model_dir: str, vocab: Vocabulary, name: str = VOCAB) -> None:
    os.makedirs(model_dir, exist_ok=True)
    vocab.save(os.path.join(model_dir, name))


def save_weights(model_dir: str, model: CSLM, meta: dict | None = None) -> None:
    """Atomically write model.safetensors, then config.json."""
    modeldir.save(model_dir, model, FORMAT, model.config.to_dict(), meta)


def read_config(model_dir: str) -> tuple[CSLMConfig, dict]:
    return modeldir.read_config(model_dir, FORMAT, partial(modeldir.from_fields, CSLMConfig), TRAIN_FIELDS)


def load_vocab(model_dir: str, size: int | None = None, name: str = VOCAB) -> Vocabulary:
    """The shortlist (`name`: SRC_VOCAB for the source's); with `size` (the config's), it must have that many
    words (else a ModelError)."""
    return modeldir.load_vocab(model_dir, name, size)


def load(model_dir: str, device: str | torch.device = "cpu") -> LoadedCSLM:
    """Every file of a CSLM directory, checked by `mtcommon.modeldir` (a ModelError naming the bad one)."""
    cfg, meta = read_config(model_dir)
    vocab = load_vocab(model_dir, cfg.vocab_size)
    src_vocab = load_vocab(model_dir, cfg.source_vocab_size, SRC_VOCAB) if cfg.joint else None
    model = modeldir.load_weights(model_dir, lambda: CSLM(cfg), device)
    return LoadedCSLM(model, vocab, cfg, meta, model_dir, src_vocab)
