"""vLLM 0.33's align-mode geometry for a hybrid model, computed from a ModelSpec (no vLLM import).

What vLLM derives, and where (vLLM 0.33 source):
- the attention block size B, raised until one attention page (one layer, B tokens) holds one
  Mamba/GDN layer's state page: `Platform._align_hybrid_block_size` (platforms/interface.py), with
  the state shapes of `MambaStateShapeCalculator.{gated_delta_net,mamba2}_state_shape` and dtypes of
  `MambaStateDtypeCalculator._mamba_state_dtype` (model_executor/layers/mamba/mamba_utils.py). The SSM
  state dtype is resolved per model: Qwen3.5 reads its config's `mamba_ssm_dtype`
  (`Qwen3_5ForConditionalGenerationConfig`), Nemotron-H defaults to float32
  (`NemotronHForCausalLMConfig.DEFAULT_MAMBA_SSM_CACHE_DTYPE`), both in model_executor/models/config.py;
- the prefix-match unit (`hash_block_size`): `--prefix-match-unit` if set, else the gcd of the
  KV cache groups' block sizes, which is B itself (`resolve_kv_cache_block_sizes`,
  v1/core/kv_cache_utils.py); hits finer than B ("partial hash hits") only exist when it is below B;
- whether every Mamba layer can export the prompt's last block-boundary state from inside the
  final prefill chunk (`mamba_has_prefill_checkpoint_blocks` in v1/core/sched/scheduler.py): Mamba-2
  layers always can (`MambaMixer2.get_kv_cache_spec`), Qwen's GDN layers only with the FlashInfer
  prefill kernel (`_resolve_gdn_prefill_backend`: Hopper SM90, or Blackwell with head_k_dim 128),
  else Triton. When they cannot, `_mamba_block_aligned_split` cuts the prompt's last chunk at that
  boundary and the tail runs in the next step.

`vllm_version="0.29"` is the paper's vLLM (v0.29.0, commit 98dff2a8, released 2026-09-09), where two
things differ (docs/simulator.md "What vLLM 0.29 did"):
- no layer kind exports the prompt's checkpoint from inside a chunk: Mamba-2's export came later
  (vLLM PR #57329, "[Mamba2] Enable internal prefill checkpoints", opened 2026-09-17, which names
  Kimi-K3's KDA as the only earlier one), so every hybrid prompt's last chunk is cut on every GPU;
- `--mamba-cache-mode all` still exists (deprecated, `CacheConfig._validate_mamba_cache_mode`): a
  model class that declares `SupportsMambaPrefixCaching` keeps it — the Mamba-2 hybrids, NemotronH
  among them — and any other falls back to align (`MambaModelConfig.verify_and_update_config`,
  model_executor/models/config.py), GDN models such as Qwen3.5 included. In "all" mode the block is
  aligned to the Mamba-2 chunk size (`_align_hybrid_block_size`'s "all" branch), the scheduler does not
  split chunks (`need_mamba_block_aligned_split` is align-only), the kernel writes the state at every
  block boundary, and the hash block backs off to the block whatever `--prefix-match-unit` asks
  (`resolve_kv_cache_block_sizes`: "Mamba groups outside align mode ... back off").
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import gcd, lcm

from radixflow.config import MAMBA_CACHE_MODES, VLLM_VERSIONS, SchedulerConfig
from radixflow.spec.model_spec import ATTN, LINEAR, MAMBA, ModelSpec

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}
KERNEL_BLOCK = 16  # FlashAttention's smallest kernel block (MultipleOf(16)) and vLLM's default --block-size
GDN_FLASHINFER_ALIGNMENT = 64  # FLASHINFER_GDN_CHECKPOINT_ALIGNMENT (v1/attention/backends/gdn_attn.py)
GPU_COMPUTE_CAPABILITY = {"a800": 80, "a100": 80, "h100": 90, "h200": 90, "b200": 100}
DEFAULT_MAMBA_CHUNK = 128  # transformers' NemotronHConfig.chunk_size, which vLLM's get_mamba_chunk_size reads


def ssm_dtype_bytes(spec: ModelSpec, override: str | None = None) -> int:
    """Bytes per element of the recurrent (temporal) state as vLLM resolves `mamba_ssm_cache_dtype`."""
    name = override or spec.mamba_ssm_dtype
    if name in (None, "auto"):
        # 'auto': Nemotron-H falls back to float32, other models keep the model dtype.
        return 4 if spec.model_type == "nemotron_h" else spec.dtype_bytes
    try:
        return DTYPE_BYTES[name]
    except KeyError:
        raise ValueError(f"unknown SSM state dtype {name!r}; use one of {', '.join(DTYPE_BYTES)} or auto") from None


def attention_page_bytes_per_token(spec: ModelSpec) -> int:
    """One attention layer's KV bytes per token (`FullAttentionSpec(block_size=1).page_size_bytes`)."""
    return 2 * spec.num_kv_heads * spec.head_dim * spec.dtype_bytes


