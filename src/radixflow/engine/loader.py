"""Loading a Hugging Face-format model directory into our model code.

Reads `config.json`, the `*.safetensors` weights (single file or sharded with an index),
`tokenizer.json` and the optional `tokenizer_config.json`. Checkpoint name variants are mapped
onto our module names (`model.language_model.` for the Qwen3.5 multimodal wrapper, `backbone.` for
original Nemotron-H checkpoints); vision towers and multi-token-prediction heads are skipped.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from .models import CausalLM, build_model
from .tokenizer import Tokenizer

_RENAMES = (("model.language_model.", "model."), ("backbone.", "model."))
_SKIPPED = ("mtp.", "model.visual.", "visual.", "model.mtp.")


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
    hf_config = read_config(path)
    with torch.device("meta"):
        model = build_model(hf_config)
    state = _normalise(read_weights(path), model)
    _check(state, model, path)
    state = {k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype)
             for k, v in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    model.eval()
    return LoadedModel(model, Tokenizer.from_dir(path), model.config, path)


def read_config(path: Path) -> dict[str, Any]:
    if not path.is_dir():
        raise FileNotFoundError(f"model directory {path} does not exist")
    f = path / "config.json"
    if not f.is_file():
        raise FileNotFoundError(f"{path} has no config.json (expected a Hugging Face-format model directory)")
    return json.loads(f.read_text())


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of the directory's safetensors files (sharded via model.safetensors.index.json)."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [path / s for s in shards]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"shards named in {index.name} are missing: {missing}")
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} has no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def _normalise(state: dict[str, torch.Tensor], model: CausalLM) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if name.startswith(_SKIPPED):
            continue
        for old, new in _RENAMES:
            if name.startswith(old):
                name = new + name[len(old):]
                break
        out[name] = t
    if "lm_head.weight" not in out and model.config.tie_word_embeddings:
        embed = next(k for k in model.state_dict() if k.startswith("model.embed"))
        if embed in out:
            out["lm_head.weight"] = out[embed]
    expected = model.state_dict()
    extra = sorted(set(out) - set(expected))
    if extra:
        warnings.warn(f"ignoring {len(extra)} unexpected tensors, e.g. {extra[:3]}", stacklevel=3)
    return {k: v for k, v in out.items() if k in expected}


def _check(state: dict[str, torch.Tensor], model: CausalLM, path: Path) -> None:
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ValueError(f"{path}: {len(missing)} weights missing, e.g. {missing[:5]}")
    bad = [f"{k}: checkpoint {tuple(state[k].shape)} vs config {tuple(v.shape)}"
           for k, v in expected.items() if tuple(state[k].shape) != tuple(v.shape)]
    if bad:
        raise ValueError(f"{path}: {len(bad)} weights have the wrong shape, e.g. {bad[:3]}")
