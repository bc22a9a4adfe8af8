"""Random-weight models at real size (`random:<name>`): real shapes, deterministic bytes, and the same
logits in transformers and our engine.

The suite never writes a full-size model (0.6-0.9B parameters): the shape checks build on the meta
device, and the write/load checks use each model's real widths with few layers and a cut vocabulary.
"""

from __future__ import annotations

import argparse

import pytest
import torch

from radixflow.commands.flags import engine_model
from radixflow.engine.loader import load_model, read_weights
from radixflow.engine.models import RowInput, build_model
from radixflow.engine.random_models import (
    RANDOM_MODELS,
    checkpoint_shapes,
    random_config,
    random_weights,
    write_random_model,
)
from radixflow.engine.tiny import TINY_CONFIGS, resolve_model
from radixflow.spec import PRESETS, spec_from_hf_config

# Published parameter counts (model cards): Qwen3-0.6B 0.6B total / 0.44B without the embedding.
REAL_PARAMS = {"random:qwen3-0.6b": (596_049_920, 440_467_456)}


def _params(cfg) -> tuple[int, int]:
    with torch.device("meta"):
        sd = build_model(cfg).state_dict()
    tied = cfg.get("tie_word_embeddings", False)
    total = sum(v.numel() for k, v in sd.items() if not (tied and k == "lm_head.weight"))
    embed = sum(v.numel() for k, v in sd.items() if "embed" in k or (k == "lm_head.weight" and not tied))
    return total, total - embed


@pytest.mark.parametrize("name", RANDOM_MODELS)
def test_real_shapes(name):
    cfg = random_config(name)
    total, non_embed = _params(cfg)
    assert 0.5e9 < total < 1.0e9 and 0.4e9 < non_embed < 0.55e9
    if name in REAL_PARAMS:
        assert (total, non_embed) == REAL_PARAMS[name]
    if name == "random:qwen3.5-0.8b":   # the simulator's preset of the same checkpoint agrees
        spec, preset = spec_from_hf_config(cfg, name), PRESETS["qwen3.5-0.8b"]
        for f in ("layers", "hidden_size", "intermediate_size", "vocab_size", "num_heads", "num_kv_heads",
                  "head_dim", "linear_k_heads", "linear_v_heads", "linear_k_dim", "linear_v_dim"):
            assert getattr(spec, f) == getattr(preset, f), f
    if name == "random:nemotron-h-1b":  # the 9B-v2 pattern's first 28 blocks
        kinds = cfg["layers_block_type"]
        assert kinds == [{"M": "mamba", "*": "attention", "-": "mlp"}[c] for c in "M-M-M-MM-M-M-M*-M-M-M*-M-M-M"]
        assert (kinds.count("mamba"), kinds.count("mlp"), kinds.count("attention")) == (14, 12, 2)


def test_names_resolve_and_are_accepted_by_the_cli():
    for name in RANDOM_MODELS:
        assert engine_model(name) == name
    with pytest.raises(argparse.ArgumentTypeError, match="random:qwen3.5-0.8b"):
        engine_model("random:qwen9")
    with pytest.raises(ValueError, match="unknown random model 'random:qwen9'"):
        resolve_model("random:qwen9")


def _small(name: str):
    """Real widths, few layers, a cut vocabulary (the byte tokenizer's 259 ids fit)."""
    if name == "random:nemotron-h-1b":
        return random_config(name, vocab_size=1024,
                             layers_block_type=["mamba", "mlp", "attention", "mamba", "mlp"])
    return random_config(name, vocab_size=1024, num_hidden_layers=4)


