"""Nemotron-H: a stack of single-mixer blocks, each Mamba-2, full attention (no rotary) or an MLP.

Every block is `h + mixer(RMSNorm(h))`. Mamba-2 holds the linear state (conv window over
[x, B, C] and the SSD state); attention blocks hold paged KV; MLP blocks hold nothing.
Checkpoints name the trunk `backbone.` (original) or `model.` (transformers); the loader maps both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .activations import PReLU, activation_module, get_activation
from .attention import SelfAttention
from .base import CausalLM, cfg_get, eos_ids
from .batch import BatchContext
from .cache import CacheLayout, ModelCache, StateShape
from .chunk_plan import unmeasured_chunk
from .conv import causal_conv
from .layers import GateThenGroupNorm, PlainMLP, RMSNorm
from .ssd import ssd_scan

MAMBA, ATTN, MLP = "mamba", "attention", "mlp"
_PATTERN = {"M": MAMBA, "*": ATTN, "-": MLP, "E": "moe"}
_HF_TYPES = {"linear_attention": MAMBA, "full_attention": ATTN, "mlp": MLP, "moe": "moe",
             "mamba": MAMBA, "attention": ATTN}


@dataclass(frozen=True)
class NemotronHConfig:
    vocab_size: int
    hidden_size: int
    layer_types: tuple[str, ...]        # "mamba" | "attention" | "mlp"
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    mlp_bias: bool
    layer_norm_epsilon: float
    ssm_state_size: int
    mamba_num_heads: int
    mamba_head_dim: int
    n_groups: int
    conv_kernel: int
    use_conv_bias: bool
    use_bias: bool
    chunk_size: int
    time_step_min: float
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    mlp_hidden_act: str = "relu2"
    mamba_hidden_act: str = "silu"
    model_type: str = "nemotron_h"

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> NemotronHConfig:
        """Parse a `nemotron_h` config with transformers 5.23's `NemotronHConfig` defaults and its
        legacy aliases (`mamba_n_groups`, `mamba_d_conv`, ...); docs/models.md lists every field."""
        types = _layer_types(d)
        heads = cfg_get(d, "num_attention_heads")
        kv_heads = d["num_key_value_heads"] if "num_key_value_heads" in d else 8
        acts = {f: cfg_get(d, f, default) for f, default in (("mlp_hidden_act", "relu2"),
                                                             ("mamba_hidden_act", "silu"))}
        for field, name in acts.items():
            get_activation(name, field)
        for field in ("attention_bias", "mamba_proj_bias"):
            if d.get(field):
                raise ValueError(f"config.json: {field}=true is not supported for nemotron_h (transformers' "
                                 f"NemotronH has no such bias; use_bias sets the Mamba projections' bias)")
        if d.get("sliding_window") is not None:
            raise ValueError("config.json: sliding_window is not supported for nemotron_h (full attention only)")
        return cls(
            vocab_size=cfg_get(d, "vocab_size"), hidden_size=cfg_get(d, "hidden_size"), layer_types=types,
            num_attention_heads=heads, num_key_value_heads=heads if kv_heads is None else kv_heads,
            head_dim=cfg_get(d, "head_dim", 128),
            intermediate_size=cfg_get(d, "intermediate_size"), mlp_bias=bool(d.get("mlp_bias", False)),
            layer_norm_epsilon=cfg_get(d, "layer_norm_epsilon", 1e-5),
            ssm_state_size=cfg_get(d, "ssm_state_size"), mamba_num_heads=cfg_get(d, "mamba_num_heads"),
            mamba_head_dim=cfg_get(d, "mamba_head_dim"),
            n_groups=_alias(d, "mamba_n_groups", "n_groups", 8),
            conv_kernel=_alias(d, "mamba_d_conv", "conv_kernel", 4),
            use_conv_bias=bool(_alias(d, "mamba_conv_bias", "use_conv_bias", True)),
            use_bias=bool(d.get("use_bias", False)),
            chunk_size=_alias(d, "mamba_chunk_size", "chunk_size", 128),
            time_step_min=float(_alias(d, "mamba_dt_min", "time_step_min", 0.001)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)), eos_token_ids=eos_ids(d),
            mlp_hidden_act=acts["mlp_hidden_act"], mamba_hidden_act=acts["mamba_hidden_act"])


def _alias(d: dict[str, Any], legacy: str, name: str, default: Any) -> Any:
    """transformers lets the legacy name win when both are present."""
    return d[legacy] if legacy in d else cfg_get(d, name, default)


def _layer_types(d: dict[str, Any]) -> tuple[str, ...]:
    listed = d.get("layers_block_type") or d.get("layer_types")  # transformers maps one to the other
    if listed:
        types = [_HF_TYPES.get(t, t) for t in listed]
    elif d.get("hybrid_override_pattern"):
        types = [_PATTERN.get(ch, ch) for ch in d["hybrid_override_pattern"]]
    else:
        raise ValueError("config.json: nemotron_h needs 'layers_block_type' or 'hybrid_override_pattern'")
    bad = sorted(set(types) - {MAMBA, ATTN, MLP})
    if bad:
        raise ValueError(f"config.json: nemotron_h layer types {bad} are not supported (mamba/attention/mlp)")
    return tuple(types)


class Mamba2Mixer(nn.Module):
    """Mamba-2: in_proj -> [gate, conv(x, B, C), dt]; SSD scan + D skip; gated group norm; out_proj."""

    def __init__(self, c: NemotronHConfig, state_index: int) -> None:
        super().__init__()
        self.state_index, self.c = state_index, c
        self.conv_act = get_activation(c.mamba_hidden_act, "mamba_hidden_act")
        if c.mamba_hidden_act == "prelu":
            # transformers registers `act` (so the checkpoint holds its slope) but its conv applies a
            # fresh default activation: the stored slope is loaded and, as there, never used
            self.act = PReLU()
        self.inner = c.mamba_num_heads * c.mamba_head_dim
        self.conv_dim = self.inner + 2 * c.n_groups * c.ssm_state_size
        proj = self.inner + self.conv_dim + c.mamba_num_heads
        self.in_proj = nn.Linear(c.hidden_size, proj, bias=c.use_bias)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, c.conv_kernel, groups=self.conv_dim,
                                bias=c.use_conv_bias)
        self.dt_bias = nn.Parameter(torch.ones(c.mamba_num_heads))
        self.A_log = nn.Parameter(torch.zeros(c.mamba_num_heads))
        self.D = nn.Parameter(torch.ones(c.mamba_num_heads))
        self.norm = GateThenGroupNorm(self.inner, self.inner // c.n_groups, c.layer_norm_epsilon)
        self.out_proj = nn.Linear(self.inner, c.hidden_size, bias=c.use_bias)

    def state_shape(self) -> StateShape:
        c = self.c
        return StateShape((c.conv_kernel - 1, self.conv_dim),
                          (c.mamba_num_heads, c.mamba_head_dim, c.ssm_state_size))

    def forward(self, x: torch.Tensor, batch: BatchContext, cache: ModelCache) -> torch.Tensor:
        c, n = self.c, x.shape[0]
        gate, xbc, dt = self.in_proj(x).split([self.inner, self.conv_dim, c.mamba_num_heads], dim=-1)
        xbc = causal_conv(xbc, self.conv1d.weight, self.conv1d.bias, batch, cache, self.state_index,
                          self.conv_act)
        gs = c.n_groups * c.ssm_state_size
        xs, b, cc = xbc.split([self.inner, gs, gs], dim=-1)
        xs = xs.reshape(n, c.mamba_num_heads, c.mamba_head_dim)
        # lower clamp as in the transformers reference (time_step_min), no upper limit
        dt = F.softplus(dt.float() + self.dt_bias.float()).clamp(min=c.time_step_min)
        y = ssd_scan(xs, dt, -self.A_log.float().exp(), b.reshape(n, c.n_groups, -1),
                     cc.reshape(n, c.n_groups, -1), batch, cache, self.state_index,
                     unmeasured_chunk("ssd", c.chunk_size, x.device, batch.scan_costs))
        # y is the scan's own fp32 output and gate a slice of this call's projection: without autograd
        # the D skip and the norm overwrite them (forward_ falls back to forward off fp32 or with grad)
        skip = self.D.float()[:, None] * xs.float()
        y = y + skip if torch.is_grad_enabled() else y.add_(skip)
        return self.out_proj(self.norm.forward_(y.reshape(n, -1).to(x.dtype), gate))


class Block(nn.Module):
    """`h + mixer(norm(h))` with the mixer of this layer's type."""

    def __init__(self, c: NemotronHConfig, kind: str, mixer: nn.Module) -> None:
        super().__init__()
        self.kind = kind
        self.norm = RMSNorm(c.hidden_size, c.layer_norm_epsilon)
        self.mixer = mixer

    def forward(self, h: torch.Tensor, batch: BatchContext, cache: ModelCache) -> torch.Tensor:
        x = self.norm(h)
        return h + (self.mixer(x) if self.kind == MLP else self.mixer(x, batch, cache))


