"""Per-turn cache traces: `radixflow trace multi-turn` replays a chat through the scheduler's cache.

Prints, per turn, the request length, the identity hit ĥ (the index's match), the ready hit h (what
the model can resume from: a published state boundary on hybrid models), the gap ĥ − h and the
recomputed tokens, then the prefill totals with and without the cache. Page size 1 by default
(SGLang's radix cache), so hits are exact.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from radixflow.commands import flags
from radixflow.commands.common import Plan, run_meta, write_json
from radixflow.commands.flags import non_negative_int, positive_int
from radixflow.config import SchedulerConfig
from radixflow.sim.chat_trace import trace_chat
from radixflow.spec import get_spec
from radixflow.workloads.multiturn import VARIANTS, ChatSpec, conversation


def add_arguments(p) -> None:
    p.add_argument("kind", choices=["multi-turn"], help="what to trace")
    p.add_argument("--model", type=flags.sim_model, default="qwen3-8b", help="preset name or a directory with "
                                                                             "config.json")
    p.add_argument("--system", type=non_negative_int, default=200, help="system prompt tokens")
    p.add_argument("--user", type=positive_int, default=80, help="tokens per user turn")
    p.add_argument("--assistant", type=positive_int, default=150, help="tokens per assistant answer")
    p.add_argument("--turns", type=positive_int, default=5)
    p.add_argument("--variant", action="append", default=[], choices=VARIANTS,
                   help="also run a variant after the conversation (repeatable): a user rewrites turn 2, "
                        "or a new user shares only the system prompt")
    flags.add(p, "--block-size", default=1, help="KV page size (1: exact hits)")
    flags.add(p, "--state-interval",
              help="hybrid models: a state snapshot every this many tokens (and one at each turn's end)")
    flags.add(p, "--checkpoints")
    flags.add(p, "--handoff", choices=["off"],
              help="only 'off': the replay runs one row per round, so no row has a same-forward producer to hand "
                   "off from (SPEC §15)")
    flags.add(p, "--json", help="write the trace here")
    flags.remember_defaults(p)


def plan(args) -> Plan:
    """The scheduler settings of the replay (one row per round, T fitting the longest turn) and its meta."""
    spec = get_spec(args.model)
    cfg = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=max(8192, args.state_interval),
                          block_size=args.block_size, state_interval=args.state_interval,
                          checkpoints=args.checkpoints, handoff="off")
    cfg.validate()
    meta = run_meta("trace", cfg, model=spec.name, kind=args.kind, system=args.system, user=args.user,
                    assistant=args.assistant, turns=args.turns, variants=list(args.variant))
    return Plan(meta, cfg)


def run(args) -> int:
    pl = plan(args)
    spec = get_spec(args.model)
    chat = ChatSpec(system_len=args.system, user_len=args.user, assistant_len=args.assistant,
                    turns=args.turns)
    turns = conversation(chat, 0, tuple(args.variant))
    rows = trace_chat(turns, args.model, args.block_size, args.state_interval, checkpoints=args.checkpoints)
    main, variants = rows[: args.turns], rows[args.turns :]
    total = sum(r.recomputed for r in main)
    without = sum(r.request_len for r in main)
    kind = "hybrid: ready hit = deepest state snapshot ≤ ĥ" if spec.is_hybrid else "full attention: h = ĥ"
    table = Table(title=f"multi-turn chat on {spec.name} ({kind}), page size {args.block_size}, "
                        f"{args.checkpoints} checkpoints")
    for col in ("turn", "request", "hit ĥ", "ready hit h", "gap ĥ−h", "recomputed", "ckpt missing",
                "evicted", "no shared prefix"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r.label, f"{r.request_len:,}", f"{r.hit:,}", f"{r.ready_hit:,}",
                      f"{r.hit - r.ready_hit:,}", f"{r.recomputed:,}", f"{r.checkpoint_missing:,}",
                      f"{r.evicted:,}", f"{r.no_shared_prefix:,}")
    console = Console(width=120)
    console.print(table)
    saved = 100.0 * (1 - total / without) if without else 0.0
    console.print(f"prefill over {args.turns} turns: {total:,} tokens with the cache, {without:,} without "
                  f"({saved:.1f} % saved)")
    if args.json_path:
        def row(r):
            return {"label": r.label, "request_len": r.request_len, "hit": r.hit, "ready_hit": r.ready_hit,
                    "recomputed": r.recomputed, "misses": {"checkpoint_missing": r.checkpoint_missing,
                                                           "evicted": r.evicted,
                                                           "no_shared_prefix": r.no_shared_prefix}}

        write_json(args.json_path, {
            "meta": pl.meta, "model": spec.name, "hybrid": spec.is_hybrid, "block_size": args.block_size,
            "state_interval": args.state_interval, "checkpoints": args.checkpoints,
            "system": args.system, "user": args.user,
            "assistant": args.assistant, "turns": [row(r) for r in main],
            "variants": [row(r) for r in variants],
            "total_recomputed": total, "total_without_cache": without})
    return 0
