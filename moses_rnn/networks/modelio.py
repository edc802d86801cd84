"""A phrase model's directory: weights, configuration and vocabularies, loadable without running code.

The files are written and read by `mtcommon.modeldir`, as the CSLM's are;
this module adds the phrase models' config, vocabularies and constructor.

    MODEL_DIR/config.json        {"format": "moses-rnn", "model": ModelConfig, "meta": training metadata}
    MODEL_DIR/model.safetensors  weights (safetensors: plain tensors, no pickle)
    MODEL_DIR/src.vocab          source shortlist, one `word<TAB>count` per line, in id order
    MODEL_DIR/tgt.vocab          target shortlist, same format
    MODEL_DIR/src.spm, tgt.spm   instead of the shortlists, for subword units: sentencepiece models
                                 (mtcommon.subword), whose SHA-256 config.json records
    MODEL_DIR/checkpoint.pt      training state for --resume (loaded with weights_only=True)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial

import torch

from mtcommon import modeldir
from mtcommon.subword import SubwordVocabulary
from mtcommon.vocab import Vocabulary

from . import ARCHITECTURES
from .model import EncoderDecoder
from .modelbase import ModelConfig, PhraseModel
from .rnnsearch import RNNSearch

FORMAT = "moses-rnn"
SRC_VOCAB, TGT_VOCAB = "src.vocab", "tgt.vocab"
SRC_UNITS, TGT_UNITS = "src.spm", "tgt.spm"


# Each architecture's class, as the one list of them (`networks.ARCHITECTURES`) names it.
_CLASSES = {cls.__name__: cls for cls in (EncoderDecoder, RNNSearch)}
MODEL_CLASSES: dict[str, type[PhraseModel]] = {arch: _CLASSES[a.model] for arch, a in ARCHITECTURES.items()}


def build_model(cfg: ModelConfig) -> PhraseModel:
    """An untrained model of `cfg.arch` (weights as torch creates them; call init_weights)."""
    if cfg.arch not in MODEL_CLASSES:
        raise ValueError(f"unknown architecture {cfg.arch!r}")
    return MODEL_CLASSES[cfg.arch](cfg)


@dataclass
class LoadedModel:
    model: PhraseModel
    src_vocab: Vocabulary
    tgt_vocab: Vocabulary
    config: ModelConfig
    meta: dict
    path: str = "the model"  # the model directory, for messages


def vocabulary_files(segmentation: str) -> tuple[str, str]:
    """The file names of the source and target vocabularies of a `segmentation`."""
    return (SRC_VOCAB, TGT_VOCAB) if segmentation == "words" else (SRC_UNITS, TGT_UNITS)


def save_vocabularies(model_dir: str, src_vocab: Vocabulary, tgt_vocab: Vocabulary) -> None:
    """Both sides' vocabularies, shortlists or sentencepiece models, under their type's names."""
    os.makedirs(model_dir, exist_ok=True)
    for vocab, name in zip((src_vocab, tgt_vocab), vocabulary_files(src_vocab.kind)):
        vocab.save(os.path.join(model_dir, name))


def segmentation_fields(src_vocab: Vocabulary, tgt_vocab: Vocabulary) -> dict:
    """The ModelConfig fields that name the vocabularies' units and pin the subword models' contents."""
    if src_vocab.kind != tgt_vocab.kind:
        raise ValueError("both sides' vocabularies must be of one type")
    if src_vocab.kind == "words":
        return dict(segmentation="words")
    return dict(segmentation=src_vocab.kind, src_sha256=src_vocab.checksum(), tgt_sha256=tgt_vocab.checksum())


def save_model(model_dir: str, model: torch.nn.Module, meta: dict | None = None) -> None:
    """Write config.json and model.safetensors atomically (vocabularies are saved once, up front)."""
    modeldir.save(model_dir, model, FORMAT, model.config.to_dict(), meta)


def read_config(model_dir: str) -> tuple[ModelConfig, dict]:
    return modeldir.read_config(model_dir, FORMAT, partial(modeldir.from_fields, ModelConfig))


def load_vocabularies(model_dir: str, cfg: ModelConfig) -> tuple[Vocabulary, Vocabulary]:
    """The source and target vocabularies of the sizes and type `cfg` says (else a ModelError naming the
    file): shortlists, or sentencepiece models whose SHA-256 must be the one `cfg` records."""
    if cfg.segmentation == "words":
        return (modeldir.load_vocab(model_dir, SRC_VOCAB, cfg.src_vocab),
                modeldir.load_vocab(model_dir, TGT_VOCAB, cfg.tgt_vocab))
    vocabs = []
    for name, size, digest in ((SRC_UNITS, cfg.src_vocab, cfg.src_sha256), (TGT_UNITS, cfg.tgt_vocab, cfg.tgt_sha256)):
        path = os.path.join(model_dir, name)
        if not os.path.exists(path):
            raise modeldir.ModelError(path, f"missing: {modeldir.CONFIG} names {cfg.segmentation} units")
        vocab = SubwordVocabulary.load(path)
        if vocab.checksum() != digest:
            raise modeldir.ModelError(path, f"not the segmentation this model was trained with "
                                            f"(SHA-256 {vocab.checksum()[:12]}..., {modeldir.CONFIG} says {digest[:12]}...)")
        if len(vocab) != size:
            raise modeldir.ModelError(path, f"{len(vocab)} units, but {modeldir.CONFIG} says {size}")
        vocabs.append(vocab)
    return vocabs[0], vocabs[1]


def load_model(model_dir: str, device: str | torch.device = "cpu") -> LoadedModel:
    """Every file of a phrase model's directory, checked by `modeldir` (a ModelError naming the bad one)."""
    cfg, meta = read_config(model_dir)
    src_vocab, tgt_vocab = load_vocabularies(model_dir, cfg)
    model = modeldir.load_weights(model_dir, lambda: build_model(cfg), device)
    return LoadedModel(model, src_vocab, tgt_vocab, cfg, meta, model_dir)
