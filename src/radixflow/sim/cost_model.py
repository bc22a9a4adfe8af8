"""c(B): the host time of one worker call, from a model spec, a GPU and the batch's fragments.

c(B) = host + layer_launch·L + row·|B| + max(dense compute, weight + KV + state traffic)
       + attention + recurrent-state work + hand-off levels
Dense compute counts the LM head once per row, not per token: vLLM computes logits only at each
scheduled request's last position (`logits_indices = query_start_loc[1:] - 1` in its model runner).
`terms(B)` gives the same sum term by term. The constants: see docs/simulator.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from radixflow.core.batch import Batch
from radixflow.core.handoff import HandoffCosts, levels_of
from radixflow.spec.model_spec import LINEAR, MAMBA, ModelSpec

# In-forward hand-off (SPEC §15): an extra level runs every recurrent layer's prefill kernels once more, over
# that level's rows; projections, MLPs, norms and attention stay single passes. Kernel launches per recurrent
# layer per level, counted by reading vLLM 0.33's prefill paths:
# - GDN (layers/mamba/gdn/qwen_gdn_linear_attn.py, the fla backend): causal_conv1d_fn, fused_post_conv_prep,
#   then chunk_gated_delta_rule_fwd (third_party/flash_linear_attention/ops/chunk.py): chunk_local_cumsum,
#   chunk_scaled_dot_kkt_fwd, solve_tril (one merge kernel at BT = 64), recompute_w_u_fwd,
#   chunk_gated_delta_rule_fwd_h, chunk_fwd_o: 8 launches; plus prepare_chunk_indices for the level's own
#   cu_seqlens (ops/index.py: a device-to-host `.tolist()` sync and a host-to-device copy), counted as 1.
GDN_LEVEL_LAUNCHES = 9
# - Mamba-2 (layers/mamba/mamba_mixer2.py, ops/ssd_combined.py: _mamba_chunk_scan_combined_fwd):
#   causal_conv1d_fn, _chunk_cumsum_fwd, _chunk_state_fwd, _state_passing_fwd, _bmm_chunk_fwd,
#   _chunk_scan_fwd: 6 launches; plus the level's chunk metadata (cu_chunk_seqlens, last_chunk_indices)
#   built on the host and copied, counted as 1.
MAMBA_LEVEL_LAUNCHES = 7
# The time of one eager launch: CostConstants.layer_launch (1.1 ms per layer, fitted: docs/simulator.md)
# spread over the kernels one Qwen3.5 GDN decoder layer launches in vLLM: input RMSNorm, in_proj_qkvz,
# in_proj_ba, the 8 recurrent launches above, RMSNormGated, out_proj, post-attention RMSNorm, gate_up_proj,
# SiluAndMul, down_proj = 17. So one launch ≈ 65 µs (Python-side Triton launches dominate in eager mode).
KERNELS_PER_LAYER = 17

# Page count for an attention-free model, whose pages hold no bytes and only index the prefix tree.
BOOKKEEPING_PAGES = 1 << 20


@dataclass(frozen=True)
class GPU:
    name: str
    bf16_flops: float  # dense peak, FLOP/s
    hbm_bandwidth: float  # bytes/s
    memory: float  # bytes


GPUS: dict[str, GPU] = {
    "a800": GPU("a800", 312e12, 2.039e12, 80e9),
    "h100": GPU("h100", 989e12, 3.35e12, 80e9),
    "h200": GPU("h200", 989e12, 4.8e12, 141e9),
}


def get_gpu(name: str) -> GPU:
    gpu = GPUS.get(name.strip().lower())
    if gpu is None:
        raise ValueError(f"unknown GPU {name!r}; choose from: {', '.join(GPUS)}")
    return gpu


@dataclass(frozen=True)
class CostConstants:
    host: float = 0.006  # fixed per call: scheduling, input preparation, sampling (eager mode)
    layer_launch: float = 0.0011  # per layer per call: eager kernel launches
    row: float = 0.0004  # per row: metadata, state gather/scatter, logits
    # Fraction of peak reached by the dense GEMMs. FITTED to a paper figure, not derived: chosen so
    # the Qwen3.5-27B run costs the paper's ~180 ms per 1,000 scheduled tokens (SPEC §11: 183 -> 175);
    # first principles would put real GEMMs on an A800 well below 0.92 (docs/simulator.md, "c(B)").
    dense_efficiency: float = 0.92
    attention_efficiency: float = 0.45
    recurrent_efficiency: float = 0.10  # chunked GDN / SSD kernels run far from peak
    bandwidth_efficiency: float = 0.80


class CallCost(NamedTuple):
    """c(B) by term, in seconds; `total` is what the executor charges."""

    host: float  # fixed per call
    launches: float  # eager kernel launches, per layer
    rows: float  # per-row host work
    dense_or_traffic: float  # max(dense GEMMs, weight + KV + state bytes)
    attention: float
    recurrent: float
    handoff: float = 0.0  # extra recurrent levels (SPEC §15)

    @property
    def total(self) -> float:
        return sum(self)


class CostModel:
    def __init__(self, spec: ModelSpec, gpu: GPU, constants: CostConstants = CostConstants(),
                 block_size: int = 16) -> None:
        self.spec = spec
        self.block_size = block_size  # tokens per KV page: what a page copy moves
        self.gpu = gpu
        self.k = constants

    def call_time(self, batch: Batch) -> float:
        return self.terms(batch).total if batch.num_rows else 0.0

    def terms(self, batch: Batch) -> CallCost:
        s, g, k = self.spec, self.gpu, self.k
        tokens = batch.num_tokens
        rows = batch.num_rows
        if rows == 0:
            return CallCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        head = 2 * s.vocab_size * s.hidden_size  # LM-head FLOPs of one position
        dense = ((s.flops_per_token - head) * tokens + head * rows) / (g.bf16_flops * k.dense_efficiency)
        attn = 0.0
        kv_bytes = 0.0
        for f in batch.fragments:
            attn += s.attention_flops(f.num_tokens, f.start)
            kv_bytes += (f.start + f.num_tokens) * s.kv_bytes_per_token
        state_bytes = rows * s.state_bytes_per_snapshot  # restore per row
        traffic = (s.weight_bytes + kv_bytes + state_bytes + self.capture_bytes(batch)) / (
            g.hbm_bandwidth * k.bandwidth_efficiency)
        attn_t = attn / (g.bf16_flops * k.attention_efficiency)
        rec_t = s.recurrent_flops(tokens) / (g.bf16_flops * k.recurrent_efficiency)
        return CallCost(k.host, k.layer_launch * len(s.layers), k.row * rows, max(dense, traffic), attn_t, rec_t,
                        self.handoff_time(batch))

    def level_time(self) -> float:
        """One extra recurrent level in one forward: its kernel launches in every recurrent layer."""
        s = self.spec
        launches = s.count(LINEAR) * GDN_LEVEL_LAUNCHES + s.count(MAMBA) * MAMBA_LEVEL_LAUNCHES
        return launches * self.k.layer_launch / KERNELS_PER_LAYER

    def handoff_time(self, batch: Batch) -> float:
        """The extra levels of a batch with dependent rows (`Fragment.after`): (levels - 1) x level_time."""
        if not any(f.after is not None for f in batch.fragments):
            return 0.0
        return max(levels_of(batch)) * self.level_time()

    def handoff_costs(self) -> HandoffCosts:
        """What `--handoff auto` weighs (core/handoff.py): an extra level; one prompt token's marginal
        dense + recurrent compute (what recomputing a gap costs, LM head aside); a round's fixed part."""
        s, g, k = self.spec, self.gpu, self.k
        head = 2 * s.vocab_size * s.hidden_size
        token = ((s.flops_per_token - head) / (g.bf16_flops * k.dense_efficiency)
                 + s.recurrent_flops(1) / (g.bf16_flops * k.recurrent_efficiency))
        return HandoffCosts(level=self.level_time(), token=token, round=k.host + k.layer_launch * len(s.layers))

    def capture_bytes(self, batch: Batch) -> int:
        """Bytes written by state captures (each `state_out` point) and page copies (read + write):
        what branch-point checkpoints add to a call (SPEC §14)."""
        s = self.spec
        snaps = sum(len(f.state_out) for f in batch.fragments)
        copies = sum(len(f.copies_before) + len(f.copies_after) for f in batch.fragments)
        return snaps * s.state_bytes_per_snapshot + 2 * copies * s.kv_bytes_per_token * self.block_size

    def capture_time(self, batch: Batch) -> float:
        """The capture bytes at the modelled bandwidth (an upper bound on their share of c(B))."""
        return self.capture_bytes(batch) / (self.gpu.hbm_bandwidth * self.k.bandwidth_efficiency)