def state_page_bytes(spec: ModelSpec, ssm_dtype: str | None = None) -> int:
    """One linear/Mamba layer's state (conv + recurrent), vLLM's unpadded Mamba page (TP = 1)."""
    ssm = ssm_dtype_bytes(spec, ssm_dtype)
    conv_rows = spec.conv_kernel - 1
    if spec.count(LINEAR):
        conv_dim = 2 * spec.linear_k_heads * spec.linear_k_dim + spec.linear_v_heads * spec.linear_v_dim
        rec = spec.linear_v_heads * spec.linear_v_dim * spec.linear_k_dim
    elif spec.count(MAMBA):
        conv_dim = spec.mamba_heads * spec.mamba_head_dim + 2 * spec.mamba_groups * spec.mamba_state
        rec = spec.mamba_heads * spec.mamba_head_dim * spec.mamba_state
    else:
        return 0
    return conv_dim * conv_rows * spec.dtype_bytes + rec * ssm


def _check_version(version: str) -> None:
    if version not in VLLM_VERSIONS:
        raise ValueError(f"unknown --vllm-version {version!r}; choose from {', '.join(VLLM_VERSIONS)}")


def supports_all_mode(spec: ModelSpec) -> bool:
    """vLLM's `SupportsMambaPrefixCaching`: declared by the Mamba-2 hybrids (NemotronH, ...), not by the
    GDN models (Qwen3.5, Qwen3-Next), whose "all" mode never landed (vLLM PR #26807, still open)."""
    return bool(spec.count(MAMBA)) and not spec.count(LINEAR)


def resolve_mamba_cache_mode(spec: ModelSpec, mode: str, version: str = "0.33") -> str:
    """The mode vLLM runs this model in when asked for `mode` with prefix caching on."""
    _check_version(version)
    if mode not in MAMBA_CACHE_MODES:
        raise ValueError(f"unknown --mamba-cache-mode {mode!r}; choose from {', '.join(MAMBA_CACHE_MODES)}")
    if mode == "all" and version != "0.29":
        raise ValueError("--mamba-cache-mode all: vLLM 0.33 has no 'all' mode (MambaCacheMode is 'align' | "
                         "'none' in vllm/config/cache.py); use it with --vllm-version 0.29")
    return "all" if mode == "all" and supports_all_mode(spec) else "align"


def exports_prefill_checkpoint(spec: ModelSpec, gpu: str, version: str = "0.33") -> bool:
    """Can every state layer write the last block-boundary state inside the prompt's final chunk?"""
    _check_version(version)
    if version == "0.29":
        return False  # only Kimi-K3's KDA layers exported one before Mamba-2's (vLLM PR #57329)
    if spec.count(MAMBA) and not spec.count(LINEAR):
        return True  # MambaMixer2: num_prefill_checkpoint_blocks=1 on every platform
    if spec.count(LINEAR):
        sm = GPU_COMPUTE_CAPABILITY.get(gpu.strip().lower())
        if sm is None:
            raise ValueError(f"unknown GPU {gpu!r} for vLLM's GDN kernel choice; known: "
                             f"{', '.join(GPU_COMPUTE_CAPABILITY)}")
        return sm == 90 or (sm >= 100 and spec.linear_k_dim == 128)  # FlashInfer GDN prefill
    return False


