"""Model families by Hugging Face `model_type`, and the types the engine passes to them.

`build_model(config_dict)` returns an uninitialised model of the right family; weights come from
`radixflow.engine.loader`.
"""

from __future__ import annotations

from typing import Any

from .base import CausalLM
from .cache import ModelCache, RowInput
from .nemotron_h import NemotronHConfig, NemotronHForCausalLM
from .qwen3 import Qwen3Config, Qwen3ForCausalLM
from .qwen3_5 import Qwen35Config, Qwen35ForCausalLM

# model_type -> (config parser, model class)
MODEL_REGISTRY: dict[str, tuple[Any, type[CausalLM]]] = {
    "qwen3_5_text": (Qwen35Config, Qwen35ForCausalLM),
    "qwen3_5": (Qwen35Config, Qwen35ForCausalLM),
    "nemotron_h": (NemotronHConfig, NemotronHForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
}


def parse_config(hf_config: dict[str, Any]) -> Any:
    """Our config dataclass for an HF config.json dict; ValueError if the model_type is unsupported."""
    model_type = hf_config.get("model_type")
    if model_type not in MODEL_REGISTRY:
        raise ValueError(f"unsupported model_type {model_type!r}; supported: {sorted(MODEL_REGISTRY)}")
    return MODEL_REGISTRY[model_type][0].from_hf(hf_config)


def build_model(hf_config: dict[str, Any]) -> CausalLM:
    """An uninitialised model (random init, fp32, CPU) for an HF config.json dict."""
    config = parse_config(hf_config)
    return MODEL_REGISTRY[hf_config["model_type"]][1](config)


__all__ = ["MODEL_REGISTRY", "CausalLM", "ModelCache", "RowInput", "build_model", "parse_config"]
