"""`radixflow simulate --workload agentic | multi-turn`: eviction policies compared closed-loop."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from radixflow.cache.eviction import parse_evictions
from radixflow.commands.common import write_json
from radixflow.sim.cost_model import get_gpu, pool_sizes
from radixflow.sim.sessions import simulate_policies
from radixflow.spec import get_spec
from radixflow.workloads.agentic import TOOL_LATENCIES, AgenticSpec, agentic_sessions
from radixflow.workloads.multiturn import ChatSpec, chat_sessions


def add_session_flags(p) -> None:
    """Flags of `radixflow simulate --workload agentic | multi-turn`."""
    g = p.add_argument_group("agentic and multi-turn workloads (--workload agentic | multi-turn)")
    g.add_argument("--eviction", default=None,
                   help="comma list of eviction policies to compare: lru | rr-tail | level-tail (:N = N pages per "
                        "chunk) | flop-aware (:W = recency weight in [0, 1], default 0.5); default "
                        "lru,rr-tail for these workloads, lru otherwise")
    g.add_argument("--cache-capacity", default=None,
                   help="KV cache size: N tokens, or Nx = N full prefixes (mean private history of a call, "
                        "prompt + answer, plus the shared system prompt once); default: sized from GPU memory")
    g.add_argument("--agents", type=int, default=32)
    g.add_argument("--calls", type=int, default=30, help="calls per agent")
    g.add_argument("--idle-fraction", type=float, default=0.75, help="s: share of time an agent waits on tools")
    g.add_argument("--tool-latency", default="exp", choices=TOOL_LATENCIES)
    g.add_argument("--tool-latency-mean", type=float, default=None,
                   help="seconds (default: call-time · s / (1 − s))")
    g.add_argument("--call-time", type=float, default=0.6, help="estimated seconds per call, for the default above")
    g.add_argument("--system-len", type=int, default=None, help="shared system prompt (agentic 128, chat 200)")
    g.add_argument("--context-len", type=int, default=2048, help="agent history before its first call")
    g.add_argument("--append-len", type=int, default=32, help="tokens appended per agent call")
    g.add_argument("--output-len", type=int, default=8, help="tokens generated per agent call")
    g.add_argument("--users", type=int, default=32, help="multi-turn: conversations")
    g.add_argument("--turns", type=int, default=5)
    g.add_argument("--user-len", type=int, default=80)
    g.add_argument("--assistant-len", type=int, default=150)
    g.add_argument("--think-time", type=float, default=5.0, help="multi-turn: mean seconds between turns")
    g.add_argument("--rewrite-fraction", type=float, default=0.0, help="multi-turn: users who rewrite turn 2")


SESSION_WORKLOADS = ("agentic", "multi-turn")
PUBLISHED = {"uncached_p99": -65.7, "ttft_p99": -75.4}  # RR-Evict vs LRU (SGLang, H100), SPEC §10


def simulate_cli(args) -> int:
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
    evictions = parse_evictions(args.eviction or "lru,rr-tail")
    spec, gpu = get_spec(args.model), get_gpu(args.gpu)
    capacity, slots = args.cache_capacity, None
    if capacity is None:
        fraction = getattr(args, "state_memory_fraction", None)  # a fixed split here: half by default
        pages, slots = pool_sizes(spec, gpu, args.block_size, args.gpu_memory_utilization,
                                  0.5 if fraction is None else fraction)
        capacity = str(pages * args.block_size)
    out = simulate_policies(sessions, args.model, args.gpu, evictions, capacity, args.block_size,
                            args.max_num_seqs or 16, args.max_num_batched_tokens or 8192, args.state_interval,
                            slots if spec.is_hybrid else None, args.check)
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
        write_json(args.json_path, {"meta": {"command": "simulate", "workload": args.workload, "model": spec.name,
                                             "gpu": gpu.name, "seed": args.seed}, **out})
    return 0
