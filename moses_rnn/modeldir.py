"""The one way a model directory is written and read, for both networks.

    MODEL_DIR/config.json        {"format": FORMAT, "model": the model's config, "meta": training metadata}
    MODEL_DIR/model.safetensors  the (best) weights: plain tensors, no pickle
    MODEL_DIR/*.vocab            shortlists, `word<TAB>count` per line in id order (moses_rnn.vocab)
    MODEL_DIR/checkpoint.pt      training state for --resume (loaded with weights_only=True)

Nothing in a model directory is executed when it is loaded. Every file is
replaced atomically (written beside, then renamed), so a reader never sees a
half-written one and a killed run leaves the previous version in place.
`moses_rnn.modelio` (the phrase models) and `cslm.modeldir` (the CSLM) add
only their own config class, vocabulary files and model constructor.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import load_file, save_file

from .textio import atomic_output

CONFIG, WEIGHTS, CHECKPOINT = "config.json", "model.safetensors", "checkpoint.pt"


def kind(model_dir: str) -> str | None:
    """The `format` of a model directory's config ('cslm', 'moses-rnn'), None if it has no readable config.

    Directories written before the field existed are phrase models ('moses-rnn').
    """
    try:
        with open(os.path.join(model_dir, CONFIG), encoding="utf-8") as f:
            blob = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(blob, dict) or not isinstance(blob.get("model"), dict):
        return None
    return blob.get("format", "moses-rnn")


def write_json(path: str, obj: dict) -> None:
    with atomic_output(path, compress=False) as f:
        f.write((json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def save(model_dir: str, model: torch.nn.Module, fmt: str, config: dict, meta: dict | None = None) -> None:
    """Write model.safetensors, then config.json ({"format", "model": config, "meta"}), each atomically."""
    os.makedirs(model_dir, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    tmp = os.path.join(model_dir, f".{WEIGHTS}.{os.getpid()}.tmp")
    try:
        save_file(state, tmp)
        os.replace(tmp, os.path.join(model_dir, WEIGHTS))
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    write_json(os.path.join(model_dir, CONFIG), {"format": fmt, "model": config, "meta": meta or {}})


def read_config(model_dir: str, fmt: str) -> tuple[dict, dict]:
    """(the model's config dict, the training metadata) of a `fmt` model directory, with one-line errors."""
    path = os.path.join(model_dir, CONFIG)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{model_dir}: not a model directory (no {CONFIG})")
    try:
        with open(path, encoding="utf-8") as f:
            blob = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
    found = kind(model_dir)
    if found != fmt:
        raise ValueError(f"{path}: a {found!r} model directory, not a {fmt!r} one")
    return blob["model"], blob.get("meta", {})


def load_weights(model_dir: str, model: torch.nn.Module, device: str | torch.device = "cpu") -> torch.nn.Module:
    """Load model.safetensors into `model`, move it to `device` and set it to evaluation mode."""
    weights = os.path.join(model_dir, WEIGHTS)
    if not os.path.exists(weights):
        raise FileNotFoundError(f"{model_dir}: no {WEIGHTS} (has training saved once?)")
    model.load_state_dict(load_file(weights, device="cpu"))
    return model.to(device).eval()


def save_checkpoint(model_dir: str, state: dict) -> None:
    """Atomically write the training state (tensors, numbers, strings only)."""
    tmp = os.path.join(model_dir, f".{CHECKPOINT}.{os.getpid()}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, os.path.join(model_dir, CHECKPOINT))


def load_checkpoint(model_dir: str) -> dict:
    """The training state; `weights_only` loading runs no code from the file."""
    path = os.path.join(model_dir, CHECKPOINT)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{model_dir}: no {CHECKPOINT} to resume from")
    return torch.load(path, map_location="cpu", weights_only=True)


def weight_count(model_dir: str) -> int:
    """The number of parameters in model.safetensors, read from its header (no tensor is loaded)."""
    from safetensors import safe_open

    weights = os.path.join(model_dir, WEIGHTS)
    if not os.path.exists(weights):
        raise FileNotFoundError(f"{model_dir}: no {WEIGHTS}")
    total = 0
    with safe_open(weights, framework="pt") as f:
        for key in f.keys():
            n = 1
            for d in f.get_slice(key).get_shape():
                n *= d
            total += n
    return total
