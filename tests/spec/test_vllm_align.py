"""vLLM's hybrid block size, computed by radixflow (spec/vllm_align.py) and by vLLM 0.33 itself."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from radixflow.spec import PRESETS, get_spec
from radixflow.spec.model_spec import ATTN, LINEAR, MAMBA, MLP, ModelSpec
from radixflow.spec.vllm_align import (
    exports_prefill_checkpoint,
    resolve_mamba_cache_mode,
    supports_all_mode,
    vllm_block_size,
    vllm_geometry,
)

PAPER_BLOCKS = {  # issue 11: what vLLM 0.33 derives on an A800 (fp32 SSM state; bf16 for Qwen3.5)
    "qwen3.5-0.8b": (544, 288), "qwen3.5-4b": (528, 272), "qwen3.5-9b": (528, 272),
    "qwen3.5-27b": (784, 400), "nemotron-nano-9b-v2": (1312, 672),
}


def hf_config(spec: ModelSpec, ssm_dtype: str) -> dict:
    """An HF config.json for a preset, as the model's hub repository spells it."""
    common = {"hidden_size": spec.hidden_size, "num_hidden_layers": len(spec.layers), "vocab_size": spec.vocab_size,
              "num_attention_heads": spec.num_heads, "num_key_value_heads": spec.num_kv_heads,
              "head_dim": spec.head_dim, "torch_dtype": "bfloat16"}
    if spec.model_type == "nemotron_h":
        code = {MAMBA: "M", ATTN: "*", MLP: "-"}
        return {**common, "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
                "hybrid_override_pattern": "".join(code[k] for k in spec.layers),
                "intermediate_size": spec.intermediate_size, "mamba_num_heads": spec.mamba_heads,
                "mamba_head_dim": spec.mamba_head_dim, "ssm_state_size": spec.mamba_state,
                "n_groups": spec.mamba_groups, "conv_kernel": spec.conv_kernel, "mamba_ssm_cache_dtype": ssm_dtype}
    return {**common, "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text",
            "intermediate_size": spec.intermediate_size,
            "layer_types": ["full_attention" if k == ATTN else "linear_attention" for k in spec.layers],
            "linear_num_key_heads": spec.linear_k_heads, "linear_num_value_heads": spec.linear_v_heads,
            "linear_key_head_dim": spec.linear_k_dim, "linear_value_head_dim": spec.linear_v_dim,
            "linear_conv_kernel_dim": spec.conv_kernel, "mamba_ssm_dtype": ssm_dtype}


@pytest.mark.parametrize("name", sorted(PAPER_BLOCKS))
def test_block_sizes_of_the_presets(name):
    fp32, bf16 = PAPER_BLOCKS[name]
    spec = PRESETS[name]
    assert vllm_block_size(spec) == fp32
    assert vllm_block_size(spec, ssm_dtype="bfloat16") == bf16


def test_full_attention_keeps_its_block_and_hits():
    g = vllm_geometry(PRESETS["qwen3-8b"])
    assert (g.block_size, g.hash_block_size, g.internal_checkpoint) == (16, 16, False)


def test_config_directory_gives_the_same_block(tmp_path):
    for name, (fp32, bf16) in PAPER_BLOCKS.items():
        for dtype, want in (("float32", fp32), ("bfloat16", bf16)):
            d = tmp_path / f"{name}-{dtype}"
            d.mkdir()
            (d / "config.json").write_text(json.dumps(hf_config(PRESETS[name], dtype)))
            assert vllm_block_size(get_spec(str(d))) == want, (name, dtype)


def test_who_cuts_the_last_chunk():
    # Mamba-2 exports the checkpoint everywhere; GDN only with FlashInfer (Hopper), not on an A800.
    assert exports_prefill_checkpoint(PRESETS["nemotron-nano-9b-v2"], "a800")
    assert not exports_prefill_checkpoint(PRESETS["qwen3.5-4b"], "a800")
    assert exports_prefill_checkpoint(PRESETS["qwen3.5-4b"], "h100")
    with pytest.raises(ValueError, match="unknown GPU"):
        exports_prefill_checkpoint(PRESETS["qwen3.5-4b"], "tpu")