def _files(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_builder_is_deterministic_and_shards(tmp_path):
    cfg = _small("random:qwen3-0.6b")
    dirs = [tmp_path / s for s in ("a", "b", "c")]
    for d, seed in zip(dirs, (0, 0, 1)):
        d.mkdir()
        write_random_model(cfg, d, seed, shard_bytes=16 << 20)
    a, b, c = (_files(d) for d in dirs)
    assert a == b
    shards = sorted(n for n in a if n.endswith(".safetensors"))
    assert len(shards) > 1 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert a["config.json"] == c["config.json"] and a[shards[0]] != c[shards[0]]
    assert {"tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json"} <= set(a)


def _bound_check(ours: torch.Tensor, hf32: torch.Tensor, hf64: torch.Tensor, k: float = 8.0) -> None:
    """Ours is as close to float64 as transformers' own float32 run is, within a factor k and a floor
    of a few float32 ulps of the logit scale."""
    ref_err = (hf32 - hf64).abs().max().item()
    our_err = (ours.double() - hf64).abs().max().item()
    floor = 16 * torch.finfo(torch.float32).eps * hf64.abs().max().item()
    assert our_err <= k * ref_err + floor, (our_err, ref_err, floor)


@pytest.mark.parametrize("name", RANDOM_MODELS)
def test_transformers_and_engine_agree(name, tmp_path):
    from transformers import AutoModelForCausalLM

    write_random_model(_small(name), tmp_path, seed=0)
    ours = load_model(tmp_path).model
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids = torch.randint(0, 259, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        hf32 = hf(torch.tensor([ids])).logits[0]
        hf64 = hf.to(torch.float64)(torch.tensor([ids])).logits[0]
    out = ours([RowInput(ids, 0, list(range(10)), None, [], list(range(150)))], ours.allocate_cache(10, 16, 1))
    assert hf64.std() > 0.1 and torch.isfinite(hf64).all()   # activations stay sane at real width
    _bound_check(out, hf32, hf64)
    assert (out.argmax(-1) == hf64.argmax(-1)).float().mean() > 0.95


def _layer_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """Shape of each per-layer tensor name with the layer index dropped (model.layers.3.x -> x)."""
    out = {}
    for k, shape in checkpoint_shapes(cfg).items():
        parts = k.split(".")
        if parts[:2] == ["model", "layers"]:
            out[".".join(parts[3:])] = shape
    return out


@pytest.mark.parametrize("name", RANDOM_MODELS)
def test_fewer_layers_keep_the_widths(name):
    full = random_config(name)
    cut = random_config(name, layers=9)
    with torch.device("meta"):
        n_layers = len(build_model(cut).model.layers)
    assert n_layers == 9
    assert _layer_shapes(cut).items() <= _layer_shapes(full).items()   # every per-layer tensor as in full
    for k in ("hidden_size", "intermediate_size", "vocab_size", "num_attention_heads", "head_dim"):
        assert cut[k] == full[k], k
    if name == "random:qwen3.5-0.8b":   # the 3:1 order from layer 0
        assert cut["layer_types"] == full["layer_types"][:9]
    if name == "random:nemotron-h-1b":   # blocks 6..14 of the pattern: every kind present
        assert "".join({"mamba": "M", "mlp": "-", "attention": "*"}[b] for b in cut["layers_block_type"]) \
            == "MM-M-M-M*"
    assert random_config(name, layers=2, vocab_size=1024)["vocab_size"] == 1024
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="layers must be a positive int"):
            random_config(name, layers=bad)


def test_random_weights_are_the_checkpoint_and_depend_on_the_seed(tmp_path):
    cfg = _small("random:qwen3.5-0.8b")
    a, b, c = random_weights(cfg, 0), random_weights(cfg, 0), random_weights(cfg, 1)
    assert a.keys() == b.keys() == c.keys() and "lm_head.weight" not in a   # tied: the embedding only
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])
    write_random_model(cfg, tmp_path, seed=0, shard_bytes=16 << 20)
    stored = read_weights(tmp_path)
    assert stored.keys() == a.keys() and all(torch.equal(stored[k], a[k]) for k in a)


_WIDTH_KEYS = {"model_type", "architectures", "num_hidden_layers", "layer_types", "layers_block_type",
               "eos_token_id", "pad_token_id", "dtype", "tie_word_embeddings"}
_TINY_OF = {"random:qwen3.5-0.8b": "tiny-qwen3.5", "random:nemotron-h-1b": "tiny-nemotron-h",
            "random:qwen3-0.6b": "tiny-qwen3"}


@pytest.mark.parametrize("name", RANDOM_MODELS)
def test_tiny_width_weights_load_in_transformers_with_our_logits(name):
    """random_weights of a tiny-width cut (the tiny model's widths, the real model's layer pattern)
    load into transformers' model as they are, and its logits match ours."""
    from transformers import AutoConfig, AutoModelForCausalLM

    widths = {k: v for k, v in TINY_CONFIGS[_TINY_OF[name]].items() if k not in _WIDTH_KEYS}
    cfg = random_config(name, layers=9, **widths)
    state = random_weights(cfg, seed=2)
    ours = build_model(cfg)
    embed = next(k for k in state if k.startswith("model.embed"))
    ours.load_state_dict({"lm_head.weight": state[embed], **state})   # a tied head is the embedding
    ours.eval()
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg), dtype=torch.float32).eval()
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and [k for k in missing if k != "lm_head.weight" and not k.endswith("inv_freq")] == []
    if "lm_head.weight" in missing:   # tied: transformers' head is its embedding
        assert hf.lm_head.weight is hf.get_input_embeddings().weight
    ids = torch.randint(0, 259, (100,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        hf32 = hf(torch.tensor([ids])).logits[0]
        hf64 = hf.to(torch.float64)(torch.tensor([ids])).logits[0]
        out = ours([RowInput(ids, 0, list(range(7)), None, [], list(range(100)))], ours.allocate_cache(7, 16, 1))
    assert hf64.std() > 0.1
    _bound_check(out, hf32, hf64)
