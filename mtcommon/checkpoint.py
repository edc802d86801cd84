"""What a training run keeps in MODEL_DIR/checkpoint.pt, and the rules for resuming from it.

A checkpoint holds the weights, the optimiser's state, the loop's counters (`LoopState`), the
training config and the fingerprints of the files the run reads. A resumed run goes on with
the checkpoint's config on the data it trained on (`resumed_config`): the run-control fields
(`RUN_CONTROL`: how long and where to run) given again replace the checkpoint's, and any other
option given again that differs from the run's own is refused in one line naming it.
"""

from __future__ import annotations

import hashlib
import math
import os
import stat
from dataclasses import asdict, dataclass, field

from . import modeldir
from .errors import UserError

# Fields of a training config that a resumed run takes from the command line
# rather than from the checkpoint: they say how long and where to run, not what.
# `dtype` too, when given as bf16 or fp32; 'auto' keeps the checkpoint's (`Trainer.__init__`).
# Every other field given again must equal the checkpoint's.
RUN_CONTROL = ("max_steps", "max_minutes", "max_epochs", "device", "threads", "dtype")


def fingerprint(path: str) -> list | None:
    """[size, sha256] of a regular file's bytes: the same data wherever it lies, whatever its name.
    None for anything else (a pipe, read once, cannot be read again to compare)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
    except OSError:
        return None  # the run that reads it reports it, in its own words
    return [os.path.getsize(path), digest.hexdigest()]


def _paths(value) -> list[str]:
    """A config field's file names: one path, a pair (SRC TGT), or none."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _plain(value):
    """A config value as the command line gives it and as checkpoint.pt gives it back (tuples come back as lists)."""
    return list(value) if isinstance(value, tuple) else value


def _option(name: str, value) -> str:
    """A config field as the command-line option that sets it: `--batch-size 64`."""
    shown = " ".join(map(str, value)) if isinstance(value, (list, tuple)) else value
    return f"--{name.replace('_', '-')} {shown}"


def fingerprints(data_paths: list[str], cfg, path_fields: tuple[str, ...]) -> dict:
    """The fingerprints of the files a run with config `cfg` reads (`Checkpoint.inputs`): "data", the
    training data's files, and each of `path_fields` that names files."""
    inputs = {"data": [fingerprint(p) for p in data_paths]}
    for name in path_fields:
        if getattr(cfg, name, None) is not None:
            inputs[name] = [fingerprint(p) for p in _paths(getattr(cfg, name))]
    return inputs


@dataclass
class Evaluation:
    """One held-out evaluation of a run: its perplexity after `step` steps."""

    step: int
    train_seconds: float  # time in training steps so far (start-up and evaluation excluded)
    examples_seen: int  # rows of the global batches trained on so far
    valid_ppl: float


@dataclass
class LoopState:
    """The loop's counters: what a resumed run needs besides the weights, the optimiser and the config."""

    step: int = 0  # steps done
    best_valid_ppl: float = math.inf
    since_best: int = 0  # evaluations since the best one (early stopping)
    history: list[Evaluation] = field(default_factory=list)
    train_seconds: float = 0.0
    examples_seen: int = 0
    saved: bool = False  # whether model.safetensors has been written
    # wall-clock seconds of the runs so far, start-up excluded, up to the last checkpoint: what
    # max_minutes counts, so a resumed run gets the rest of the budget, not a new one
    wall_seconds: float = 0.0

    @classmethod
    def from_dict(cls, d: dict) -> "LoopState":
        """The state `asdict` wrote; unknown keys refused, missing ones default (`modeldir.from_fields`)."""
        state = modeldir.from_fields(cls, d)
        if not isinstance(state.history, list):
            raise UserError("`history` is not a list")
        state.history = [modeldir.from_fields(Evaluation, e) for e in state.history]
        return state


