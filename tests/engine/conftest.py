"""Fixtures for the engine tests: small random models of each family saved in HF format.

Each fixture builds a transformers model from a small config with perturbed random weights, saves it
with `save_pretrained` next to our byte-level tokenizer, and yields (directory, transformers model).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

try:
    import radixflow  # noqa: F401
except ImportError:  # running from a checkout without an editable install
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import torch  # noqa: E402

QWEN35 = dict(
    model_type="qwen3_5_text", vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_conv_kernel_dim=4,
    linear_key_head_dim=16, linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
    rms_norm_eps=1e-6, eos_token_id=258, tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                     "mrope_section": [1, 1, 0], "mrope_interleaved": True},
)
NEMOTRON = dict(
    model_type="nemotron_h", vocab_size=300, hidden_size=64, layers_block_type=[
        "linear_attention", "mlp", "full_attention", "linear_attention", "mlp"],
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96,
    ssm_state_size=8, mamba_num_heads=4, mamba_head_dim=8, n_groups=2, conv_kernel=4, chunk_size=16,
    layer_norm_epsilon=1e-5, eos_token_id=258, tie_word_embeddings=False,
)
QWEN3 = dict(
    model_type="qwen3", vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, eos_token_id=258,
    tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)
CONFIGS = {"qwen3_5": QWEN35, "nemotron_h": NEMOTRON, "qwen3": QWEN3}


def make_hf_model(spec: dict, directory: Path, seed: int = 0):
    """Random transformers model for `spec`, weights perturbed so no parameter keeps its default."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from radixflow.engine.tokenizer import save_byte_tokenizer

    spec = dict(spec)
    cfg = AutoConfig.for_model(spec.pop("model_type"), **spec)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.2 if "norm" in name or "dt_bias" in name else 0.02))
    model.eval()
    model.save_pretrained(directory)
    save_byte_tokenizer(directory)
    return model


@pytest.fixture(scope="session", params=list(CONFIGS))
def family(request, tmp_path_factory):
    """(name, directory, transformers model) for each model family."""
    d = tmp_path_factory.mktemp(request.param)
    return request.param, d, make_hf_model(CONFIGS[request.param], d)


@pytest.fixture(scope="session")
def hf_model_factory():
    """`make_hf_model` for tests that build their own config variants."""
    return make_hf_model


@pytest.fixture(scope="session")
def hf_configs():
    """The small per-family configs (copies: tests may change them)."""
    return {k: dict(v) for k, v in CONFIGS.items()}
