"""Random-weight models at real sizes (`random:<name>`), for engine-speed benchmarks (no downloads ever).

`ensure_random_model("random:qwen3.5-0.8b")` builds the model deterministically from a seed and
writes it ONCE, in Hugging Face format, into the model cache (`$RADIXFLOW_CACHE/models/random-<name>`):
`config.json`, weights in ~1 GB `model-0000k-of-0000n.safetensors` shards with their
`model.safetensors.index.json`, and the byte-level tokenizer of the tiny models (`tokenizer.json`,
256 byte tokens + 3 specials; the embedding keeps the real vocabulary's rows, the rest are never
produced by the tokenizer). transformers' AutoModelForCausalLM loads the same directory.

This module is the ONE builder of random-weight real-shape models: `random_config(name, layers=N)` gives
the config (the full model, or N layers at the same widths), `random_weights(config, seed)` the whole
checkpoint in memory and `write_random_model` the same tensors written as shards
(benchmarks/engine_real.py builds its in-memory pairs from the first two).

The shapes are the real checkpoints' (`qwen3.5-0.8b`, `qwen3-0.6b`); `nemotron-h-1b` is a narrowed,
shortened Nemotron-Nano-9B-v2 (docs/models.md states exactly what). Weights are drawn like the tiny
models' (`seeded.init_tensor`): fan-in scaled normals for projections (std 1/sqrt(fan_in), 0.017-0.03
at these widths; HF's init is 0.02), norms near their neutral value and Mamba/GDN decay parameters in
their usual ranges, so activations stay O(1) through every layer; unlike the tiny models the embedding
is scaled too (std 1/sqrt(hidden)), so a tied head gives logits of std ~1 as an untied one does.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from .models import build_model
from .seeded import EOS_ID, PAD_ID, build_once, default_cache_dir
from .seeded import init_tensor as _init
from .tokenizer import save_byte_tokenizer

PREFIX = "random:"
SHARD_BYTES = 1 << 30
_NEMOTRON_NANO_9B_V2_PATTERN = "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"
_NEMOTRON_KIND = {"M": "mamba", "*": "attention", "-": "mlp"}
NEMOTRON_CUT_START = 6   # `random_config(..., layers=N)` of Nemotron-H: its blocks from here on
_SPECIAL = {"eos_token_id": EOS_ID, "pad_token_id": PAD_ID, "dtype": "float32"}

RANDOM_CONFIGS: dict[str, dict[str, Any]] = {
    # Qwen/Qwen3.5-0.8B's text model (its `text_config`), as Qwen3_5ForCausalLM.
    "qwen3.5-0.8b": {
        **_SPECIAL, "model_type": "qwen3_5_text", "architectures": ["Qwen3_5ForCausalLM"],
        "vocab_size": 248320, "hidden_size": 1024, "intermediate_size": 3584, "num_hidden_layers": 24,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256, "hidden_act": "silu",
        "attention_bias": False, "attn_output_gate": True, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 6, "full_attention_interval": 4,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "linear_num_key_heads": 16, "linear_num_value_heads": 16, "mamba_ssm_dtype": "float32",
        "max_position_embeddings": 262144,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                            "mrope_section": [11, 11, 10], "mrope_interleaved": True},
    },
    # A Nemotron-H of 0.87B: Nemotron-Nano-9B-v2's block kinds and ratios (Mamba-2 / MLP / attention,
    # squared-ReLU MLP at 3.5 x hidden, Mamba head dim 80, 8 groups, state 128, untied head, vocab
    # 131072), the first 28 of its 56 blocks (14 Mamba-2, 12 MLP, 2 attention), hidden 4480 -> 1536.
    "nemotron-h-1b": {
        **_SPECIAL, "model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"],
        "vocab_size": 131072, "hidden_size": 1536, "intermediate_size": 5376,
        "layers_block_type": [_NEMOTRON_KIND[c] for c in _NEMOTRON_NANO_9B_V2_PATTERN[:28]],
        "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 128,
        "mamba_num_heads": 40, "mamba_head_dim": 80, "n_groups": 8, "ssm_state_size": 128, "conv_kernel": 4,
        "chunk_size": 128, "use_conv_bias": True, "use_bias": False, "mlp_bias": False,
        "mlp_hidden_act": "relu2", "mamba_hidden_act": "silu", "layer_norm_epsilon": 1e-5,
        "tie_word_embeddings": False, "max_position_embeddings": 131072,
    },
    # Qwen/Qwen3-0.6B: the full-attention control.
    "qwen3-0.6b": {
        **_SPECIAL, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
        "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu",
        "attention_bias": False, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
        "max_position_embeddings": 40960, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000},
    },
}
RANDOM_MODELS = tuple(PREFIX + k for k in RANDOM_CONFIGS)


def is_random_name(name: object) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX)


def random_config(name: str, layers: int | None = None, **overrides: Any) -> dict[str, Any]:
    """The config.json dict of `random:<name>` (or bare `<name>`) with `overrides` applied, cut to
    `layers` layers at the same widths when given (per-layer cost is what a round pays; fewer layers
    keep a 2-core run short). Qwen keeps its layer pattern from layer 0 (Qwen3.5: three linear, one
    full); Nemotron-H takes `layers` consecutive blocks of its own pattern from block 6, wrapping
    around ("MM-M-M-M*" for 9: 5 Mamba, 3 MLP, 1 attention, about the full model's proportion)."""
    key = name.removeprefix(PREFIX)
    if key not in RANDOM_CONFIGS:
        raise ValueError(f"unknown random model {name!r}; choose one of {', '.join(RANDOM_MODELS)}")
    if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or layers < 1):
        raise ValueError(f"layers must be a positive int, got {layers!r}")
    cfg = json.loads(json.dumps(RANDOM_CONFIGS[key]))
    if layers is not None:
        if "layers_block_type" in cfg:
            blocks = cfg["layers_block_type"]
            cfg["layers_block_type"] = [blocks[(NEMOTRON_CUT_START + i) % len(blocks)] for i in range(layers)]
        else:
            cfg["num_hidden_layers"] = layers
    cfg.update(overrides)
    if "layer_types" in cfg and len(cfg["layer_types"]) != cfg["num_hidden_layers"]:
        base = RANDOM_CONFIGS[key]["layer_types"]
        cfg["layer_types"] = [base[i % len(base)] for i in range(cfg["num_hidden_layers"])]
    return cfg


