"""The one way a model directory is written and read, for both networks.

    MODEL_DIR/config.json        {"format": FORMAT, "model": the model's config, "meta": training metadata}
    MODEL_DIR/model.safetensors  the (best) weights: plain tensors, no pickle
    MODEL_DIR/*.vocab            shortlists, `word<TAB>count` per line in id order (mtcommon.vocab)
    MODEL_DIR/checkpoint.pt      training state for --resume (loaded with weights_only=True)

Nothing in a model directory is executed when it is loaded. Every file is
replaced atomically (written beside, then renamed), so a reader never sees a
half-written one and a killed run leaves the previous version in place.
`moses_rnn.networks.modelio` (the phrase models) and `cslm.modeldir` (the CSLM) add
only their own config class, vocabulary files and model constructor.

Loading checks every file here, once for both networks: a file that is damaged
(cut short, empty, random bytes, a huge header), a config of an unknown format,
whose values are invalid or whose sizes do not fit the weights or vocabularies,
training metadata of the wrong types, and weights that are not tensors of the
architecture's names, shapes and dtypes, or not finite, all raise a `ModelError`
naming the file and the field or tensor, before any work starts and before a
model of the config's size is allocated.
"""

from __future__ import annotations

import json
import os
from dataclasses import MISSING, dataclass, fields
from typing import Callable, TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import save as save_tensors
from torch.overrides import TorchFunctionMode

from .errors import UserError
from .finite import all_finite
from .textio import InputError
from .outputs import atomic_output
from .vocab import Vocabulary

CONFIG, WEIGHTS, CHECKPOINT = "config.json", "model.safetensors", "checkpoint.pt"
# The `format` of each kind of model directory: the phrase models' (moses_rnn.networks.modelio) and the CSLM's
FORMATS = ("moses-rnn", "cslm")

T = TypeVar("T")


class ModelError(InputError):
    """A model directory's file that cannot be used: damaged, invalid, or not fitting the others."""

    def __init__(self, path: str, message: str):
        super().__init__(path, None, message)

    def __reduce__(self):  # survives the trip back from a worker process
        return (type(self), (self.path, self.message))


def _brief(e: object, limit: int = 300) -> str:
    """An exception's message (or any text) on one line, at most `limit` characters."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def kind(model_dir: str) -> str | None:
    """The `format` of a model directory's config (one of FORMATS), None if it has no config.json yet.

    A config.json that is there but unreadable, not a model config or of an unknown format is a
    ModelError naming it (`read_blob`), not a folder to pass over. Directories written before the
    field existed are phrase models ('moses-rnn').
    """
    path = os.path.join(model_dir, CONFIG)
    if not os.path.exists(path):
        return None
    return _format(path, read_blob(path))


def read_blob(path: str) -> dict:
    """The object a config.json holds; a ModelError naming it if it is not readable JSON of an object."""
    try:
        with open(path, encoding="utf-8") as f:
            blob = json.load(f)
    except json.JSONDecodeError as e:
        raise ModelError(path, f"invalid JSON at line {e.lineno} ({e.msg})") from None
    except UnicodeDecodeError as e:
        raise ModelError(path, f"invalid UTF-8 ({e.reason})") from None
    except OSError as e:
        raise ModelError(path, f"cannot be read ({e.strerror or _brief(e)})") from None
    if not isinstance(blob, dict) or not isinstance(blob.get("model"), dict):
        raise ModelError(path, 'not a model config (no "model" object)')
    return blob


def _format(path: str, blob: dict) -> str:
    """The `format` field of a config's contents, checked: one of FORMATS."""
    found = blob.get("format", "moses-rnn")
    if not isinstance(found, str) or found not in FORMATS:
        raise ModelError(path, f'unknown "format" {_brief(json.dumps(found), 60)}; '
                               f'known: {", ".join(FORMATS)}')
    return found


def from_fields(cls: type[T], d: dict) -> T:
    """The dataclass `cls` from a dict read from a file (config.json, checkpoint.pt).

    The one rule for every such dict: a key `cls` does not declare is refused (a
    UserError naming it: the file is damaged or from another program), a key it
    lacks takes the field's default (files written before the field existed).
    """
    if not isinstance(d, dict):
        raise UserError(f"not an object but {type(d).__name__}")
    unknown = sorted(set(d) - {f.name for f in fields(cls)})
    if unknown:
        raise UserError(f"unknown keys {', '.join(map(repr, unknown))}")
    missing = [f.name for f in fields(cls) if f.name not in d and f.default is MISSING
               and f.default_factory is MISSING]
    if missing:
        raise UserError(f"missing keys {', '.join(map(repr, missing))}")
    return cls(**d)