def cache_budget(spec: ModelSpec, gpu: GPU, utilization: float = 0.8, activation_reserve: float = 0.04) -> int:
    """Bytes left for KV pages and state slots in `utilization` of the GPU after weights and activations."""
    budget = gpu.memory * (utilization - activation_reserve) - spec.weight_bytes
    if budget <= 0:
        raise ValueError(f"{spec.name} weights ({spec.weight_bytes / 1e9:.1f} GB) do not fit in "
                         f"{utilization:.0%} of {gpu.name} memory")
    return int(budget)


def pool_sizes(spec: ModelSpec, gpu: GPU, block_size: int, utilization: float = 0.8,
               state_fraction: float = 0.5, activation_reserve: float = 0.04) -> tuple[int, int]:
    """(KV pages, snapshot slots) for a fixed split: `state_fraction` of the cache budget goes to
    state slots (working states of running branches and snapshots), the rest to KV pages."""
    budget = cache_budget(spec, gpu, utilization, activation_reserve)
    if not spec.is_hybrid:
        return int(budget // (spec.kv_bytes_per_token * block_size)), 0
    slots = int(budget * state_fraction // spec.state_bytes_per_snapshot)
    page_bytes = spec.kv_bytes_per_token * block_size
    # An attention-free model's pages hold no bytes: they only index the prefix tree.
    pages = int(budget * (1 - state_fraction) // page_bytes) if page_bytes else BOOKKEEPING_PAGES
    return pages, slots
