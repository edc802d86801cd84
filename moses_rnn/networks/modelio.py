"""A phrase model's directory: weights, configuration and vocabularies, loadable without running code.

The files are written and read by `mtcommon.modeldir`, as the CSLM's are;
this module adds the phrase models' config, vocabularies and constructor.

    MODEL_DIR/config.json        {"format": "moses-rnn", "model": ModelConfig, "meta": training metadata}
    MODEL_DIR/model.safetensors  weights (safetensors: plain tensors, no pickle)
    MODEL_DIR/src.vocab          source shortlist, one `word<TAB>count` per line, in id order
    MODEL_DIR/tgt.vocab          target shortlist, same format
    MODEL_DIR/checkpoint.pt      training state for --resume (loaded with weights_only=True)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial

import torch

from mtcommon import modeldir
from mtcommon.vocab import Vocabulary

from .model import EncoderDecoder
from .modelbase import ModelConfig, PhraseModel
from .rnnsearch import RNNSearch

FORMAT = "moses-rnn"
SRC_VOCAB, TGT_VOCAB = "src.vocab", "tgt.vocab"


ARCHITECTURES: dict[str, type[PhraseModel]] = {"encdec": EncoderDecoder, "rnnsearch": RNNSearch}


def build_model(cfg: ModelConfig) -> PhraseModel:
    """An untrained model of `cfg.arch` (weights as torch creates them; call init_weights)."""
    if cfg.arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {cfg.arch!r}")
    return ARCHITECTURES[cfg.arch](cfg)


@dataclass
class LoadedModel:
    model: PhraseModel
    src_vocab: Vocabulary
    tgt_vocab: Vocabulary
    config: ModelConfig
    meta: dict


def save_vocabularies(model_dir: str, src_vocab: Vocabulary, tgt_vocab: Vocabulary) -> None:
    os.makedirs(model_dir, exist_ok=True)
    src_vocab.save(os.path.join(model_dir, SRC_VOCAB))
    tgt_vocab.save(os.path.join(model_dir, TGT_VOCAB))


def save_model(model_dir: str, model: torch.nn.Module, meta: dict | None = None) -> None:
    """Write config.json and model.safetensors atomically (vocabularies are saved once, up front)."""
    modeldir.save(model_dir, model, FORMAT, model.config.to_dict(), meta)


def read_config(model_dir: str) -> tuple[ModelConfig, dict]:
    return modeldir.read_config(model_dir, FORMAT, partial(modeldir.from_fields, ModelConfig))


def load_vocabularies(model_dir: str, cfg: ModelConfig) -> tuple[Vocabulary, Vocabulary]:
    """The source and target shortlists, of the sizes `cfg` says (else a ModelError)."""
    return (modeldir.load_vocab(model_dir, SRC_VOCAB, cfg.src_vocab),
            modeldir.load_vocab(model_dir, TGT_VOCAB, cfg.tgt_vocab))


def load_model(model_dir: str, device: str | torch.device = "cpu") -> LoadedModel:
    """Every file of a phrase model's directory, checked by `modeldir` (a ModelError naming the bad one)."""
    cfg, meta = read_config(model_dir)
    src_vocab, tgt_vocab = load_vocabularies(model_dir, cfg)
    model = modeldir.load_weights(model_dir, lambda: build_model(cfg), device)
    return LoadedModel(model, src_vocab, tgt_vocab, cfg, meta)