def write_json(path: str, obj: dict) -> None:
    with atomic_output(path, compress=False) as f:
        f.write((json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def save(model_dir: str, model: torch.nn.Module, fmt: str, config: dict, meta: dict | None = None) -> None:
    """Write model.safetensors, then config.json ({"format", "model": config, "meta"}), each atomically."""
    os.makedirs(model_dir, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    with atomic_output(os.path.join(model_dir, WEIGHTS), compress=False) as f:
        f.write(save_tensors(state))
    write_json(os.path.join(model_dir, CONFIG), {"format": fmt, "model": config, "meta": meta or {}})


@dataclass(frozen=True)
class Field:
    """What a metadata field must be: `accepts` a value read from JSON, `description` in the error."""

    accepts: Callable[[object], bool]
    description: str

    def or_null(self) -> "Field":
        return Field(lambda v: v is None or self.accepts(v), f"{self.description}, or null")


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and all_finite(value)


COUNT = Field(lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "an integer of at least 0")
NON_NEGATIVE = Field(lambda v: _number(v) and v >= 0, "a finite number of at least 0")
NUMBER = Field(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number")
TEXT = Field(lambda v: isinstance(v, str), "a string")
OBJECT = Field(lambda v: isinstance(v, dict), "an object")

# The training metadata's fields that readers use (mtcommon.trainer writes them), and those of
# meta.train_config that both trainers write; each format adds its own (`read_config`'s train_fields).
META_FIELDS: dict[str, Field] = {"train_config": OBJECT, "step": COUNT, "valid_ppl": NUMBER, "device": TEXT}
TRAIN_FIELDS: dict[str, Field] = {"preset": TEXT, "recipe": TEXT, "device": TEXT, "threads": COUNT.or_null(),
                                  "max_minutes": NON_NEGATIVE.or_null(), "max_steps": COUNT.or_null()}


def read_config(model_dir: str, fmt: str, parse: Callable[[dict], T],
                train_fields: dict[str, Field] | None = None) -> tuple[T, dict]:
    """(`parse` of the model's config dict, the training metadata) of a `fmt` model directory.

    `parse` (`partial(from_fields, ConfigClass)`: the one rule for a config's keys) raises
    UserError for an invalid config; the metadata's fields that readers use are checked by type
    (META_FIELDS, TRAIN_FIELDS, and the format's own `train_fields` of meta.train_config). Every problem
    is a ModelError naming config.json and the field.
    """
    path = os.path.join(model_dir, CONFIG)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{model_dir}: not a model directory (no {CONFIG})")
    blob = read_blob(path)
    found = _format(path, blob)
    if found != fmt:
        raise ModelError(path, f"holds a model of format {found!r}, not {fmt!r}")
    meta = blob.get("meta", {})
    _check_fields(path, "meta", meta, META_FIELDS)
    _check_fields(path, "meta.train_config", meta.get("train_config", {}), {**TRAIN_FIELDS, **(train_fields or {})})
    try:
        return parse(blob["model"]), meta
    except UserError as e:
        raise ModelError(path, f"invalid model config: {e}") from None


def _check_fields(path: str, where: str, blob: object, checks: dict[str, Field]) -> None:
    """A ModelError naming `path` and the field unless `blob` is an object whose fields named in `checks`
    are what they must be (a field left out is allowed: its readers have defaults)."""
    if not isinstance(blob, dict):
        raise ModelError(path, f'"{where}" is not an object')
    for name, field in checks.items():
        if name in blob and not field.accepts(blob[name]):
            raise ModelError(path, f'"{where}.{name}" must be {field.description}, '
                                   f'not {_brief(json.dumps(blob[name]), 60)}')


def load_vocab(model_dir: str, name: str, size: int | None = None) -> Vocabulary:
    """The vocabulary file `name` of a model directory; with `size` (the config's), it must have that many words."""
    path = os.path.join(model_dir, name)
    vocab = Vocabulary.load(path)
    if size is not None and len(vocab) != size:
        raise ModelError(path, f"{len(vocab)} words, but {CONFIG} says {size}")
    return vocab


def fit_state(path: str, build: Callable[[], torch.nn.Module], state: dict) -> torch.nn.Module:
    """`build()`'s model holding `state` (parameter name -> tensor), read from the file `path`.

    The one check of loaded weights, for every model the project loads (model.safetensors,
    a checkpoint's model): every value a tensor with the name, shape and dtype of one of the
    model `build` makes from its config, and finite. Names and shapes are compared on the meta
    device first, so a config that asks for a huge model allocates nothing. Any misfit is a
    ModelError naming `path` and the tensor.
    """
    if not isinstance(state, dict):
        raise ModelError(path, "holds no parameters")
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise ModelError(path, f"{name!r} is not a tensor")
    with torch.device("meta"), _SkipInitialisers():
        skeleton = build()
    _load_state(path, skeleton, {name: value.to("meta") for name, value in state.items()})
    wanted = skeleton.state_dict()
    for name, value in state.items():
        if value.dtype != wanted[name].dtype:  # load_state_dict would cast integers to floats without a word
            raise ModelError(path, f"tensor {name!r} is {_dtype(value.dtype)}, not the architecture's "
                                   f"{_dtype(wanted[name].dtype)}")
        if not all_finite(value):
            raise ModelError(path, f"{name} holds NaN or infinite values")
    model = build()
    _load_state(path, model, state)
    return model


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


_TENSOR_INITIALISERS = (torch.Tensor.normal_, torch.Tensor.uniform_)


class _SkipInitialisers(TorchFunctionMode):
    """Skips weight initialisers while a model is built on the meta device for its shapes: a meta
    tensor has no values to fill, and torch's meta `normal_` imports its compiler (a second of start-up)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init" or func in _TENSOR_INITIALISERS:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


def _load_state(path: str, model: torch.nn.Module, state: dict) -> None:
    try:
        model.load_state_dict(state)
    except RuntimeError as e:  # load_state_dict's one error: names or shapes that do not fit the model
        # after "Error(s) in ...": missing names, unexpected ones (a foreign file's), then shapes, one line each
        problems = [line.strip().rstrip(".") for line in str(e).splitlines()[1:] if line.strip()]
        raise ModelError(path, f"does not fit {CONFIG}: {_brief('; '.join(problems) or e)}") from None


def load_weights(model_dir: str, build: Callable[[], torch.nn.Module],
                 device: str | torch.device = "cpu") -> torch.nn.Module:
    """`build()`'s model (built from the config) holding model.safetensors' weights (`fit_state`),
    on `device`, in evaluation mode."""
    path = os.path.join(model_dir, WEIGHTS)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{model_dir}: no {WEIGHTS} (has training saved once?)")
    try:
        state = load_file(path, device="cpu")
    except SafetensorError as e:  # cut short, empty, random bytes, a header too large
        raise ModelError(path, f"not a readable safetensors file ({_brief(e)})") from None
    return fit_state(path, build, state).to(device).eval()


def save_checkpoint(model_dir: str, state: dict) -> None:
    """Atomically write the training state (tensors, numbers, strings only)."""
    with atomic_output(os.path.join(model_dir, CHECKPOINT), compress=False) as f:
        torch.save(state, f)


def load_checkpoint(model_dir: str) -> object:
    """What `save_checkpoint` wrote (`mtcommon.checkpoint.Checkpoint` reads its layout);
    `weights_only` loading runs no code from the file."""
    path = os.path.join(model_dir, CHECKPOINT)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{model_dir}: no {CHECKPOINT} to resume from")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except OSError:
        raise
    except Exception as e:  # a damaged file fails in many ways: EOFError, RuntimeError (zip), UnpicklingError...
        raise ModelError(path, f"not a readable training checkpoint ({_brief(e, 120)})") from None
    return state


def parameter_count(model: torch.nn.Module) -> int:
    """The number of parameters of a model in memory (`weight_count`: of a model directory)."""
    return sum(p.numel() for p in model.parameters())


def weight_count(model_dir: str) -> int:
    """The number of parameters in model.safetensors, read from its header (no tensor is loaded)."""
    from safetensors import safe_open

    weights = os.path.join(model_dir, WEIGHTS)
    if not os.path.exists(weights):
        raise FileNotFoundError(f"{model_dir}: no {WEIGHTS}")
    total = 0
    try:
        with safe_open(weights, framework="pt") as f:
            for key in f.keys():
                n = 1
                for d in f.get_slice(key).get_shape():
                    n *= d
                total += n
    except SafetensorError as e:
        raise ModelError(weights, f"not a readable safetensors file ({_brief(e)})") from None
    return total