@dataclass
class Checkpoint:
    """MODEL_DIR/checkpoint.pt: the latest training state, for --resume and a run's perplexity history.

    Stored as a dict of plain values (tensors, numbers, strings, lists, dicts), which
    torch.load(weights_only=True) reads back without running code from the file.
    """

    model: dict  # parameter name -> tensor
    optimizer: dict  # the optimiser's state_dict()
    loop: LoopState
    train_config: dict  # the training config's fields (asdict)
    # the fingerprints of the files the run reads (`fingerprint`): "data", and each path field of the config
    # (`Trainer.path_fields`); None in checkpoints written before they were kept
    inputs: dict | None = None

    def save(self, model_dir: str) -> None:
        """Write the file atomically (`modeldir.save_checkpoint`)."""
        modeldir.save_checkpoint(model_dir, {"model": self.model, "optimizer": self.optimizer,
                                             "loop": asdict(self.loop), "train_config": self.train_config,
                                             "inputs": self.inputs})

    @classmethod
    def load(cls, model_dir: str) -> "Checkpoint":
        """The file `save` wrote; a damaged file or another layout is a ModelError naming it."""
        state = modeldir.load_checkpoint(model_dir)
        try:
            checkpoint = modeldir.from_fields(cls, state)
            for name in ("model", "optimizer", "train_config"):
                if not isinstance(getattr(checkpoint, name), dict):
                    raise UserError(f"`{name}` is not a dict")
            if checkpoint.inputs is not None and not isinstance(checkpoint.inputs, dict):
                raise UserError("`inputs` is not a dict")
            checkpoint.loop = LoopState.from_dict(checkpoint.loop)
        except UserError as e:
            raise modeldir.ModelError(os.path.join(model_dir, modeldir.CHECKPOINT),
                                      f"not a training checkpoint of this version ({e})") from None
        return checkpoint


def resumed_config(checkpoint: Checkpoint, model_dir: str, cfg, inputs: dict, given, data_paths: list[str],
                   data_fields: tuple[str, ...], path_fields: tuple[str, ...]):
    """The config and input fingerprints a resumed run goes on with: the checkpoint's config, with the
    run-control fields among `given` (the fields the caller set explicitly; None: all of them) taken from
    `cfg`. Data that is not the run's own, and options among `given` that differ from the run's, are
    refused in one line naming them (`Trainer.__init__` documents the contract)."""
    try:
        saved = modeldir.from_fields(type(cfg), checkpoint.train_config)
    except ValueError as e:  # unknown fields, an unknown recipe
        raise modeldir.ModelError(os.path.join(model_dir, modeldir.CHECKPOINT),
                                  f"its train_config does not fit this version ({e})") from None
    _check_resume(checkpoint, model_dir, cfg, saved, inputs, given, data_paths, data_fields, path_fields)
    if checkpoint.inputs is not None:
        inputs = checkpoint.inputs
    kept = getattr(saved, "dtype", None)  # the dtype the run chose (stored resolved: bf16 or fp32)
    for name in RUN_CONTROL:
        if hasattr(cfg, name) and (given is None or name in given):
            setattr(saved, name, getattr(cfg, name))
    if getattr(cfg, "dtype", None) == "auto" and kept is not None:
        # not probed again: the probe might choose the other dtype, and the run would not go on
        # as the interrupted one would have (a checkpoint written before the choice was stored
        # holds 'auto', and is probed again)
        saved.dtype = kept
    return saved, inputs


def _check_resume(checkpoint: Checkpoint, model_dir: str, cfg, saved, inputs: dict, given, data_paths: list[str],
                  data_fields: tuple[str, ...], path_fields: tuple[str, ...]) -> None:
    """Refuse, in one line naming them, data and options given for a resumed run that are not its own."""
    where = os.path.join(model_dir, modeldir.CHECKPOINT)
    stored = checkpoint.inputs or {}

    def same_files(name: str, now: list) -> bool:
        """Whether the files a field names now are those the run read: by their bytes where both
        fingerprints are known; else, for an option, by its names, and the data passes (a pipe, or a
        checkpoint that kept no fingerprints, cannot tell)."""
        before = stored.get(name)
        if before is not None and len(before) != len(now):
            return False
        if before is None or None in before or None in now:
            return name == "data" or _plain(getattr(cfg, name)) == _plain(getattr(saved, name))
        return before == now

    if not same_files("data", inputs["data"]):
        raise UserError(f"{' '.join(data_paths)} is not the data the run in {model_dir} trained "
                        f"on: resume it on its own data, or give --overwrite to start afresh on this")
    conflicts = []
    for name in sorted(given or ()):
        if name in RUN_CONTROL or name in data_fields or not hasattr(saved, name):
            continue
        if name in path_fields and getattr(cfg, name) is not None and getattr(saved, name) is not None:
            same = same_files(name, inputs.get(name, []))
        else:
            same = _plain(getattr(cfg, name)) == _plain(getattr(saved, name))
        if not same:
            conflicts.append(f"{_option(name, getattr(cfg, name))} (the run's: {_plain(getattr(saved, name))})")
    if conflicts:
        raise UserError(f"{where}: {'; '.join(conflicts)}: a resumed run keeps the options it was started "
                        f"with; leave {'them' if len(conflicts) > 1 else 'it'} out, or give --overwrite to "
                        f"start afresh")
