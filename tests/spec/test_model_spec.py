"""ModelSpec from config.json: the same layer lists, defaults and tie flag the engine's loader reads."""

from __future__ import annotations

import json

import pytest

from radixflow.engine.tiny import TINY_CONFIGS
from radixflow.spec.model_spec import ATTN, MAMBA, MLP, get_spec, spec_from_hf_config


def test_nemotron_layers_block_type_and_legacy_pattern():
    cfg = dict(TINY_CONFIGS["tiny-nemotron-h"])
    spec = spec_from_hf_config(cfg)
    assert spec.layers == (MAMBA, MLP, MAMBA, ATTN, MLP, MAMBA, MLP)
    legacy = {k: v for k, v in cfg.items() if k != "layers_block_type"}
    assert spec_from_hf_config({**legacy, "hybrid_override_pattern": "M-M*-M-"}).layers == spec.layers
    assert spec_from_hf_config({**cfg, "mamba_n_groups": 4}).mamba_groups == 4
    with pytest.raises(ValueError, match="moe"):
        spec_from_hf_config({**legacy, "layers_block_type": ["linear_attention", "moe"]})


def test_attention_free_spec_has_no_kv_bytes():
    cfg = {**TINY_CONFIGS["tiny-nemotron-h"], "layers_block_type": ["linear_attention", "mlp"]}
    spec = spec_from_hf_config(cfg)
    assert spec.kv_bytes_per_token == 0 and spec.is_hybrid and spec.state_bytes_per_snapshot > 0


def test_head_dim_defaults_follow_transformers():
    base = {k: v for k, v in TINY_CONFIGS["tiny-qwen3.5"].items() if k != "head_dim"}
    assert spec_from_hf_config(base).head_dim == 256          # Qwen3_5TextConfig's default
    q3 = {k: v for k, v in TINY_CONFIGS["tiny-qwen3"].items() if k != "head_dim"}
    assert spec_from_hf_config(q3).head_dim == 128            # Qwen3Config's default


@pytest.mark.parametrize("text_tie", [None, False])
def test_wrapper_top_level_tie(text_tie):
    text = {k: v for k, v in TINY_CONFIGS["tiny-qwen3.5"].items() if k != "tie_word_embeddings"}
    if text_tie is not None:
        text["tie_word_embeddings"] = text_tie
    spec = spec_from_hf_config({"model_type": "qwen3_5", "text_config": text, "tie_word_embeddings": True})
    assert spec.tie_embeddings


def test_broken_config_names_the_file(tmp_path):
    f = tmp_path / "config.json"
    f.write_text('{"model_type": ')
    with pytest.raises(ValueError, match=f"{f}: invalid JSON"):
        get_spec(str(tmp_path))
    f.write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match=f"{f}: config.json must hold a JSON object"):
        get_spec(str(tmp_path))
