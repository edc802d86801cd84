"""A CSLM model directory, loadable without executing code.

    MODEL_DIR/config.json        {"format": "cslm", "model": CSLMConfig, "meta": training metadata}
    MODEL_DIR/model.safetensors  the best weights so far (safetensors: plain tensors, no pickle)
    MODEL_DIR/cslm.vocab         the shortlist, `word<TAB>count` per line in id order
    MODEL_DIR/checkpoint.pt      training state for --resume (loaded with weights_only=True)

The JSON, checkpoint and vocabulary helpers are the scorer's (moses_rnn.modelio,
moses_rnn.vocab); only the CSLM's own config and weights are handled here.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch
from safetensors.torch import load_file, save_file

from moses_rnn.modelio import CHECKPOINT, load_checkpoint, save_checkpoint, write_json  # noqa: F401 (re-exported)
from moses_rnn.vocab import Vocabulary

from .model import CSLM, CSLMConfig

CONFIG, WEIGHTS, VOCAB = "config.json", "model.safetensors", "cslm.vocab"
FORMAT = "cslm"


@dataclass
class LoadedCSLM:
    model: CSLM
    vocab: Vocabulary
    config: CSLMConfig
    meta: dict


def save_vocab(model_dir: str, vocab: Vocabulary) -> None:
    os.makedirs(model_dir, exist_ok=True)
    vocab.save(os.path.join(model_dir, VOCAB))


def save_weights(model_dir: str, model: CSLM, meta: dict | None = None) -> None:
    """Atomically write model.safetensors, then config.json."""
    os.makedirs(model_dir, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    tmp = os.path.join(model_dir, f".{WEIGHTS}.tmp")
    save_file(state, tmp)
    os.replace(tmp, os.path.join(model_dir, WEIGHTS))
    write_json(os.path.join(model_dir, CONFIG), {"format": FORMAT, "model": model.config.to_dict(), "meta": meta or {}})


def read_config(model_dir: str) -> tuple[CSLMConfig, dict]:
    path = os.path.join(model_dir, CONFIG)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{model_dir}: not a CSLM model directory (no {CONFIG})")
    try:
        with open(path, encoding="utf-8") as f:
            blob = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
    if blob.get("format") != FORMAT:
        raise ValueError(f"{path}: not a CSLM configuration (format is {blob.get('format')!r})")
    return CSLMConfig.from_dict(blob["model"]), blob.get("meta", {})


def load_vocab(model_dir: str) -> Vocabulary:
    return Vocabulary.load(os.path.join(model_dir, VOCAB))


def load(model_dir: str, device: str | torch.device = "cpu") -> LoadedCSLM:
    cfg, meta = read_config(model_dir)
    vocab = load_vocab(model_dir)
    if len(vocab) != cfg.vocab_size:
        raise ValueError(f"{model_dir}: {VOCAB} has {len(vocab)} words, the config says {cfg.vocab_size}")
    weights = os.path.join(model_dir, WEIGHTS)
    if not os.path.exists(weights):
        raise FileNotFoundError(f"{model_dir}: no {WEIGHTS} (has training saved once?)")
    model = CSLM(cfg)
    model.load_state_dict(load_file(weights, device="cpu"))
    model.to(device).eval()
    return LoadedCSLM(model, vocab, cfg, meta)
