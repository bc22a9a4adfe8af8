"""Qwen3.5 (text): Gated DeltaNet linear-attention layers interleaved 3:1 with gated full attention.

Checkpoint conventions handled here: zero-centred RMSNorm weights (scale = 1 + w), q_proj producing
[query, output gate] per head, partial rotary (first `partial_rotary_factor` of each head's
channels). Multimodal rotary (mrope) collapses to plain rotary for text, where the temporal,
height and width positions are all equal, so it is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .activations import activation_module, get_activation
from .attention import SelfAttention
from .base import CausalLM, cfg_get, eos_ids, rope_params
from .batch import BatchContext
from .cache import CacheLayout, ModelCache, StateShape
from .chunk_plan import unmeasured_chunk
from .conv import causal_conv
from .gated_delta import gated_delta_rule
from .layers import FusedLinears, GatedMLP, NormThenGate, RMSNorm, Rotary

LINEAR, FULL = "linear_attention", "full_attention"


@dataclass(frozen=True)
class Qwen35Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    partial_rotary_factor: float
    linear_conv_kernel_dim: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    hidden_act: str = "silu"
    attention_bias: bool = False
    model_type: str = "qwen3_5_text"

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> Qwen35Config:
        """Parse a `qwen3_5_text` config, or a `qwen3_5` wrapper through its `text_config`.

        Defaults are transformers 5.23's `Qwen3_5TextConfig` defaults; docs/models.md lists every
        field transformers reads and what we do with it.
        """
        outer = d
        tie = d.get("tie_word_embeddings", False)
        if d.get("model_type") == "qwen3_5":
            text = cfg_get(d, "text_config")
            if not isinstance(text, dict):
                raise ValueError(f"config.json: text_config must be an object, got {type(text).__name__}")
            d = {**text, "model_type": "qwen3_5_text"}
            # the wrapper's flag governs (Qwen3_5ForConditionalGeneration reads the top-level config)
            tie = outer["tie_word_embeddings"] if "tie_word_embeddings" in outer else d.get("tie_word_embeddings")
        n_layers = cfg_get(d, "num_hidden_layers")
        interval = d.get("full_attention_interval", 4)
        types = d.get("layer_types") or [FULL if (i + 1) % interval == 0 else LINEAR for i in range(n_layers)]
        if set(types) - {LINEAR, FULL}:
            raise ValueError(f"config.json: unsupported layer types {sorted(set(types) - {LINEAR, FULL})}")
        if len(types) != n_layers:
            raise ValueError(f"config.json: layer_types has {len(types)} entries, num_hidden_layers is {n_layers}")
        theta, partial = rope_params({"partial_rotary_factor": 0.25, **d})
        hidden_act = cfg_get(d, "hidden_act", "silu")
        get_activation(hidden_act, "hidden_act")
        return cls(
            vocab_size=cfg_get(d, "vocab_size"), hidden_size=cfg_get(d, "hidden_size"),
            intermediate_size=cfg_get(d, "intermediate_size"), layer_types=tuple(types),
            num_attention_heads=cfg_get(d, "num_attention_heads"),
            num_key_value_heads=cfg_get(d, "num_key_value_heads"),
            head_dim=cfg_get(d, "head_dim", 256),
            rms_norm_eps=cfg_get(d, "rms_norm_eps", 1e-6), rope_theta=theta, partial_rotary_factor=partial,
            linear_conv_kernel_dim=cfg_get(d, "linear_conv_kernel_dim", 4),
            linear_key_head_dim=cfg_get(d, "linear_key_head_dim"),
            linear_value_head_dim=cfg_get(d, "linear_value_head_dim"),
            linear_num_key_heads=cfg_get(d, "linear_num_key_heads"),
            linear_num_value_heads=cfg_get(d, "linear_num_value_heads"),
            tie_word_embeddings=bool(tie), eos_token_ids=eos_ids(d) or eos_ids(outer),
            hidden_act=hidden_act, attention_bias=bool(cfg_get(d, "attention_bias", False)))


class GatedDeltaNet(nn.Module):
    """Gated DeltaNet mixer: causal conv over [q, k, v], then the gated delta rule per value head."""

    def __init__(self, c: Qwen35Config, state_index: int) -> None:
        super().__init__()
        self.state_index = state_index
        self.conv_act = get_activation(c.hidden_act, "hidden_act")  # as transformers' conv
        self.nk, self.nv = c.linear_num_key_heads, c.linear_num_value_heads
        self.dk, self.dv = c.linear_key_head_dim, c.linear_value_head_dim
        conv_dim = 2 * self.nk * self.dk + self.nv * self.dv
        self.in_proj_qkv = nn.Linear(c.hidden_size, conv_dim, bias=False)
        self.in_proj_z = nn.Linear(c.hidden_size, self.nv * self.dv, bias=False)
        self.in_proj_b = nn.Linear(c.hidden_size, self.nv, bias=False)
        self.in_proj_a = nn.Linear(c.hidden_size, self.nv, bias=False)
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, c.linear_conv_kernel_dim, groups=conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.nv))
        self.A_log = nn.Parameter(torch.zeros(self.nv))
        self.norm = NormThenGate(self.dv, c.rms_norm_eps)
        self.out_proj = nn.Linear(self.nv * self.dv, c.hidden_size, bias=False)
        self.__dict__["fused"] = FusedLinears(self.in_proj_qkv, self.in_proj_z)

    def state_shape(self) -> StateShape:
        conv_dim = self.conv1d.weight.shape[0]
        return StateShape((self.conv1d.weight.shape[-1] - 1, conv_dim), (self.nv, self.dk, self.dv))

    def forward(self, x: torch.Tensor, batch: BatchContext, cache: ModelCache) -> torch.Tensor:
        n = x.shape[0]
        qkv, z = self.fused(x)
        mixed = causal_conv(qkv, self.conv1d.weight, None, batch, cache, self.state_index,
                            self.conv_act)
        q, k, v = mixed.split([self.nk * self.dk, self.nk * self.dk, self.nv * self.dv], dim=-1)
        q = _l2norm(q.reshape(n, self.nk, self.dk), scale=self.dk ** -0.5)
        k = _l2norm(k.reshape(n, self.nk, self.dk))
        if self.nv != self.nk:  # each q/k head serves nv/nk consecutive value heads
            q, k = (t.repeat_interleave(self.nv // self.nk, dim=1) for t in (q, k))
        beta = torch.sigmoid(self.in_proj_b(x).float())
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias.float())
        chunk = unmeasured_chunk("gdn", 64, x.device, batch.scan_costs)
        o = gated_delta_rule(q, k, v.reshape(n, self.nv, self.dv), g, beta, batch, cache, self.state_index, chunk)
        o = self.norm(o.to(x.dtype), z.view(n, self.nv, self.dv))
        return self.out_proj(o.reshape(n, -1))


def _l2norm(x: torch.Tensor, eps: float = 1e-6, scale: float = 1.0) -> torch.Tensor:
    """x / sqrt(sum x^2 + eps) over the last dim in fp32, then times `scale` in place (no second tensor)."""
    xf = x.float()
    y = xf * torch.rsqrt((xf * xf).sum(-1, keepdim=True) + eps)
    return y.mul_(scale) if scale != 1.0 else y


class DecoderLayer(nn.Module):
    """Pre-norm residual block: mixer (`linear_attn` or `self_attn`), then the MLP."""

    def __init__(self, c: Qwen35Config, kind: str, mixer: nn.Module, zero_centered: bool = True) -> None:
        super().__init__()
        self.mixer_name = "linear_attn" if kind == LINEAR else "self_attn"
        self.add_module(self.mixer_name, mixer)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, zero_centered)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, zero_centered)
        self.mlp = GatedMLP(c.hidden_size, c.intermediate_size, act=activation_module(c.hidden_act, "hidden_act"))

    def forward(self, h: torch.Tensor, batch: BatchContext, cache: ModelCache) -> torch.Tensor:
        h = h + getattr(self, self.mixer_name)(self.input_layernorm(h), batch, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class Backbone(nn.Module):
    def __init__(self, c: Qwen35Config, layers: list[nn.Module], zero_centered: bool) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps, zero_centered)


class Qwen35ForCausalLM(CausalLM):
    """Qwen3.5 text model over the paged hybrid cache."""

    def __init__(self, config: Qwen35Config) -> None:
        super().__init__()
        self.config = config
        c = config
        self.rotary = Rotary(c.head_dim, c.rope_theta, c.partial_rotary_factor)
        layers, kv, st = [], 0, 0
        for kind in c.layer_types:
            if kind == LINEAR:
                mixer: nn.Module = GatedDeltaNet(c, st)
                st += 1
            else:
                mixer = SelfAttention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                      kv, eps=c.rms_norm_eps, qk_norm="zero_centered", output_gate=True,
                                      rotary=self.rotary, bias=c.attention_bias)
                kv += 1
            layers.append(DecoderLayer(c, kind, mixer))
        self.model = Backbone(c, layers, zero_centered=True)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def cache_layout(self) -> CacheLayout:
        c = self.config
        states = tuple(layer.linear_attn.state_shape() for layer in self.model.layers
                       if layer.mixer_name == "linear_attn")
        return CacheLayout(c.layer_types.count(FULL), c.num_key_value_heads, c.head_dim, states)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(token_ids)

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.norm(h)

    def prepare(self, batch: BatchContext) -> None:
        batch.extras["rope"] = self.rotary.cos_sin(batch.positions)
