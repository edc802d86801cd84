"""A model directory: weights, configuration and vocabularies, loadable without running code.

    MODEL_DIR/config.json        architecture and sizes (ModelConfig) + training metadata
    MODEL_DIR/model.safetensors  weights (safetensors: plain tensors, no pickle)
    MODEL_DIR/src.vocab          source shortlist, one `word<TAB>count` per line, in id order
    MODEL_DIR/tgt.vocab          target shortlist, same format
    MODEL_DIR/checkpoint.pt      training state for --resume (loaded with weights_only=True)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch
from safetensors.torch import load_file, save_file

from .model import ModelConfig, build_model
from .textio import atomic_output
from .vocab import Vocabulary

CONFIG, WEIGHTS, SRC_VOCAB, TGT_VOCAB, CHECKPOINT = (
    "config.json",
    "model.safetensors",
    "src.vocab",
    "tgt.vocab",
    "checkpoint.pt",
)


@dataclass
class LoadedModel:
    model: torch.nn.Module
    src_vocab: Vocabulary
    tgt_vocab: Vocabulary
    config: ModelConfig
    meta: dict


def write_json(path: str, obj: dict) -> None:
    with atomic_output(path, compress=False) as f:
        f.write((json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def save_vocabularies(model_dir: str, src_vocab: Vocabulary, tgt_vocab: Vocabulary) -> None:
    os.makedirs(model_dir, exist_ok=True)
    src_vocab.save(os.path.join(model_dir, SRC_VOCAB))
    tgt_vocab.save(os.path.join(model_dir, TGT_VOCAB))


def save_model(model_dir: str, model: torch.nn.Module, meta: dict | None = None) -> None:
    """Write config.json and model.safetensors atomically (vocabularies are saved once, up front)."""
    os.makedirs(model_dir, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    tmp = os.path.join(model_dir, f".{WEIGHTS}.tmp")
    save_file(state, tmp)
    os.replace(tmp, os.path.join(model_dir, WEIGHTS))
    write_json(os.path.join(model_dir, CONFIG), {"model": model.config.to_dict(), "meta": meta or {}})


def read_config(model_dir: str) -> tuple[ModelConfig, dict]:
    path = os.path.join(model_dir, CONFIG)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{model_dir}: not a model directory (no {CONFIG})")
    with open(path, encoding="utf-8") as f:
        blob = json.load(f)
    return ModelConfig.from_dict(blob["model"]), blob.get("meta", {})


def load_model(model_dir: str, device: str | torch.device = "cpu") -> LoadedModel:
    cfg, meta = read_config(model_dir)
    src_vocab = Vocabulary.load(os.path.join(model_dir, SRC_VOCAB))
    tgt_vocab = Vocabulary.load(os.path.join(model_dir, TGT_VOCAB))
    if (len(src_vocab), len(tgt_vocab)) != (cfg.src_vocab, cfg.tgt_vocab):
        raise ValueError(
            f"{model_dir}: vocabulary sizes {len(src_vocab)}/{len(tgt_vocab)} "
            f"do not match the config's {cfg.src_vocab}/{cfg.tgt_vocab}"
        )
    model = build_model(cfg)
    weights = os.path.join(model_dir, WEIGHTS)
    if not os.path.exists(weights):
        raise FileNotFoundError(f"{model_dir}: no {WEIGHTS} (has training finished or saved once?)")
    model.load_state_dict(load_file(weights, device="cpu"))
    model.to(device).eval()
    return LoadedModel(model, src_vocab, tgt_vocab, cfg, meta)


def save_checkpoint(model_dir: str, state: dict) -> None:
    """Atomically write the training state (tensors, numbers, strings only)."""
    tmp = os.path.join(model_dir, f".{CHECKPOINT}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, os.path.join(model_dir, CHECKPOINT))


def load_checkpoint(model_dir: str) -> dict:
    path = os.path.join(model_dir, CHECKPOINT)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{model_dir}: no {CHECKPOINT} to resume from")
    return torch.load(path, map_location="cpu", weights_only=True)
