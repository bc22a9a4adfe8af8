"""Loading a Hugging Face-format model directory into our model code.

Reads `config.json`, the `*.safetensors` weights (single file or sharded with an index),
`tokenizer.json` and the optional `tokenizer_config.json`. Checkpoint name variants are mapped
onto our module names (`model.language_model.` for the Qwen3.5 multimodal wrapper, `backbone.` for
original Nemotron-H checkpoints); vision towers and multi-token-prediction heads, which the text
decoder never runs, are skipped by prefix. Every other tensor is consumed or the load fails
naming it, and a broken file gives a `ModelLoadError`: one line naming the file and the problem.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from .models import CausalLM, build_model
from .tokenizer import Tokenizer

_RENAMES = (("model.language_model.", "model."), ("backbone.", "model."))
_SKIPPED = ("mtp.", "model.visual.", "visual.", "model.mtp.")
LM_HEAD = "lm_head.weight"


class ModelLoadError(ValueError):
    """A model directory that cannot be loaded; the message is one line naming the file."""


@dataclass
class LoadedModel:
    model: CausalLM
    tokenizer: Tokenizer
    config: Any
    path: Path


def load_model(path: str | Path, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Load weights, config and tokenizer from an HF-format directory."""
    path = Path(path)
    model = _build(path)
    state = _normalise(read_weights(path), model, path)
    _check(state, model, path)
    state = {k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype)
             for k, v in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    model.eval()
    return LoadedModel(model, _tokenizer(path), model.config, path)


def check_model(path: str | Path) -> Path:
    """Everything `load_model` checks, reading only the safetensors headers (no weights): a server
    calls this before it opens its port. Returns the path; ModelLoadError / FileNotFoundError else."""
    path = Path(path)
    model = _build(path)
    _check(_normalise(read_weights(path, headers_only=True), model, path), model, path)
    _tokenizer(path)
    return path


# torch.nn.init's functions, made no-ops while a model is built on the meta device (as transformers'
# `no_init_weights` does): meta tensors hold no values, and a meta `normal_` imports torch._dynamo on
# first use (5-7 s of a server's start-up on a loaded 2-core machine).
_INIT_FUNCTIONS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
                   "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_",
                   "sparse_")


@contextmanager
def meta_build() -> Iterator[None]:
    """Modules built inside go on the meta device and skip their parameter init (no memory, no values)."""
    init = torch.nn.init
    saved = {name: getattr(init, name) for name in _INIT_FUNCTIONS if hasattr(init, name)}
    try:
        for name in saved:
            setattr(init, name, _keep)
        with torch.device("meta"):
            yield
    finally:
        for name, fn in saved.items():
            setattr(init, name, fn)


def _keep(tensor, *args, **kwargs):
    return tensor


def build_meta(hf_config: dict[str, Any]) -> CausalLM:
    """The model of a config.json dict on the meta device (ValueError / TypeError from the config)."""
    with meta_build():
        return build_model(hf_config)


def _build(path: Path) -> CausalLM:
    """The model of `path/config.json` on the meta device (no memory), or ModelLoadError."""
    hf_config = read_config(path)
    try:
        return build_meta(hf_config)
    except ValueError as e:
        raise ModelLoadError(f"{path / 'config.json'}: {_strip(str(e))}") from None
    except TypeError as e:  # e.g. "hidden_size": "64"
        raise ModelLoadError(f"{path / 'config.json'}: a field has the wrong type ({_one_line(e)})") from None


def read_config(path: Path) -> dict[str, Any]:
    if not path.is_dir():
        raise FileNotFoundError(f"model directory {path} does not exist")
    f = path / "config.json"
    if not f.is_file():
        raise FileNotFoundError(f"{path} has no config.json (expected a Hugging Face-format model directory)")
    return read_json_object(f)


