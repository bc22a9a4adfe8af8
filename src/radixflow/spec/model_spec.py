"""ModelSpec: built from an HF config.json or a named preset; derives Σ, KV and state bytes, FLOPs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

ATTN, LINEAR, MAMBA, MLP = "attention", "linear", "mamba", "mlp"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    model_type: str
    layers: tuple[str, ...]  # one kind per layer: attention | linear | mamba | mlp
    hidden_size: int
    intermediate_size: int  # MLP width (Qwen layers each carry an MLP; Nemotron-H has MLP layers)
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_embeddings: bool = False
    gated_attention: bool = False  # Qwen3.5: the attention output is gated (q_proj is twice as wide)
    # Gated DeltaNet (Qwen3.5 linear attention)
    linear_k_heads: int = 0
    linear_v_heads: int = 0
    linear_k_dim: int = 0
    linear_v_dim: int = 0
    conv_kernel: int = 4
    # Mamba-2 (Nemotron-H)
    mamba_heads: int = 0
    mamba_head_dim: int = 0
    mamba_state: int = 0
    mamba_groups: int = 0
    mamba_chunk_size: int = 0  # the SSD kernel's chunk (config `chunk_size`); vLLM 0.29's "all" mode aligns to it
    dtype_bytes: int = 2
    state_dtype_bytes: int = 2  # recurrent states in the model dtype (vLLM's default 'auto')
    mlp_per_layer: bool = True  # Qwen-style blocks: every attention/linear layer is followed by an MLP
    # The config's SSM state dtype as vLLM reads it (Qwen3.5 `mamba_ssm_dtype`, Nemotron-H
    # `mamba_ssm_cache_dtype`); it sets vLLM's hybrid block size (spec/vllm_align.py).
    mamba_ssm_dtype: str = "auto"

    # ------------------------------------------------------------------ derived
    @property
    def is_hybrid(self) -> bool:
        return any(k in (LINEAR, MAMBA) for k in self.layers)

    @property
    def sigma(self) -> frozenset[str]:
        """Σ: state components a boundary needs."""
        return frozenset({"kv", "rec", "conv"}) if self.is_hybrid else frozenset({"kv"})

    def count(self, kind: str) -> int:
        return sum(1 for k in self.layers if k == kind)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.count(ATTN) * 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def _gdn_conv_dim(self) -> int:
        return 2 * self.linear_k_heads * self.linear_k_dim + self.linear_v_heads * self.linear_v_dim

    @property
    def _mamba_inner(self) -> int:
        return self.mamba_heads * self.mamba_head_dim

    @property
    def state_bytes_per_snapshot(self) -> int:
        """rec + conv of every linear/Mamba layer at one boundary."""
        gdn_rec = self.linear_v_heads * self.linear_k_dim * self.linear_v_dim * self.state_dtype_bytes
        gdn_conv = self._gdn_conv_dim * (self.conv_kernel - 1) * self.dtype_bytes
        m_rec = self.mamba_heads * self.mamba_head_dim * self.mamba_state * self.state_dtype_bytes
        m_conv = (self._mamba_inner + 2 * self.mamba_groups * self.mamba_state) * (self.conv_kernel - 1) \
            * self.dtype_bytes
        return self.count(LINEAR) * (gdn_rec + gdn_conv) + self.count(MAMBA) * (m_rec + m_conv)

    def layer_params(self, kind: str) -> int:
        h = self.hidden_size
        mlp = 3 * h * self.intermediate_size
        if kind == ATTN:
            q = self.num_heads * self.head_dim * (2 if self.gated_attention else 1)
            p = h * q + 2 * h * self.num_kv_heads * self.head_dim + self.num_heads * self.head_dim * h
            return p + (mlp if self.mlp_per_layer else 0)
        if kind == LINEAR:
            vdim = self.linear_v_heads * self.linear_v_dim
            p = h * (self._gdn_conv_dim + vdim + 2 * self.linear_v_heads) + vdim * h
            return p + mlp
        if kind == MAMBA:
            inner = self._mamba_inner
            in_proj = h * (2 * inner + 2 * self.mamba_groups * self.mamba_state + self.mamba_heads)
            return in_proj + inner * h
        if kind == MLP:
            return 2 * h * self.intermediate_size  # Nemotron-H MLP: up + down (squared ReLU)
        raise ValueError(f"unknown layer kind {kind!r}")

    @property
    def num_params(self) -> int:
        emb = self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2)
        return emb + sum(self.layer_params(k) for k in self.layers)

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    @property
    def flops_per_token(self) -> int:
        """Dense FLOPs per token (2 per weight, without the context-dependent attention term)."""
        dense = sum(self.layer_params(k) for k in self.layers) + self.vocab_size * self.hidden_size
        return 2 * dense

    def attention_flops(self, new_tokens: int, context_before: int) -> float:
        """QK^T and PV FLOPs of `new_tokens` causal queries after `context_before` cached tokens."""
        pairs = new_tokens * context_before + new_tokens * (new_tokens + 1) / 2
        return 4.0 * self.count(ATTN) * self.num_heads * self.head_dim * pairs

    def recurrent_flops(self, new_tokens: int) -> float:
        """State-update FLOPs of linear/Mamba layers (outer-product update + readout per token)."""
        gdn = 6.0 * self.linear_v_heads * self.linear_k_dim * self.linear_v_dim
        mamba = 6.0 * self.mamba_heads * self.mamba_head_dim * self.mamba_state
        return new_tokens * (self.count(LINEAR) * gdn + self.count(MAMBA) * mamba)


# ---------------------------------------------------------------------------- presets
def _qwen35_layers(n: int, interval: int = 4) -> tuple[str, ...]:
    return tuple(ATTN if (i + 1) % interval == 0 else LINEAR for i in range(n))


def _nemotron_layers(pattern: str) -> tuple[str, ...]:
    table = {"M": MAMBA, "*": ATTN, "-": MLP}
    try:
        return tuple(table[c] for c in pattern)
    except KeyError as e:
        raise ValueError(f"hybrid_override_pattern has unknown layer code {e.args[0]!r}") from None


_QWEN35 = dict(model_type="qwen3_5_text", vocab_size=248320, head_dim=256, gated_attention=True,
               linear_k_dim=128, linear_v_dim=128, conv_kernel=4, mamba_ssm_dtype="float32")
NEMOTRON_NANO_9B_V2_PATTERN = "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"

PRESETS: dict[str, ModelSpec] = {
    "qwen3.5-0.8b": ModelSpec("qwen3.5-0.8b", layers=_qwen35_layers(24), hidden_size=1024,
                              intermediate_size=3584, num_heads=8, num_kv_heads=2, tie_embeddings=True,
                              linear_k_heads=16, linear_v_heads=16, **_QWEN35),
    "qwen3.5-4b": ModelSpec("qwen3.5-4b", layers=_qwen35_layers(32), hidden_size=2560,
                            intermediate_size=9216, num_heads=16, num_kv_heads=4, tie_embeddings=True,
                            linear_k_heads=16, linear_v_heads=32, **_QWEN35),
    "qwen3.5-9b": ModelSpec("qwen3.5-9b", layers=_qwen35_layers(32), hidden_size=4096,
                            intermediate_size=12288, num_heads=16, num_kv_heads=4,
                            linear_k_heads=16, linear_v_heads=32, **_QWEN35),
    "qwen3.5-27b": ModelSpec("qwen3.5-27b", layers=_qwen35_layers(64), hidden_size=5120,
                             intermediate_size=17408, num_heads=24, num_kv_heads=4,
                             linear_k_heads=16, linear_v_heads=48, **_QWEN35),
    "nemotron-nano-9b-v2": ModelSpec("nemotron-nano-9b-v2", "nemotron_h",
                                     layers=_nemotron_layers(NEMOTRON_NANO_9B_V2_PATTERN), hidden_size=4480,
                                     intermediate_size=15680, vocab_size=131072, num_heads=40,
                                     num_kv_heads=8, head_dim=128, mamba_heads=128, mamba_head_dim=80,
                                     mamba_state=128, mamba_groups=8, mamba_chunk_size=128, conv_kernel=4,
                                     mlp_per_layer=False),
    "qwen3-8b": ModelSpec("qwen3-8b", "qwen3", layers=(ATTN,) * 36, hidden_size=4096, intermediate_size=12288,
                          vocab_size=151936, num_heads=32, num_kv_heads=8, head_dim=128),
}


def get_spec(name_or_path: str) -> ModelSpec:
    """A preset by name, or a spec read from a directory / config.json path."""
    key = name_or_path.strip().lower()
    if key in PRESETS:
        return PRESETS[key]
    p = Path(name_or_path)
    if p.is_dir():
        p = p / "config.json"
    if p.is_file():
        try:
            cfg = json.loads(p.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{p}: invalid JSON ({e})") from None
        try:
            return spec_from_hf_config(cfg, name=p.parent.name)
        except ValueError as e:
            raise ValueError(f"{p}: {e}") from None
    raise ValueError(f"unknown model {name_or_path!r}: use a preset ({', '.join(PRESETS)}) "
                     f"or a directory holding config.json")


_HEAD_DIM_DEFAULT = {"qwen3_5_text": 256, "qwen3": 128, "nemotron_h": 128}
_NEMOTRON_KINDS = {"linear_attention": MAMBA, "mamba": MAMBA, "full_attention": ATTN, "attention": ATTN,
                   "mlp": MLP}


def _nemotron_layer_list(cfg: dict) -> tuple[str, ...]:
    """`layers_block_type` (or its alias `layer_types`), else the legacy `hybrid_override_pattern`."""
    listed = cfg.get("layers_block_type") or cfg.get("layer_types")
    if listed:
        bad = sorted(set(listed) - set(_NEMOTRON_KINDS))
        if bad:
            raise ValueError(f"config.json (nemotron_h): layers_block_type has unsupported kinds {bad}")
        return tuple(_NEMOTRON_KINDS[k] for k in listed)
    pattern = cfg.get("hybrid_override_pattern")
    if not pattern:
        raise ValueError("config.json (nemotron_h) lacks 'layers_block_type' and 'hybrid_override_pattern'")
    return _nemotron_layers(pattern)


def spec_from_hf_config(cfg: dict, name: str = "model") -> ModelSpec:
    """Reads an HF config dict (model types qwen3_5_text, qwen3_5, qwen3_next, nemotron_h, qwen3, llama)."""
    if not isinstance(cfg, dict):
        raise ValueError(f"config.json must hold a JSON object, got {type(cfg).__name__}")
    mt = cfg.get("model_type")
    if mt == "qwen3_5" and isinstance(cfg.get("text_config"), dict):
        text = {**cfg["text_config"], "model_type": "qwen3_5_text"}
        if "tie_word_embeddings" in cfg:  # the wrapper's flag governs, as in transformers
            text["tie_word_embeddings"] = cfg["tie_word_embeddings"]
        return spec_from_hf_config(text, name)

    def need(key):
        if key not in cfg:
            raise ValueError(f"config.json ({mt}) lacks {key!r}")
        return cfg[key]

    h = need("hidden_size")
    n = len(_nemotron_layer_list(cfg)) if mt == "nemotron_h" else need("num_hidden_layers")
    heads = need("num_attention_heads")
    # transformers 5.23's per-family defaults when the key is absent (llama: hidden / heads)
    head_dim = cfg.get("head_dim") or _HEAD_DIM_DEFAULT.get(mt) or h // heads
    common = dict(name=name, model_type=mt, hidden_size=h, vocab_size=need("vocab_size"), num_heads=heads,
                  num_kv_heads=cfg.get("num_key_value_heads") or heads, head_dim=head_dim,
                  tie_embeddings=bool(cfg.get("tie_word_embeddings", False)))
    if mt in ("qwen3_5_text", "qwen3_next"):
        types = cfg.get("layer_types") or [
            "full_attention" if (i + 1) % cfg.get("full_attention_interval", 4) == 0 else "linear_attention"
            for i in range(n)]
        layers = tuple(ATTN if t == "full_attention" else LINEAR for t in types)
        return ModelSpec(layers=layers, intermediate_size=cfg.get("intermediate_size") or
                         cfg.get("moe_intermediate_size", 0), gated_attention=True,
                         linear_k_heads=need("linear_num_key_heads"), linear_v_heads=need("linear_num_value_heads"),
                         linear_k_dim=need("linear_key_head_dim"), linear_v_dim=need("linear_value_head_dim"),
                         conv_kernel=cfg.get("linear_conv_kernel_dim", 4),
                         mamba_ssm_dtype=str(cfg.get("mamba_ssm_dtype") or "auto"), **common)
    if mt == "nemotron_h":
        return ModelSpec(layers=_nemotron_layer_list(cfg), intermediate_size=need("intermediate_size"),
                         mamba_heads=need("mamba_num_heads"), mamba_head_dim=need("mamba_head_dim"),
                         mamba_state=need("ssm_state_size"),
                         mamba_groups=cfg.get("mamba_n_groups", cfg.get("n_groups", 8)),
                         # vLLM's get_mamba_chunk_size: `mamba_chunk_size`, else `chunk_size` (default 128)
                         mamba_chunk_size=int(cfg.get("mamba_chunk_size") or cfg.get("chunk_size") or 128),
                         conv_kernel=cfg.get("mamba_d_conv", cfg.get("conv_kernel", 4)), mlp_per_layer=False,
                         mamba_ssm_dtype=str(cfg.get("mamba_ssm_cache_dtype") or "auto"), **common)
    if mt in ("qwen3", "llama"):
        return ModelSpec(layers=(ATTN,) * n, intermediate_size=need("intermediate_size"), **common)
    raise ValueError(f"unsupported model_type {mt!r}; supported: qwen3_5_text, qwen3_5, qwen3_next, "
                     f"nemotron_h, qwen3, llama")
