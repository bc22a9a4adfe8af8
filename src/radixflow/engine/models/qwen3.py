"""Qwen3 (dense, full attention only): the full-attention control model. No linear state at all."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from .activations import get_activation
from .attention import SelfAttention
from .base import CausalLM, cfg_get, eos_ids, rope_params
from .batch import BatchContext
from .cache import CacheLayout
from .layers import Rotary
from .qwen3_5 import FULL, Backbone, DecoderLayer


@dataclass(frozen=True)
class Qwen3Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    attention_bias: bool
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    hidden_act: str = "silu"
    model_type: str = "qwen3"

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> Qwen3Config:
        """Parse a `qwen3` config with transformers 5.23's `Qwen3Config` defaults (docs/models.md)."""
        n_layers = cfg_get(d, "num_hidden_layers")
        _check_full_attention_only(d, n_layers)
        theta, _ = rope_params(d)   # Qwen3's rotary spans the whole head: partial_rotary_factor is not read
        heads = cfg_get(d, "num_attention_heads")
        # absent: transformers' default 32; an explicit null: one KV head per query head
        kv_heads = d["num_key_value_heads"] if "num_key_value_heads" in d else 32
        hidden_act = cfg_get(d, "hidden_act", "silu")
        get_activation(hidden_act, "hidden_act")
        return cls(
            vocab_size=cfg_get(d, "vocab_size"), hidden_size=cfg_get(d, "hidden_size"),
            intermediate_size=cfg_get(d, "intermediate_size"), num_hidden_layers=n_layers,
            num_attention_heads=heads, num_key_value_heads=heads if kv_heads is None else kv_heads,
            head_dim=cfg_get(d, "head_dim", 128),
            rms_norm_eps=cfg_get(d, "rms_norm_eps", 1e-6), rope_theta=theta,
            attention_bias=bool(cfg_get(d, "attention_bias", False)),
            tie_word_embeddings=bool(cfg_get(d, "tie_word_embeddings", False)), eos_token_ids=eos_ids(d),
            hidden_act=hidden_act)


def _check_full_attention_only(d: dict[str, Any], n_layers: int) -> None:
    """Refuse sliding-window layers: transformers makes layers >= max_window_layers sliding when
    use_sliding_window is set, or takes an explicit layer_types list."""
    types = d.get("layer_types")
    if types is not None:
        if len(types) != n_layers:
            raise ValueError(f"config.json: layer_types has {len(types)} entries, num_hidden_layers is {n_layers}")
        bad = sorted(set(types) - {FULL})
        if bad:
            raise ValueError(f"config.json: qwen3 layer_types {bad} are not supported (only full_attention)")
    elif d.get("use_sliding_window") and cfg_get(d, "max_window_layers", 28) < n_layers:
        raise ValueError("config.json: use_sliding_window=true is not supported for qwen3 (layers from "
                         "max_window_layers on would use sliding-window attention)")


class Qwen3ForCausalLM(CausalLM):
    """Qwen3 over the paged KV cache (ignores state_in/state_out; allocates no state pools)."""

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.config = c = config
        self.rotary = Rotary(c.head_dim, c.rope_theta)
        layers = [DecoderLayer(c, FULL, SelfAttention(  # type: ignore[arg-type]
            c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, i, eps=c.rms_norm_eps,
            qk_norm="plain", rotary=self.rotary, bias=c.attention_bias), zero_centered=False)
            for i in range(c.num_hidden_layers)]
        self.model = Backbone(c, layers, zero_centered=False)  # type: ignore[arg-type]
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def cache_layout(self) -> CacheLayout:
        c = self.config
        return CacheLayout(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, ())

    def embed(self, token_ids):
        return self.model.embed_tokens(token_ids)

    def final_norm(self, h):
        return self.model.norm(h)

    def prepare(self, batch: BatchContext) -> None:
        batch.extras["rope"] = self.rotary.cos_sin(batch.positions)
