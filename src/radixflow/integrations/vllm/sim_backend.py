"""`radixflow simulate --scheduler vllm`: the simulator driving vLLM 0.33's own `Scheduler`.

It lives with the plugin, above `sim/` (which imports nothing from integrations/); importing this
module does not import vLLM, `arm_runner("vllm")` does.

No model runs. vLLM schedules; a stand-in model output gives each request its token once its
prefill is done (`cpu_harness.stand_in_model_output`); the same cost model c(B) advances the same
virtual clock, and the same measures come out (`measure` over a run-like record). The `radix*` arms
run vLLM's native scheduler, the `radixflow*` arms the plugin
(`integrations.vllm.scheduler.StateReadyScheduler`); the arm's admission rule (immediate, timer,
flexible) runs here in the driver, releasing held branches into vLLM's waiting queue.

The vLLM scheduler gets the geometry `--snapshot-mode vllm-align` models (spec/vllm_align.py): one
full-attention group and one Mamba group in align mode with block B, hash block B, and a prefill
checkpoint block when every state layer can export it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from radixflow.config import SchedulerConfig
from radixflow.core.batch import Batch, Fragment
from radixflow.core.branch import Branch, BranchState
from radixflow.core.loop import RunResult
from radixflow.core.metrics import ArmMeasures, measure, merge
from radixflow.core.policies import AdmissionView, Arm, StateReady
from radixflow.core.scheduler import RoundRecord
from radixflow.core.vllm_split import internal_checkpoint
from radixflow.sim.cost_model import CostModel
from radixflow.sim.runner import run_arm
from radixflow.spec.vllm_align import state_groups
from radixflow.workloads.trace import fresh_copies


class VllmUnavailable(RuntimeError):
    """vLLM 0.33 cannot be imported here."""


def _harness():
    try:
        from radixflow.integrations.vllm import cpu_harness
    except ImportError as exc:
        raise VllmUnavailable(f"--scheduler vllm needs vLLM 0.33 (the 'vllm' extra: "
                              f"bash scripts/install_vllm.sh .venv/bin/python): {exc}") from None
    return cpu_harness


def require_vllm() -> None:
    """Raises VllmUnavailable unless vLLM 0.33 and the CPU harness import; builds the stand-in model
    config once, so that forked grid workers inherit it instead of each paying seconds for it."""
    _harness()._model_config(DEFAULT_MAX_MODEL_LEN)


DEFAULT_MAX_MODEL_LEN = 16384


def build_scheduler(cfg: SchedulerConfig, hybrid: bool, plugin: bool, num_gpu_blocks: int, max_model_len: int,
                    num_state_groups: int = 1):
    """A fresh vLLM scheduler with the cache geometry of `cfg` (block, internal checkpoint) and
    `num_state_groups` Mamba groups drawing on the same block pool (vLLM's hybrid layout)."""
    h = _harness()
    import torch
    from vllm.config import CacheConfig, VllmConfig
    from vllm.config import SchedulerConfig as VllmSchedulerConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec
    from vllm.v1.structured_output import StructuredOutputManager

    bs = cfg.block_size
    vllm_config = VllmConfig(
        model_config=h._model_config(max_model_len),
        scheduler_config=VllmSchedulerConfig(
            max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
            max_model_len=max_model_len, enable_chunked_prefill=True, is_encoder_decoder=False, watermark=0.0),
        cache_config=CacheConfig(block_size=bs, enable_prefix_caching=cfg.enable_prefix_caching,
                                 mamba_cache_mode="align" if hybrid else "none"),
    )
    vllm_config.cache_config.num_gpu_blocks = num_gpu_blocks
    register_all_kvcache_specs(vllm_config)
    groups = [KVCacheGroupSpec(["attn"], FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1,
                                                           dtype=torch.float32))]
    if hybrid:
        inside = cfg.internal_checkpoint
        state = MambaSpec(block_size=bs, shapes=((1, 1),), dtypes=(torch.float32,), mamba_cache_mode="align",
                          num_prefill_checkpoint_blocks=int(inside),
                          prefill_checkpoint_alignment=1 if inside else None)
        groups += [KVCacheGroupSpec([f"mamba{g}"], state) for g in range(num_state_groups)]
    kv_cache_config = KVCacheConfig(num_blocks=num_gpu_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    cls = h.StateReadyScheduler if plugin else Scheduler
    return cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
               structured_output_manager=StructuredOutputManager(vllm_config), block_size=bs,
               hash_block_size=cfg.prefix_match_unit or bs, log_stats=False)