class _Trunk(nn.Module):
    def __init__(self, c: NemotronHConfig, layers: list[nn.Module]) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(layers)
        self.norm_f = RMSNorm(c.hidden_size, c.layer_norm_epsilon)


class NemotronHForCausalLM(CausalLM):
    """Nemotron-H over the paged hybrid cache."""

    ties_embeddings = False  # transformers' and vLLM's NemotronH never tie lm_head to the embedding

    def __init__(self, config: NemotronHConfig) -> None:
        super().__init__()
        self.config = c = config
        layers, kv, st = [], 0, 0
        for kind in c.layer_types:
            if kind == MAMBA:
                mixer: nn.Module = Mamba2Mixer(c, st)
                st += 1
            elif kind == ATTN:
                mixer = SelfAttention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
                                      c.head_dim, kv)
                kv += 1
            else:
                mixer = PlainMLP(c.hidden_size, c.intermediate_size, bias=c.mlp_bias,
                                 act=activation_module(c.mlp_hidden_act, "mlp_hidden_act"))
            layers.append(Block(c, kind, mixer))
        self.model = _Trunk(c, layers)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def cache_layout(self) -> CacheLayout:
        c = self.config
        states = tuple(b.mixer.state_shape() for b in self.model.layers if b.kind == MAMBA)
        return CacheLayout(c.layer_types.count(ATTN), c.num_key_value_heads, c.head_dim, states)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embeddings(token_ids)

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.norm_f(h)
