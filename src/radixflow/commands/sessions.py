"""`radixflow simulate --workload agentic | multi-turn`: eviction policies compared closed-loop."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from radixflow.commands import flags
from radixflow.commands.common import (
    Plan,
    check_vllm_geometry,
    check_workload,
    policies,
    run_meta,
    scheduler_config,
    write_json,
)
from radixflow.commands.flags import non_negative_float, non_negative_int, positive_int, refuse
from radixflow.sim.cost_model import get_gpu, pool_sizes
from radixflow.sim.sessions import simulate_policies
from radixflow.spec import get_spec
from radixflow.spec.vllm_align import apply_vllm_align
from radixflow.workloads.agentic import TOOL_LATENCIES, AgenticSpec, agentic_sessions
from radixflow.workloads.multiturn import ChatSpec, chat_sessions


def cache_capacity(text: str) -> str:
    """N tokens or Nx full prefixes (sim/sessions.parse_capacity reads it against the sessions)."""
    t = text.strip().lower()
    try:
        ok = float(t[:-1] if t.endswith("x") else t) > 0
    except ValueError:
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(f"give tokens (e.g. 80000) or full prefixes (e.g. 24x), got {text!r}")
    return t


def idle_fraction(text: str) -> float:
    v = flags.unit_interval(text)
    if v >= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text!r}")
    return v


def add_session_flags(p) -> None:
    """Flags of `radixflow simulate --workload agentic | multi-turn`."""
    g = p.add_argument_group("agentic and multi-turn workloads (--workload agentic | multi-turn)")
    flags.add(g, "--eviction", type=flags.eviction_list,
              help="eviction policy; these workloads compare a comma list: lru | rr-tail | level-tail (:N = N pages "
                   "per chunk) | flop-aware (:W = recency weight in [0, 1], default 0.5); default lru,rr-tail for "
                   "these workloads, lru otherwise")
    g.add_argument("--cache-capacity", type=cache_capacity, default=None,
                   help="KV cache size: N tokens, or Nx = N full prefixes (mean private history of a call, "
                        "prompt + answer, plus the shared system prompt once); default: sized from GPU memory")
    g.add_argument("--agents", type=positive_int, default=32)
    g.add_argument("--calls", type=positive_int, default=30, help="calls per agent")
    g.add_argument("--idle-fraction", type=idle_fraction, default=0.75, help="s: share of time an agent waits on tools")
    g.add_argument("--tool-latency", default="exp", choices=TOOL_LATENCIES)
    g.add_argument("--tool-latency-mean", type=non_negative_float, default=None,
                   help="seconds (default: call-time · s / (1 − s))")
    g.add_argument("--call-time", type=non_negative_float, default=0.6,
                   help="estimated seconds per call, for the default above")
    g.add_argument("--system-len", type=non_negative_int, default=None,
                   help="shared system prompt (agentic 128, chat 200)")
    g.add_argument("--context-len", type=non_negative_int, default=2048, help="agent history before its first call")
    g.add_argument("--append-len", type=positive_int, default=32, help="tokens appended per agent call")
    g.add_argument("--output-len", type=positive_int, default=8, help="tokens generated per agent call")
    g.add_argument("--users", type=positive_int, default=32, help="multi-turn: conversations")
    g.add_argument("--turns", type=positive_int, default=5)
    g.add_argument("--user-len", type=positive_int, default=80)
    g.add_argument("--assistant-len", type=positive_int, default=150)
    g.add_argument("--think-time", type=non_negative_float, default=5.0, help="multi-turn: mean seconds between turns")
    g.add_argument("--rewrite-fraction", type=flags.unit_interval, default=0.0,
                   help="multi-turn: users who rewrite turn 2")


SESSION_WORKLOADS = ("agentic", "multi-turn")
AGENTIC_FLAGS = ("agents", "calls", "idle_fraction", "tool_latency", "tool_latency_mean", "call_time", "context_len",
                 "append_len", "output_len")
CHAT_FLAGS = ("users", "turns", "user_len", "assistant_len", "think_time", "rewrite_fraction")
SESSION_FLAGS = ("cache_capacity", "system_len", *AGENTIC_FLAGS, *CHAT_FLAGS)  # --eviction: every workload
PUBLISHED = {"uncached_p99": -65.7, "ttft_p99": -75.4}  # RR-Evict vs LRU (SGLang, H100), SPEC §10


def session_plan(args) -> Plan:
    """The closed-loop sessions' SchedulerConfig (every scheduler flag, vLLM's geometry under
    vllm-align; the pool sizes are set per run from the capacity) and meta; refuses what they cannot honour."""
    check_workload(args)
    other = "multi-turn" if args.workload == "agentic" else "agentic"
    refuse(args, CHAT_FLAGS if args.workload == "agentic" else AGENTIC_FLAGS,
           f"a flag of --workload {other}, not of {args.workload}")
    refuse(args, ("scheduler",), "the session workloads run radixflow's scheduler only")
    arms = policies(args, default="radix")
    if len(arms) != 1:
        raise ValueError(f"--policy {args.policy}: the session workloads compare eviction policies under one "
                         "scheduling arm; give one")
    arm = arms[0].name
    if args.cache_capacity is not None:
        refuse(args, ("gpu_memory_utilization", "state_memory_fraction"),
               "sizes the cache from GPU memory, which --cache-capacity replaces")
    spec, gpu = get_spec(args.model), get_gpu(args.gpu)
    cfg = apply_vllm_align(scheduler_config(args, default_budget=(16, 8192)), spec, gpu.name)
    check_vllm_geometry(args, cfg, spec.is_hybrid)
    evictions = (args.eviction or "lru,rr-tail").split(",")
    meta = run_meta("simulate", cfg, model=spec.name, gpu=gpu.name, workload=args.workload, policies=[arm],
                    gpu_memory_utilization=args.gpu_memory_utilization,
                    state_memory_fraction=args.state_memory_fraction, seed=args.seed)
    # one run per eviction policy; the pools are sized from the capacity when the sessions are known
    meta.update(evictions=evictions, eviction=None, num_kv_pages=None, num_state_slots=None)
    return Plan(meta, cfg, extra={"arm": arm, "evictions": evictions, "spec": spec, "gpu": gpu})


def simulate_cli(args, plan: Plan | None = None) -> int:
    pl = plan or session_plan(args)
    cfg, spec, gpu = pl.scheduler, pl.extra["spec"], pl.extra["gpu"]
    if args.workload == "agentic":
        sessions = agentic_sessions(AgenticSpec(
            n_agents=args.agents, idle_fraction=args.idle_fraction, calls=args.calls,
            system_len=128 if args.system_len is None else args.system_len, context_len=args.context_len,
            append_len=args.append_len, output_len=args.output_len, tool_latency=args.tool_latency,
            tool_latency_mean=args.tool_latency_mean, call_time=args.call_time, seed=args.seed))
    else:
        sessions = chat_sessions(ChatSpec(
            system_len=200 if args.system_len is None else args.system_len, user_len=args.user_len,
            assistant_len=args.assistant_len, turns=args.turns, users=args.users, think_time=args.think_time,
            rewrite_fraction=args.rewrite_fraction, seed=args.seed))
    capacity, slots = args.cache_capacity, None
    if capacity is None:
        fraction = args.state_memory_fraction  # a fixed split here: half by default
        pages, slots = pool_sizes(spec, gpu, cfg.block_size, args.gpu_memory_utilization,
                                  0.5 if fraction is None else fraction)
        capacity = str(pages * cfg.block_size)
    out = simulate_policies(sessions, spec.name, gpu.name, pl.extra["evictions"], capacity,
                            state_slots=slots if spec.is_hybrid else None, check=args.check, config=cfg,
                            arm=pl.extra["arm"])
    t = Table(title=f"{args.workload} on {spec.name} / {gpu.name}: cache {out['capacity_tokens']:,} tokens = "
                    f"{(out['capacity_tokens'] - out['shared_prefix']) / max(1.0, out['full_prefix_unit']):.1f} "
                    f"full prefixes of {out['full_prefix_unit']:,.0f} tokens")
    cols = [("eviction", "eviction", "{}"), ("calls", "calls", "{:,}"), ("hit %", "hit_rate", "{:.1f}"),
            ("TTFT mean s", "ttft_mean", "{:.3f}"), ("p50", "ttft_p50", "{:.3f}"), ("p99", "ttft_p99", "{:.3f}"),
            ("uncached mean", "uncached_mean", "{:,.0f}"), ("p99", "uncached_p99", "{:,.0f}"),
            ("evicted tokens", "evicted_tokens", "{:,}"), ("kept mean", "kept_mean", "{:.3f}"),
            ("kept 0-or-1 %", "kept_all_or_nothing", "{:.1%}")]
    for name, _, _ in cols:
        t.add_column(name, justify="right")
    t.add_column("h model", justify="right")
    for row in out["policies"]:
        ss = row["steady_state"]
        t.add_row(*[fmt.format(row[k]) for _, k, fmt in cols],
                  "-" if ss is None else f"{ss['predicted_kept']:.3f} (kept {ss['measured_kept']:.3f})")
    Console(width=200).print(t)
    for r in out["ratios"]:
        for label, pre in (("all calls", ""), ("returning calls", "returning_")):
            print(f"{r['policy']} vs {r['baseline']}, {label}: p99 uncached {r[pre + 'uncached_p99']:+.1f} % "
                  f"(published {PUBLISHED['uncached_p99']:+.1f} %), p99 TTFT {r[pre + 'ttft_p99']:+.1f} % "
                  f"(published {PUBLISHED['ttft_p99']:+.1f} %), mean uncached {r[pre + 'uncached_mean']:+.1f} %, "
                  f"mean TTFT {r[pre + 'ttft_mean']:+.1f} %")
    if args.json_path:
        state_slots = (cfg.num_state_slots if slots is None else slots) if spec.is_hybrid else 0
        meta = {**pl.meta, "cache_capacity": out["capacity_tokens"], "num_state_slots": state_slots,
                "num_kv_pages": max(1, out["capacity_tokens"] // cfg.block_size)}
        write_json(args.json_path, {"meta": meta, **out})
    return 0