@dataclass
class _Record:
    """What `measure` reads from a scheduler, filled by the driver."""

    config: SchedulerConfig
    vllm: object = None  # the vLLM scheduler that ran
    rounds: list[RoundRecord] = field(default_factory=list)
    blocked_total: int = 0
    preemptions: int = 0
    max_level: int = 0
    exact_checkpoints: int = 0  # branch-point snapshots (SPEC §14): vLLM makes none


def run_vllm_trace(cfg: SchedulerConfig, arm: Arm, cost: CostModel, branches: list[Branch], hybrid: bool,
                   num_gpu_blocks: int, progress: Callable[[int], None] | None = None,
                   max_steps: int = 10_000_000, num_state_groups: int = 1) -> RunResult:
    """Runs every branch through one vLLM scheduler under the arm's admission rule and the cost model."""
    h = _harness()
    if arm.frag:
        raise ValueError(f"arm {arm.name!r} has no vLLM counterpart (the plugin does not split fragments); "
                         f"--scheduler vllm runs radix, radix+timer*, radix+flex and radixflow")
    plugin = isinstance(arm.traversal, StateReady)
    longest = max((b.prompt_len + b.max_new_tokens for b in branches), default=1)
    sched = build_scheduler(cfg, hybrid, plugin, num_gpu_blocks, max(DEFAULT_MAX_MODEL_LEN, longest + cfg.block_size),
                            num_state_groups)
    bs = cfg.block_size
    rec = _Record(cfg, sched)
    order = sorted(branches, key=lambda b: b.arrival)
    by_id: dict[str, Branch] = {}
    requests: dict[str, object] = {}
    held: list[Branch] = []

    def request_of(b: Branch):
        rid = f"{b.request_id}/{b.index}"
        if rid not in requests:
            requests[rid] = h.make_request(rid, b.prompt, cfg.prefix_match_unit or bs, max_tokens=b.max_new_tokens,
                                           arrival=b.arrival, cache_salt=b.namespace)
            by_id[rid] = b
        return requests[rid]

    def demand(b: Branch) -> int:
        req = request_of(b)
        _, hit, _ = sched.kv_cache_manager.get_computed_blocks(req)
        return b.num_tokens - hit

    now = order[0].arrival if order else 0.0
    i = done = 0
    for _ in range(max_steps):
        if i == len(order) and not held and not sched.get_num_unfinished_requests():
            break
        while i < len(order) and order[i].arrival <= now + 1e-12:
            held.append(order[i])
            i += 1
        deadline = None
        if held:
            view = AdmissionView(bool(sched.running), cfg.max_num_seqs, cfg.max_num_batched_tokens, demand)
            n, deadline = arm.admission.release(held, now, view)
            for b in held[:n]:
                b.state = BranchState.WAITING
                b.admitted_at = now
                sched.add_request(request_of(b))
            del held[:n]
        out = sched.schedule()
        scheduled = dict(out.num_scheduled_tokens)
        if not scheduled:
            sched.update_from_output(out, h.stand_in_model_output(sched, out))
            nxt = [t for t in (order[i].arrival if i < len(order) else None, deadline) if t is not None]
            if not nxt:
                raise RuntimeError(f"vLLM scheduled nothing at t={now:.3f}s with {len(sched.waiting)} waiting "
                                   f"and {len(sched.running)} running (is the block pool too small?)")
            now = max(now, min(nxt))
            continue
        for r in out.scheduled_new_reqs:
            b = by_id[r.req_id]
            if b.first_selected_at is None:
                b.first_selected_at = now
                b.cached_tokens = b.identity_hit = r.num_computed_tokens
            b.state = BranchState.RUNNING
        batch = Batch(len(rec.rounds) + 1)
        for rid, n in scheduled.items():
            b, req = by_id[rid], requests[rid]
            start = req.num_computed_tokens - n  # schedule() has already advanced it
            frag = Fragment(b, start, n, [], samples=start + n >= req.num_tokens)
            if hybrid:
                unit = cfg.prefix_match_unit or bs
                ckpt = internal_checkpoint(start, start + n, b.prompt_len, req.num_tokens, bs, cfg.internal_checkpoint,
                                           unit)
                # The captures radixflow's vllm-align row would plan: working state, internal checkpoint,
                # block-boundary chunk end (the cost model counts them); a tail-boundary stop's state is the
                # working state itself (one write, the block the request runs on).
                frag.state_out = [(n, 0)]
                if ckpt is not None:
                    frag.state_out.append((ckpt - start, 0))
                if (start + n) % bs == 0:
                    frag.state_out.append((n, 0))
                if start % bs and start == b.cached_tokens and b.num_fragments == 0:
                    frag.copies_before.append((0, 0))  # a partial hit: copy-on-write of the hit's last block
            batch.fragments.append(frag)
            b.num_fragments += 1
        deferred = len(getattr(sched, "blocked_last_step", []))
        host = cost.call_time(batch)
        now += host
        rec.rounds.append(RoundRecord(batch.round, now - host, batch.num_rows, batch.num_tokens, deferred, host))
        rec.blocked_total += deferred
        sched.update_from_output(out, h.stand_in_model_output(sched, out))
        finished = 0
        for f in batch.fragments:
            b, req = f.branch, requests[f"{f.branch.request_id}/{f.branch.index}"]
            if f.samples:
                b.output.append(h.SAMPLED_TOKEN)
                if b.first_token_at is None:
                    b.first_token_at = now
            if req.is_finished() and b.finished_at is None:
                b.finished_at = now
                b.finish_reason = "length"
                b.state = BranchState.FINISHED
                finished += 1
        if progress is not None and finished:
            progress(finished)
        done += finished
    else:
        raise RuntimeError(f"vLLM run did not finish within {max_steps} steps")
    rec.preemptions = sum(getattr(r, "num_preemptions", 0) for r in requests.values())
    return RunResult(rec, list(branches), now)  # type: ignore[arg-type]