def checkpoint_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a checkpoint of `config` stores, sorted by name (a tied head is
    the embedding and is not stored)."""
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in build_model(config).state_dict().items()}
    if config.get("tie_word_embeddings") and "lm_head.weight" in shapes and any(
            k.startswith("model.embed") for k in shapes):
        del shapes["lm_head.weight"]
    return dict(sorted(shapes.items()))


def random_tensors(config: dict[str, Any], seed: int) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors one at a time, drawn from one generator seeded with `seed` in sorted-name
    order: the bytes depend on the seed and the config only."""
    gen = torch.Generator().manual_seed(seed)
    zero_centered = config["model_type"].startswith("qwen3_5")
    for name, shape in checkpoint_shapes(config).items():
        yield name, _draw(name, shape, gen, zero_centered).contiguous()


def random_weights(config: dict[str, Any], seed: int = 0) -> dict[str, torch.Tensor]:
    """The whole checkpoint of `config` in memory (what `write_random_model` writes, tensor for tensor;
    a tied head is not in it: the embedding is)."""
    return dict(random_tensors(config, seed))


def ensure_random_model(name: str, cache_dir: str | Path | None = None, seed: int = 0) -> Path:
    """Directory of `random:<name>` for `seed`, built and written atomically the first time."""
    config = random_config(name)
    key = name.removeprefix(PREFIX)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = root / (f"random-{key}" if seed == 0 else f"random-{key}-seed{seed}")
    return build_once(target, "model.safetensors.index.json", lambda tmp: write_random_model(config, tmp, seed))


def write_random_model(config: dict[str, Any], directory: Path, seed: int,
                       shard_bytes: int = SHARD_BYTES) -> None:
    """config.json, sharded safetensors with an index, and the byte tokenizer into `directory`.

    Tensors come from `random_tensors` one at a time, and a shard is written as soon as it holds
    `shard_bytes`: peak memory is about one shard, not the model."""
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    plan: list[list[str]] = [[]]   # consecutive names per shard, ~shard_bytes each (fp32)
    size = 0
    for name, shape in checkpoint_shapes(config).items():
        nbytes = 4 * int(torch.Size(shape).numel())
        if plan[-1] and size + nbytes > shard_bytes:
            plan.append([])
            size = 0
        plan[-1].append(name)
        size += nbytes
    tensors = random_tensors(config, seed)
    weight_map, total = {}, 0
    for i, shard_names in enumerate(plan):
        fname = f"model-{i + 1:05d}-of-{len(plan):05d}.safetensors"
        shard = dict(next(tensors) for _ in shard_names)
        save_file(shard, str(directory / fname), metadata={"format": "pt"})
        for k, t in shard.items():
            weight_map[k] = fname
            total += t.numel() * t.element_size()
        del shard
    index = {"metadata": {"total_size": total, "seed": seed}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    save_byte_tokenizer(directory)


def _draw(name: str, shape: tuple[int, ...], gen: torch.Generator, zero_centered: bool) -> torch.Tensor:
    if "embed" in name:   # std 1/sqrt(hidden): a tied head's logits then have std ~1, not ~sqrt(hidden)
        return torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
    return _init(name, shape, gen, zero_centered)
