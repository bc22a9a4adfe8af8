"""Runs the scheduler arms on the cost-model simulator and compares them."""

from __future__ import annotations

import time

from rich.progress import Progress

from radixflow.cache.eviction import get_eviction
from radixflow.commands.common import (
    add_scheduler_flags,
    add_workload_flags,
    arms_payload,
    build_workloads,
    print_arms,
    scheduler_config,
    write_json,
)
from radixflow.commands.sessions import SESSION_WORKLOADS, add_session_flags, simulate_cli
from radixflow.config import MAMBA_CACHE_MODES, VLLM_VERSIONS, SchedulerConfig, help_of
from radixflow.core.policies import parse_arms
from radixflow.integrations.vllm.sim_backend import SCHEDULERS, arm_runner
from radixflow.sim.cost_model import GPUS, get_gpu
from radixflow.sim.runner import SimSetup
from radixflow.spec import PRESETS, get_spec


def add_arguments(p) -> None:
    p.add_argument("--model", default="qwen3.5-0.8b",
                   help=f"a preset ({', '.join(PRESETS)}) or a directory with an HF config.json")
    p.add_argument("--gpu", default="a800", help=f"one of {', '.join(GPUS)}")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.8)
    p.add_argument("--state-memory-fraction", type=float, default=None,
                   help="hybrid models: a fixed share of the cache memory for state slots "
                        "(default: one unified pool that pages and slots share, as vLLM's hybrid allocator)")
    add_workload_flags(p)
    add_scheduler_flags(p)
    p.add_argument("--check", action="store_true", help="check_integrity() after every round (slow)")
    p.add_argument("--prefix-match-unit", type=int, default=0,
                   help=help_of(SchedulerConfig, "prefix_match_unit"))
    p.add_argument("--vllm-version", default="0.33", choices=VLLM_VERSIONS,
                   help=help_of(SchedulerConfig, "vllm_version"))
    p.add_argument("--mamba-cache-mode", default="align", choices=MAMBA_CACHE_MODES,
                   help=help_of(SchedulerConfig, "mamba_cache_mode"))
    p.add_argument("--scheduler", default="radixflow", choices=SCHEDULERS,
                   help="radixflow: radixflow's own scheduler; vllm: vLLM 0.33's real Scheduler (the 'vllm' "
                        "extra) with stand-in model outputs, native for radix* arms, the state-ready plugin "
                        "for radixflow*, admission in the driver, same cost model and clock")
    add_session_flags(p)


def run(args) -> int:
    if args.workload in SESSION_WORKLOADS:  # closed-loop sessions, compared across eviction policies
        return simulate_cli(args)
    spec = get_spec(args.model)
    gpu = get_gpu(args.gpu)
    arms = parse_arms(args.policy)
    cfg = scheduler_config(args, spec.name)
    cfg.prefix_match_unit = args.prefix_match_unit
    cfg.vllm_version, cfg.mamba_cache_mode = args.vllm_version, args.mamba_cache_mode
    cfg.validate()
    if args.scheduler == "vllm" and cfg.checkpoints != "boundary":
        raise ValueError(f"--checkpoints {cfg.checkpoints} is radixflow's scheduler only: vLLM's own Scheduler "
                         "(--scheduler vllm) caches state at its block boundaries")
    if args.eviction:
        cfg.eviction = args.eviction
        get_eviction(cfg.eviction)  # one policy for these workloads; checks the name
    workloads = build_workloads(args, spec.name)
    setup = SimSetup(spec, gpu, cfg, args.gpu_memory_utilization, args.state_memory_fraction, check=args.check)
    run_arm = arm_runner(args.scheduler)  # exits 2 with one line when vLLM is missing
    results = []
    t0 = time.perf_counter()
    total = sum(len(w) for _, w in workloads) * len(arms)
    with Progress(transient=True) as bar:
        task = bar.add_task("simulating", total=total)
        for arm in arms:
            m, _ = run_arm(setup, arm, [w for _, w in workloads], progress=lambda n: bar.advance(task, n))
            results.append(m)
    wall = time.perf_counter() - t0
    used = setup.scheduler_config()
    print_arms(results, f"{spec.name} on {gpu.name} — S={cfg.max_num_seqs}, T={cfg.max_num_batched_tokens}, "
                        f"block {used.block_size}, {used.snapshot_mode}, scheduler {args.scheduler}, "
                        f"workload {args.workload} ({', '.join(label for label, _ in workloads)})")
    print(f"simulated {len(arms)} arm(s) in {wall:.1f} s")
    if args.json_path:
        meta = {"command": "simulate", "model": spec.name, "gpu": gpu.name, "workload": args.workload,
                "parts": [label for label, _ in workloads], "max_num_seqs": cfg.max_num_seqs,
                "max_num_batched_tokens": cfg.max_num_batched_tokens, "block_size": used.block_size,
                "state_interval": used.state_interval, "snapshot_mode": used.snapshot_mode,
                "internal_checkpoint": used.internal_checkpoint, "prefix_match_unit": used.prefix_match_unit,
                "vllm_version": used.vllm_version, "mamba_cache_mode": used.mamba_cache_mode,
                "scheduler": args.scheduler,
                "branch_gap": getattr(args, "branch_gap", 0.0), "seed": args.seed, "wall_time": wall}
        write_json(args.json_path, arms_payload(results, meta))
    return 0