def vllm_block_size(spec: ModelSpec, gpu: str = "a800", ssm_dtype: str | None = None,
                    block_size: int = KERNEL_BLOCK, version: str = "0.33", mode: str = "align") -> int:
    """The attention block size vLLM uses for this hybrid model (`block_size` for a full-attention
    model). Align mode: the smallest multiple of the kernel alignment whose page holds one state page;
    "all" mode (0.29, Mamba-2): the smallest multiple of lcm(Mamba-2 chunk, kernel alignment) that does."""
    if not spec.is_hybrid:
        return block_size
    mode = resolve_mamba_cache_mode(spec, mode, version)
    align = max(KERNEL_BLOCK, block_size)
    per_token = attention_page_bytes_per_token(spec)
    if mode == "all":
        chunk = lcm(spec.mamba_chunk_size or DEFAULT_MAMBA_CHUNK, align)
        tokens_per_state = -(-state_page_bytes(spec, ssm_dtype) // per_token)
        return chunk * -(-tokens_per_state // chunk)
    if spec.count(LINEAR) and exports_prefill_checkpoint(spec, gpu, version):
        align = lcm(align, GDN_FLASHINFER_ALIGNMENT)  # internal checkpoints land on block boundaries
    b = align * -(-state_page_bytes(spec, ssm_dtype) // (align * per_token))
    b = KERNEL_BLOCK * -(-b // KERNEL_BLOCK)
    return max(b, block_size)


@dataclass(frozen=True)
class VllmGeometry:
    """What `--snapshot-mode vllm-align` takes from vLLM for one model and GPU."""

    block_size: int  # B: KV page and Mamba state block
    hash_block_size: int  # prefix-match unit; < B only with --prefix-match-unit
    internal_checkpoint: bool  # the last boundary's state is exported without cutting the chunk
    mamba_cache_mode: str = "align"  # "all": 0.29's every-block state, no split, hits on B

    @property
    def partial_hits(self) -> bool:
        return self.hash_block_size < self.block_size


def vllm_geometry(spec: ModelSpec, gpu: str = "a800", ssm_dtype: str | None = None,
                  prefix_match_unit: int | None = None, block_size: int = KERNEL_BLOCK, version: str = "0.33",
                  mamba_cache_mode: str = "align") -> VllmGeometry:
    mode = resolve_mamba_cache_mode(spec, mamba_cache_mode, version) if spec.is_hybrid else "align"
    b = vllm_block_size(spec, gpu, ssm_dtype, block_size, version, mode)
    if mode == "all":  # vLLM backs the hash block off to the block, unchecked (resolve_kv_cache_block_sizes)
        return VllmGeometry(b, b, False, "all")
    unit = b if prefix_match_unit is None else prefix_match_unit
    if unit < 1 or b % unit:
        raise ValueError(f"--prefix-match-unit {prefix_match_unit} must divide vLLM's block size {b} "
                         f"for {spec.name}")
    unit = gcd(unit, b)
    return VllmGeometry(b, unit, spec.is_hybrid and exports_prefill_checkpoint(spec, gpu, version))


def apply_vllm_align(cfg: SchedulerConfig, spec: ModelSpec, gpu: str) -> SchedulerConfig:
    """A copy of `cfg` with vLLM's geometry when it asks for `vllm-align` on a hybrid model: block =
    state interval = vLLM's B, the internal-checkpoint condition, and a state slot as large as vLLM's
    padded Mamba pages (one attention page per state layer). Other configs come back unchanged."""
    if cfg.snapshot_mode != "vllm-align":
        return cfg
    if not spec.is_hybrid:
        if cfg.prefix_match_unit not in (0, cfg.block_size):  # as resolve_kv_cache_block_sizes refuses it
            raise ValueError(f"--prefix-match-unit {cfg.prefix_match_unit}: {spec.name} has one KV cache group, "
                             f"whose hits land on the block size ({cfg.block_size}); unset it or set it to that")
        return cfg
    g = vllm_geometry(spec, gpu, prefix_match_unit=cfg.prefix_match_unit or None, version=cfg.vllm_version,
                      mamba_cache_mode=cfg.mamba_cache_mode)
    out = replace(cfg, block_size=g.block_size, state_interval=g.block_size,
                  internal_checkpoint=g.internal_checkpoint, prefix_match_unit=g.hash_block_size,
                  mamba_cache_mode=g.mamba_cache_mode)
    out.validate()
    return out


def state_groups(spec: ModelSpec) -> int:
    """KV cache groups vLLM makes of the state layers: groups hold as many layers as the rarest kind
    (the attention layers), the last one padded (`_get_kv_cache_groups_uniform_page_size`,
    v1/core/kv_cache_planning.py). One snapshot takes one block in each."""
    state, attn = spec.count(LINEAR) + spec.count(MAMBA), spec.count(ATTN)
    return -(-state // attn) if state and attn else int(bool(state))


def vllm_slot_bytes(spec: ModelSpec, block: int) -> int:
    """Bytes of one state snapshot in vLLM: a block (one attention page per layer of a group) per state group."""
    return state_groups(spec) * spec.count(ATTN) * block * attention_page_bytes_per_token(spec)
