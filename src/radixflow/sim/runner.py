"""Runs arms of the simulator over a workload: the shared back end of `radixflow simulate` and
`radixflow experiment`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from radixflow.cache.eviction import ReuseCosts
from radixflow.config import SchedulerConfig
from radixflow.core.branch import Branch
from radixflow.core.loop import run_trace
from radixflow.core.metrics import ArmMeasures, measure, merge
from radixflow.core.policies import Arm
from radixflow.core.scheduler import Scheduler
from radixflow.sim.cost_model import BOOKKEEPING_PAGES, GPU, CostModel, cache_budget, pool_sizes
from radixflow.sim.executor import SimExecutor
from radixflow.spec.model_spec import ModelSpec
from radixflow.spec.vllm_align import apply_vllm_align, vllm_slot_bytes
from radixflow.workloads.trace import fresh_copies


@dataclass
class SimSetup:
    spec: ModelSpec
    gpu: GPU
    config: SchedulerConfig
    gpu_memory_utilization: float = 0.8
    state_fraction: float | None = None  # None: one unified byte pool (vLLM's hybrid allocator)
    size_pools: bool = True  # size the pools from GPU memory (else keep config's pool sizes)
    check: bool = False  # check_integrity() after every round (tests)
    round_hook: Callable | None = field(default=None, repr=False)
    cost_model: Callable[[ModelSpec, GPU], CostModel] = field(default=CostModel, repr=False)  # c(B) factory

    def scheduler_config(self) -> SchedulerConfig:
        cfg = apply_vllm_align(SchedulerConfig(**vars(self.config)), self.spec, self.gpu.name)
        if not self.size_pools:
            return cfg
        if self.state_fraction is not None:
            cfg.num_kv_pages, cfg.num_state_slots = pool_sizes(
                self.spec, self.gpu, cfg.block_size, self.gpu_memory_utilization, self.state_fraction)
            return cfg
        budget = cache_budget(self.spec, self.gpu, self.gpu_memory_utilization)
        page_bytes = self.spec.kv_bytes_per_token * cfg.block_size
        slot_bytes = self.spec.state_bytes_per_snapshot
        if cfg.snapshot_mode == "vllm-align" and self.spec.is_hybrid:
            # vLLM pads state pages to KV pages (an attention-free model has none to pad to)
            slot_bytes = vllm_slot_bytes(self.spec, cfg.block_size) or slot_bytes
        # An attention-free model's pages hold no bytes: they only index the prefix tree.
        cfg.num_kv_pages = max(1, budget // page_bytes) if page_bytes else BOOKKEEPING_PAGES
        cfg.num_state_slots = budget // slot_bytes if self.spec.is_hybrid else 0
        cfg.cache_memory_bytes, cfg.kv_page_bytes, cfg.state_slot_bytes = budget, page_bytes, slot_bytes
        return cfg


def run_arm(setup: SimSetup, arm: Arm, workloads: list[list[Branch]],
            progress: Callable[[int], None] | None = None) -> tuple[ArmMeasures, list]:
    """Runs one arm over each workload part (fresh cache each); returns merged measures and the runs."""
    parts = []
    runs = []
    for branches in workloads:
        cfg = setup.scheduler_config()
        cost = setup.cost_model(setup.spec, setup.gpu)
        cost.block_size = cfg.block_size  # what a page copy moves
        sched = Scheduler(cfg, arm, setup.spec.is_hybrid, reuse_costs(setup.spec, cfg.block_size),
                          handoff_costs=cost.handoff_costs())

        def hook(s, batch):
            if setup.check:
                s.check_integrity()
            if setup.round_hook is not None:
                setup.round_hook(s, batch)

        res = run_trace(sched, SimExecutor(cost, setup.spec.vocab_size),
                        fresh_copies(branches), on_round=hook, progress=progress)
        parts.append(measure(arm.name, res))
        runs.append(res)
    return merge(arm.name, parts), runs


def reuse_costs(spec: ModelSpec, block_size: int) -> ReuseCosts:
    """The model's prefill FLOPs and cache bytes, for `flop-aware` eviction."""
    return ReuseCosts(flops_per_token=spec.flops_per_token,
                      flops_per_pair=spec.attention_flops(1, 1) - spec.attention_flops(1, 0),
                      recurrent_flops_per_token=spec.recurrent_flops(1),
                      page_bytes=spec.kv_bytes_per_token * block_size,
                      slot_bytes=spec.state_bytes_per_snapshot if spec.is_hybrid else 0)