def test_prefix_match_unit_must_divide_the_block():
    g = vllm_geometry(PRESETS["qwen3.5-0.8b"], prefix_match_unit=16)
    assert (g.block_size, g.hash_block_size, g.partial_hits) == (544, 16, True)
    with pytest.raises(ValueError, match="must divide"):
        vllm_geometry(PRESETS["qwen3.5-0.8b"], prefix_match_unit=100)


# ---------------------------------------------------------------- against vLLM's own code
def _vllm_block_size(cfg: dict) -> int:
    """vLLM's `Platform._align_hybrid_block_size` on this config (FlashAttention, TP 1, A800: no
    FlashInfer GDN). The model config is a stand-in holding what that function reads; the state
    shapes and dtypes come from vLLM's own calculators and its per-model ssm-dtype rules."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import torch
        from vllm.config import CacheConfig, CompilationConfig, ParallelConfig
        from vllm.model_executor.layers.mamba.mamba_utils import (
            MambaStateDtypeCalculator,
            MambaStateShapeCalculator,
        )
        from vllm.model_executor.models import ModelRegistry
        from vllm.model_executor.models.config import (
            NemotronHForCausalLMConfig,
            Qwen3_5ForConditionalGenerationConfig,
        )
        from vllm.platforms.interface import Platform
        from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    except ImportError as exc:
        if os.environ.get("RADIXFLOW_REQUIRE_VLLM") == "1":
            pytest.fail(f"RADIXFLOW_REQUIRE_VLLM=1 but vLLM is not importable: {exc}", pytrace=False)
        pytest.skip(f"vLLM not importable: {exc}")

    hf = SimpleNamespace(**cfg)
    model_config = SimpleNamespace(
        dtype=torch.bfloat16, use_mla=False, is_hybrid=True, architecture=cfg["architectures"][0],
        hf_config=hf, hf_text_config=hf, get_num_kv_heads=lambda pc: cfg["num_key_value_heads"],
        get_head_size=lambda: cfg["head_dim"])
    vllm_config = SimpleNamespace(
        model_config=model_config, cache_config=CacheConfig(block_size=16, enable_prefix_caching=True,
                                                            mamba_cache_mode="align"),
        parallel_config=ParallelConfig(), compilation_config=CompilationConfig(), speculative_config=None,
        num_speculative_tokens=0)

    class Qwen35:  # the two classmethods of vLLM's Qwen3_5ForCausalLM (its module needs compressed-tensors)
        @classmethod
        def get_mamba_state_shape_from_config(cls, vc):
            h = vc.model_config.hf_text_config
            return MambaStateShapeCalculator.gated_delta_net_state_shape(
                1, h.linear_num_key_heads, h.linear_num_value_heads, h.linear_key_head_dim,
                h.linear_value_head_dim, h.linear_conv_kernel_dim, 0)

        @classmethod
        def get_mamba_state_dtype_from_config(cls, vc):
            return MambaStateDtypeCalculator.gated_delta_net_state_dtype(
                vc.model_config.dtype, vc.cache_config.mamba_cache_dtype, vc.cache_config.mamba_ssm_cache_dtype)

    if cfg["model_type"] == "nemotron_h":
        from vllm.model_executor.models.nemotron_h import NemotronHForCausalLM

        NemotronHForCausalLMConfig.verify_and_update_config(vllm_config)
        model_cls = NemotronHForCausalLM
    else:
        Qwen3_5ForConditionalGenerationConfig.verify_and_update_config(vllm_config)
        model_cls = Qwen35
    original = ModelRegistry.resolve_model_cls
    ModelRegistry.resolve_model_cls = lambda *a, **k: (model_cls, cfg["architectures"][0])
    try:
        Platform._align_hybrid_block_size(vllm_config, FlashAttentionBackend)
    finally:
        ModelRegistry.resolve_model_cls = original
    return vllm_config.cache_config.block_size


@pytest.mark.parametrize("name", sorted(PAPER_BLOCKS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "auto"])
def test_block_size_equals_vllms(name, dtype, tmp_path):
    cfg = hf_config(PRESETS[name], dtype)
    if dtype == "auto":
        cfg.pop("mamba_ssm_cache_dtype", None)
        cfg.pop("mamba_ssm_dtype", None)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    ours = vllm_block_size(get_spec(str(tmp_path)))
    assert ours == _vllm_block_size(cfg)
    if dtype != "auto":
        assert ours == PAPER_BLOCKS[name][dtype == "bfloat16"]


def test_linear_and_mamba_kinds_exist():
    assert {LINEAR, MAMBA} <= {k for s in PRESETS.values() for k in s.layers}


# ---------------------------------------------------------------- vLLM 0.29, the paper's version
def test_in_029_no_layer_kind_exports_a_checkpoint_inside_the_chunk():
    # Mamba-2's export came with vLLM PR #57329 (after v0.29.0); GDN's FlashInfer one likewise later.
    for name in ("nemotron-nano-9b-v2", "qwen3.5-4b"):
        for gpu in ("a800", "h100"):
            assert not exports_prefill_checkpoint(PRESETS[name], gpu, "0.29")
    g = vllm_geometry(PRESETS["nemotron-nano-9b-v2"], version="0.29")
    assert (g.block_size, g.hash_block_size, g.internal_checkpoint, g.mamba_cache_mode) == (1312, 1312, False, "align")
    # no FlashInfer checkpoint, so no 64-token alignment of the block on a Hopper either
    assert vllm_block_size(PRESETS["qwen3.5-0.8b"], "h100") == 576
    assert vllm_block_size(PRESETS["qwen3.5-0.8b"], "h100", version="0.29") == 544
    with pytest.raises(ValueError, match="unknown --vllm-version"):
        vllm_geometry(PRESETS["qwen3.5-0.8b"], version="0.28")


def test_all_mode_keeps_mamba2_and_sends_gdn_back_to_align():
    nemotron, qwen = PRESETS["nemotron-nano-9b-v2"], PRESETS["qwen3.5-0.8b"]
    assert supports_all_mode(nemotron) and not supports_all_mode(qwen)
    # "all": the block is a multiple of the SSD chunk (128) holding one state page (1,298 tokens' worth)
    g = vllm_geometry(nemotron, version="0.29", mamba_cache_mode="all", prefix_match_unit=16)
    assert (g.block_size, g.hash_block_size, g.internal_checkpoint, g.mamba_cache_mode) == (1408, 1408, False, "all")
    assert not g.partial_hits  # vLLM backs --prefix-match-unit off to the block outside align mode
    assert vllm_geometry(nemotron, version="0.29", mamba_cache_mode="all", prefix_match_unit=100).block_size == 1408
    # a GDN model asked for "all" runs in align, and keeps its partial hits
    g = vllm_geometry(qwen, version="0.29", mamba_cache_mode="all", prefix_match_unit=16)
    assert (g.block_size, g.hash_block_size, g.mamba_cache_mode) == (544, 16, "align")
    assert resolve_mamba_cache_mode(PRESETS["qwen3-8b"], "all", "0.29") == "align"
    with pytest.raises(ValueError, match="vLLM 0.33 has no 'all' mode"):
        vllm_geometry(nemotron, mamba_cache_mode="all")


def test_all_mode_block_follows_the_configs_chunk_size(tmp_path):
    cfg = hf_config(PRESETS["nemotron-nano-9b-v2"], "float32")
    for chunk, want in ((None, 1408), (128, 1408), (256, 1536)):
        if chunk is not None:
            cfg["chunk_size"] = chunk
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        spec = get_spec(str(tmp_path))
        assert spec.mamba_chunk_size == (chunk or 128)
        assert vllm_block_size(spec, version="0.29", mode="all") == want


def test_the_config_refuses_0_29_rules_outside_vllm_align_and_all_mode_on_0_33():
    from radixflow.config import SchedulerConfig

    SchedulerConfig(snapshot_mode="vllm-align", vllm_version="0.29", mamba_cache_mode="all").validate()
    with pytest.raises(ValueError, match="only with --snapshot-mode vllm-align"):
        SchedulerConfig(vllm_version="0.29").validate()
    with pytest.raises(ValueError, match="no 'all' mode"):
        SchedulerConfig(snapshot_mode="vllm-align", mamba_cache_mode="all").validate()
    with pytest.raises(ValueError, match="unknown --mamba-cache-mode"):
        SchedulerConfig(snapshot_mode="vllm-align", mamba_cache_mode="none").validate()
