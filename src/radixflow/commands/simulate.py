"""Runs the scheduler arms on the cost-model simulator and compares them."""

from __future__ import annotations

import time

from rich.progress import Progress

from radixflow.commands import flags
from radixflow.commands.common import (
    Plan,
    add_scheduler_flags,
    add_workload_flags,
    arms_payload,
    build_workloads,
    check_vllm_geometry,
    check_vllm_scheduler,
    check_workload,
    policies,
    print_arms,
    run_meta,
    scheduler_config,
    write_json,
)
from radixflow.commands.sessions import SESSION_FLAGS, SESSION_WORKLOADS, add_session_flags, session_plan, simulate_cli
from radixflow.integrations.vllm.sim_backend import SCHEDULERS, arm_runner
from radixflow.sim.cost_model import GPUS, get_gpu
from radixflow.sim.runner import SimSetup
from radixflow.spec import PRESETS, get_spec


def add_arguments(p) -> None:
    p.add_argument("--model", type=flags.sim_model, default="qwen3.5-0.8b",
                   help=f"a preset ({', '.join(PRESETS)}) or a directory with an HF config.json")
    flags.add(p, "--gpu", help=f"one of {', '.join(GPUS)}")
    flags.add(p, "--gpu-memory-utilization", "--state-memory-fraction")
    add_workload_flags(p, workloads=("multi-candidate", "figure1", *SESSION_WORKLOADS))
    add_scheduler_flags(p, eviction=False)  # the sessions' group adds --eviction: a list there
    p.add_argument("--check", action="store_true", help="check_integrity() after every round (slow)")
    flags.add(p, "--prefix-match-unit", "--vllm-version", "--mamba-cache-mode")
    p.add_argument("--scheduler", default="radixflow", choices=SCHEDULERS,
                   help="radixflow: radixflow's own scheduler; vllm: vLLM 0.33's real Scheduler (the 'vllm' "
                        "extra) with stand-in model outputs, native for radix* arms, the state-ready plugin "
                        "for radixflow*, admission in the driver, same cost model and clock")
    add_session_flags(p)
    flags.remember_defaults(p)


def plan(args) -> Plan:
    """What `simulate` runs with these flags (the SchedulerConfig the Scheduler gets, pools sized, and
    the results' meta), without running it; a flag the workload cannot honour is refused here."""
    if args.workload in SESSION_WORKLOADS:
        return session_plan(args)
    check_workload(args)
    flags.refuse(args, SESSION_FLAGS, f"a flag of --workload {' | '.join(SESSION_WORKLOADS)}, "
                                      f"not of {args.workload}")
    if args.eviction and "," in args.eviction:
        raise ValueError(f"--eviction {args.eviction}: one policy for --workload {args.workload} (a list compares "
                         f"policies only on {' | '.join(SESSION_WORKLOADS)})")
    spec = get_spec(args.model)
    gpu = get_gpu(args.gpu)
    cfg = scheduler_config(args, spec.name)
    if args.scheduler == "vllm" and cfg.checkpoints != "boundary":
        raise ValueError(f"--checkpoints {cfg.checkpoints} is radixflow's scheduler only: vLLM's own Scheduler "
                         "(--scheduler vllm) caches state at its block boundaries")
    if args.scheduler == "vllm" and cfg.handoff != "off":
        raise ValueError(f"--handoff {cfg.handoff} is radixflow's scheduler only: vLLM's model runner cannot run "
                         "a dependent row (docs/vllm.md)")
    check_vllm_scheduler(args)
    setup = SimSetup(spec, gpu, cfg, args.gpu_memory_utilization, args.state_memory_fraction, check=args.check)
    used = setup.scheduler_config()
    check_vllm_geometry(args, used, spec.is_hybrid)
    meta = run_meta("simulate", used, model=spec.name, gpu=gpu.name, workload=args.workload,
                    policies=[a.name for a in policies(args)], scheduler=args.scheduler,
                    gpu_memory_utilization=args.gpu_memory_utilization,
                    state_memory_fraction=args.state_memory_fraction, seed=args.seed)
    if args.workload == "multi-candidate":
        meta.update(stream=args.stream, order=args.order, questions=args.questions, rate=args.rate,
                    branch_gap=args.branch_gap, article_scale=args.article_scale, dataset_path=args.dataset_path)
    return Plan(meta, used, extra={"setup": setup})


def run(args) -> int:
    pl = plan(args)
    if args.workload in SESSION_WORKLOADS:  # closed-loop sessions, compared across eviction policies
        return simulate_cli(args, pl)
    setup = pl.extra["setup"]
    spec, gpu, cfg = setup.spec, setup.gpu, setup.config
    arms = policies(args)
    workloads = build_workloads(args, spec.name)
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
    used = pl.scheduler
    print_arms(results, f"{spec.name} on {gpu.name} — S={cfg.max_num_seqs}, T={cfg.max_num_batched_tokens}, "
                        f"block {used.block_size}, {used.snapshot_mode}, scheduler {args.scheduler}, "
                        f"workload {args.workload} ({', '.join(label for label, _ in workloads)})")
    print(f"simulated {len(arms)} arm(s) in {wall:.1f} s")
    if args.json_path:
        meta = {**pl.meta, "parts": [label for label, _ in workloads], "wall_time": wall}
        write_json(args.json_path, arms_payload(results, meta))
    return 0
