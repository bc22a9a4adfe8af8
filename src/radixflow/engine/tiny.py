"""Tiny random models, one per family, for tests and CPU benchmarks (no downloads ever).

`ensure_tiny_model(name)` builds a model deterministically from a seed and writes it ONCE, in
Hugging Face format (config.json, model.safetensors, tokenizer.json, tokenizer_config.json), into
a local cache directory; transformers' AutoModelForCausalLM can load the same directory. Sizes
are chosen so a few hundred 300-2000-token prompts run in minutes on two CPU cores.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from .models import build_model
from .seeded import EOS_ID, PAD_ID, build_once, default_cache_dir
from .seeded import init_tensor as _init
from .tokenizer import save_byte_tokenizer

TINY_MODELS = ("tiny-qwen3.5", "tiny-nemotron-h", "tiny-qwen3", "tiny-qwen3.5-gdn128")
VOCAB = 512        # 256 bytes + 3 special tokens, padded like real checkpoints pad their vocab

_COMMON: dict[str, Any] = {"vocab_size": VOCAB, "hidden_size": 128, "eos_token_id": EOS_ID,
                           "pad_token_id": PAD_ID, "tie_word_embeddings": False, "dtype": "float32",
                           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}
TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "tiny-qwen3.5": {
        **_COMMON, "model_type": "qwen3_5_text", "architectures": ["Qwen3_5ForCausalLM"],
        "num_hidden_layers": 8, "intermediate_size": 384, "rms_norm_eps": 1e-6,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 2,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "max_position_embeddings": 32768,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                            "mrope_section": [2, 1, 1], "mrope_interleaved": True},
    },
    "tiny-nemotron-h": {
        **_COMMON, "model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"],
        "layers_block_type": ["linear_attention", "mlp", "linear_attention", "full_attention", "mlp",
                              "linear_attention", "mlp"],
        "intermediate_size": 384, "layer_norm_epsilon": 1e-5, "mlp_hidden_act": "relu2",
        "ssm_state_size": 32, "mamba_num_heads": 8, "mamba_head_dim": 32, "n_groups": 2, "conv_kernel": 4,
        "chunk_size": 64, "use_conv_bias": True, "max_position_embeddings": 32768,
    },
    # tiny-qwen3.5 with GDN heads of 128 in bf16: what vLLM's CPU GDN kernel accepts (it asserts bf16 and a
    # linear-attention head dim of 128), for the plugin's runs inside vLLM's CPU build (docs/vllm.md). One
    # GDN head and attention heads of 64 keep vLLM's Mamba page, hence its attention block, at 256 tokens.
    "tiny-qwen3.5-gdn128": {
        **_COMMON, "model_type": "qwen3_5_text", "architectures": ["Qwen3_5ForCausalLM"], "dtype": "bfloat16",
        "num_hidden_layers": 4, "intermediate_size": 384, "rms_norm_eps": 1e-6, "head_dim": 64,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "linear_num_key_heads": 1, "linear_num_value_heads": 1, "max_position_embeddings": 32768,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                            "mrope_section": [2, 1, 1], "mrope_interleaved": True},
    },
    "tiny-qwen3": {
        **_COMMON, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 4,
        "intermediate_size": 384, "rms_norm_eps": 1e-6, "max_position_embeddings": 32768,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    },
}


def resolve_model(name_or_path: str | Path) -> Path:
    """A tiny model name or a `random:` real-size model name (both built on first use, see
    random_models.py), or an existing model directory."""
    from .random_models import RANDOM_MODELS, ensure_random_model

    if str(name_or_path) in TINY_MODELS:
        return ensure_tiny_model(str(name_or_path))
    if str(name_or_path).startswith("random:"):
        return ensure_random_model(str(name_or_path))
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    raise ValueError(f"{name_or_path!r} is neither a model directory nor a tiny model name "
                     f"(tiny models: {', '.join(TINY_MODELS)}; random weights at real size: "
                     f"{', '.join(RANDOM_MODELS)})")


def ensure_tiny_model(name: str, cache_dir: str | Path | None = None, seed: int = 0) -> Path:
    """Directory of tiny model `name` for `seed`, writing it atomically the first time."""
    if name not in TINY_CONFIGS:
        raise ValueError(f"unknown tiny model {name!r}; choose one of {', '.join(TINY_MODELS)}")
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = root / (name if seed == 0 else f"{name}-seed{seed}")
    return build_once(target, "model.safetensors", lambda tmp: write_tiny_model(name, tmp, seed))


def write_tiny_model(name: str, directory: Path, seed: int) -> None:
    """Write config, weights and tokenizer of tiny model `name` into an existing directory."""
    config = TINY_CONFIGS[name]
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    save_file(random_weights(config, seed), str(directory / "model.safetensors"), metadata={"format": "pt"})
    save_byte_tokenizer(directory)


def random_weights(config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """Deterministic random weights for every tensor the model expects, by sorted name."""
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in build_model(config).state_dict().items()}
    gen = torch.Generator().manual_seed(seed)
    zero_centered = config["model_type"].startswith("qwen3_5")
    return {k: _init(k, shapes[k], gen, zero_centered).contiguous() for k in sorted(shapes)}