def read_json_object(f: Path) -> dict[str, Any]:
    """A JSON file that must hold an object; ModelLoadError naming the file otherwise."""
    try:
        data = json.loads(f.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ModelLoadError(f"{f}: not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{f}: invalid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{f}: expected a JSON object, got a JSON {_json_kind(data)}")
    return data


def read_weights(path: Path, headers_only: bool = False) -> dict[str, torch.Tensor]:
    """All tensors of the directory's safetensors files (sharded via model.safetensors.index.json);
    `headers_only`: meta tensors of the stored shapes, reading no tensor data."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ModelLoadError(f"{index}: 'weight_map' must be an object of tensor name -> shard file")
        files = [path / s for s in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"shards named in {index.name} are missing: {missing}")
    else:
        weight_map = None
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} has no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        tensors = _read_safetensors(f, headers_only)
        twice = sorted(set(tensors) & set(state))
        if twice:
            raise ModelLoadError(f"{f}: tensor {twice[0]!r} is also in another shard ({len(twice)} such)")
        state.update(tensors)
    if weight_map is not None:
        absent = sorted(set(weight_map) - set(state))
        if absent:
            raise ModelLoadError(f"{index}: {len(absent)} tensors it lists are in no shard, e.g. {absent[:3]}")
    return state


def _read_safetensors(f: Path, headers_only: bool = False) -> dict[str, torch.Tensor]:
    try:
        if not headers_only:
            return load_file(str(f))
        with safe_open(str(f), "pt") as st:  # validates the header and that the file covers it
            return {k: torch.empty(st.get_slice(k).get_shape(), device="meta") for k in st.keys()}
    except (SafetensorError, OSError) as e:   # truncated, bad header, unreadable
        raise ModelLoadError(f"{f}: not a readable safetensors file ({_one_line(e)})") from None


def _tokenizer(path: Path) -> Tokenizer:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (path / name).is_file():
            read_json_object(path / name)
    try:
        return Tokenizer.from_dir(path)
    except FileNotFoundError:
        raise
    except Exception as e:  # the tokenizers library raises plain Exception on a malformed file
        raise ModelLoadError(f"{path / 'tokenizer.json'}: not a usable tokenizer ({_one_line(e)})") from None


def _normalise(state: dict[str, torch.Tensor], model: CausalLM, path: Path) -> dict[str, torch.Tensor]:
    """Checkpoint names mapped onto the model's; the tied head filled in; nothing left over."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if name.startswith(_SKIPPED):
            continue
        new = name
        for old, repl in _RENAMES:
            if name.startswith(old):
                new = repl + name[len(old):]
                break
        if new in out:
            raise ModelLoadError(f"{path}: the checkpoint holds {new!r} under two names")
        out[new] = t
    _tie_head(out, model, path)
    extra = sorted(set(out) - set(model.state_dict()))
    if extra:
        raise ModelLoadError(f"{path}: {len(extra)} checkpoint tensors match nothing in the "
                             f"{model.config.model_type} model built from config.json, e.g. {extra[:3]}")
    return out


def _tie_head(out: dict[str, torch.Tensor], model: CausalLM, path: Path) -> None:
    """`tie_word_embeddings`: the head IS the embedding (a stored head must equal it)."""
    c = model.config
    if not c.tie_word_embeddings:
        return
    if not model.ties_embeddings:
        if LM_HEAD not in out:
            raise ModelLoadError(f"{path}: tie_word_embeddings=true, but {c.model_type} never ties its head "
                                 f"(as in transformers) and the checkpoint holds no {LM_HEAD}")
        return
    embed = next(k for k in model.state_dict() if k.startswith("model.embed"))
    if embed not in out:
        return  # reported as missing by _check
    if LM_HEAD in out and not out[LM_HEAD].is_meta and not torch.equal(out[LM_HEAD], out[embed]):
        raise ModelLoadError(f"{path}: tie_word_embeddings=true, but the checkpoint's {LM_HEAD} differs "
                             f"from {embed}; set tie_word_embeddings=false to use it")
    out[LM_HEAD] = out[embed]


def _check(state: dict[str, torch.Tensor], model: CausalLM, path: Path) -> None:
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ModelLoadError(f"{path}: {len(missing)} weights missing, e.g. {missing[:5]}")
    bad = [f"{k}: checkpoint {tuple(state[k].shape)} vs config {tuple(v.shape)}"
           for k, v in expected.items() if tuple(state[k].shape) != tuple(v.shape)]
    if bad:
        raise ModelLoadError(f"{path}: {len(bad)} weights have the wrong shape, e.g. {bad[:3]}")


def _strip(msg: str) -> str:
    return msg.removeprefix("config.json: ").removeprefix("config.json ")


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _json_kind(data: object) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}.get(
        type(data), "null" if data is None else type(data).__name__)