def run_vllm_arm(setup, arm: Arm, workloads: list[list[Branch]],
                 progress: Callable[[int], None] | None = None) -> tuple[ArmMeasures, list]:
    """`sim.runner.run_arm` on vLLM's scheduler: one fresh scheduler per workload part. `setup.check`
    asserts after each part that vLLM's block pool holds no leaked block; a `round_hook` (it reads
    radixflow's scheduler) is refused."""
    if setup.round_hook is not None:
        raise ValueError("--scheduler vllm has no radixflow Scheduler to hand a round hook; "
                         "run the hook's cells on radixflow's scheduler")
    h = _harness()
    cfg = setup.scheduler_config()
    hybrid = setup.spec.is_hybrid
    if cfg.mamba_cache_mode == "all":
        raise ValueError(f"--scheduler vllm runs vLLM 0.33, which has no 'all' Mamba cache mode ({setup.spec.name} "
                         "would run in it under --vllm-version 0.29); use radixflow's scheduler for it")
    # radixflow's unified pool in vLLM's units: a block is one KV page; a snapshot takes one block per
    # state group (its slot bytes are sized so, spec.vllm_align.vllm_slot_bytes).
    blocks = cfg.cache_memory_bytes // cfg.kv_page_bytes if cfg.cache_memory_bytes and cfg.kv_page_bytes \
        else cfg.num_kv_pages
    parts, runs = [], []
    for branches in workloads:
        cost = setup.cost_model(setup.spec, setup.gpu)
        cost.block_size = cfg.block_size  # what a page copy moves (a partial hit's copy-on-write)
        res = run_vllm_trace(cfg, arm, cost, fresh_copies(branches), hybrid,
                             num_gpu_blocks=max(2, min(blocks, 1 << 22)), progress=progress,
                             num_state_groups=state_groups(setup.spec))
        if setup.check:
            leaked = h.usable_blocks(res.scheduler.vllm) - h.count_free_blocks(res.scheduler.vllm)
            if leaked:
                raise AssertionError(f"vLLM's block pool leaked {leaked} block(s) after {arm.name}")
        parts.append(measure(arm.name, res))
        runs.append(res)
    return merge(arm.name, parts), runs

SCHEDULERS = ("radixflow", "vllm")


def arm_runner(scheduler: str) -> Callable:
    """`sim.runner.run_arm` for radixflow's scheduler, `run_vllm_arm` for vLLM's; a ValueError naming
    the missing extra when vLLM is not importable (the CLI prints it as one line, exit 2)."""
    if scheduler == "radixflow":
        return run_arm
    if scheduler != "vllm":
        raise ValueError(f"unknown scheduler {scheduler!r}; choose from {', '.join(SCHEDULERS)}")
    try:
        require_vllm()
    except VllmUnavailable as exc:
        raise ValueError(str(exc)) from None
    return run_vllm_arm
