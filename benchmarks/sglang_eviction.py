"""SGLang's real radix cache under its own `lru` / `tlru` and our backends, on the agentic and
multi-turn session workloads, beside our own cache (RadixIndex) on the same requests.

Run in the SGLang venv: `.venv-sglang/bin/python benchmarks/sglang_eviction.py` (scripts/install_sglang.sh).

The replay is open in the cache: each call starts at its arrival, runs a fixed `--call-time`, and the
session's next call arrives a tool latency (or think time) after it ends, so every cache sees the same
requests in the same order and only its decisions differ. A call matches, locks its hit, allocates
the rest (evicting when short), and at its end inserts prompt + answer (twins.py). Missed prompt
tokens = prompt − hit, over returning calls (a session's 2nd call on). Per-evict-call cost: every
backend replays the same first calls into a pool large enough to evict nothing, then the same
sequence of one-request evictions is timed on that same tree, each backend in turn (ratio to
SGLang's `lru`); the mean time per evict call during the replay is printed too. Figures printed,
never asserted.
"""

from __future__ import annotations

import argparse
import heapq
import os
import statistics
import time

from radixflow.core.metrics import percentile
from radixflow.integrations.sglang.twins import IndexTwin, SGLangTwin
from radixflow.workloads.agentic import AgenticSpec, agentic_sessions
from radixflow.workloads.multiturn import ChatSpec, chat_sessions
from radixflow.workloads.sessions import full_prefix_unit

SG = ("lru", "tlru", "radixflow-rr-tail", "radixflow-level-tail", "radixflow-flop-aware")
OURS = {"radixflow-rr-tail": "rr-tail", "radixflow-level-tail": "level-tail", "radixflow-flop-aware": "flop-aware",
        "lru": "lru"}


def replay(twin, sessions, call_time: float, stop_after: int | None = None):
    """Missed prompt tokens of every returning call, in call order."""
    events = [(s.calls[0].delay, 0, i, 0) for i, s in enumerate(sessions)]  # (time, kind 0=start 1=end, s, c)
    heapq.heapify(events)
    running, missed, done = {}, [], 0
    while events:
        t, kind, si, ci = heapq.heappop(events)
        s, c = sessions[si], sessions[si].calls[ci]
        if kind == 0:
            st = twin.start(list(s.tokens[: c.prompt_end]), c.output_len)
            if ci > 0:
                missed.append(c.prompt_end - st["hit"])
            running[(si, ci)] = st
            heapq.heappush(events, (t + call_time, 1, si, ci))
        else:
            twin.finish(running.pop((si, ci)), list(s.tokens[: c.prompt_end + c.output_len]))
            done += 1
            if stop_after is not None and done >= stop_after:
                return missed
            if ci + 1 < len(s.calls):
                heapq.heappush(events, (t + s.calls[ci + 1].delay, 0, si, ci + 1))
    return missed


def evict_cost(sessions, page: int, call_time: float, warm_calls: int, calls: int, need: int,
               rounds: int = 3) -> dict[str, float]:
    """Median seconds per evict call on the same tree, per SGLang backend; the backends take turns,
    round after round, so load on the machine falls on all of them alike."""
    times: dict[str, list[float]] = {b: [] for b in SG}
    total = sum(len(s.tokens) for s in sessions) + 1024
    for _ in range(rounds):
        for b in SG:
            tw = SGLangTwin(b, total, page, small_kv=True)
            replay(tw, sessions, call_time, stop_after=warm_calls)
            for _ in range(calls):
                t0 = time.perf_counter()
                tw.evict(need)
                times[b].append(time.perf_counter() - t0)
    return {b: statistics.median(v) for b, v in times.items()}


def run(name, sessions, capacities, page, call_time, n_a_n):
    unit, shared = full_prefix_unit(sessions)
    print(f"\n## {name}: {len(sessions)} sessions, {sum(len(s.calls) for s in sessions)} calls, "
          f"full-prefix unit {unit:.0f} tokens, shared {shared}; {n_a_n}; page {page}")
    print("| capacity | backend | P50 missed / ret. | P99 missed / ret. | P99 vs SGLang lru | ours (RadixIndex) "
          "P50 / P99 | same decisions | evict calls | mean s / evict call |")
    print("|---|---|---|---|---|---|---|---|---|")
    for cap_x in capacities:
        cap = int(shared + cap_x * unit) // page * page
        base = None
        for b in SG:
            tw = SGLangTwin(b, cap, page, small_kv=True)
            missed = replay(tw, sessions, call_time)
            p50, p99 = percentile(missed, 0.5), percentile(missed, 0.99)
            if b == "lru":
                base = p99
            ours_txt, same = "—", "—"
            if b in OURS:
                pol = OURS[b] + (f":{64 // page}" if OURS[b] in ("rr-tail", "level-tail") else "")
                o = replay(IndexTwin(pol, cap, page), sessions, call_time)
                ours_txt = f"{percentile(o, 0.5):.0f} / {percentile(o, 0.99):.0f}"
                same = "yes" if o == missed else f"no ({sum(a != b_ for a, b_ in zip(o, missed))} calls differ)"
            rel = f"{100 * (p99 / base - 1):+.1f} %" if base else "—"
            mean_call = statistics.mean(tw.evict_calls) if tw.evict_calls else 0.0
            print(f"| {cap_x}x | {b} | {p50:.0f} | {p99:.0f} | {rel} | {ours_txt} | {same} | {len(tw.evict_calls)} | "
                  f"{mean_call * 1e3:.3f} ms |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=32)
    ap.add_argument("--calls", type=int, default=12)
    ap.add_argument("--users", type=int, default=32)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--call-time", type=float, default=1.0)
    ap.add_argument("--capacities", default="22,25,28")
    ap.add_argument("--chat-capacities", default="40,60")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.environ.setdefault("RADIXFLOW_SGLANG_CHUNK_TOKENS", "64")
    t0 = time.perf_counter()
    agents = agentic_sessions(AgenticSpec(n_agents=args.agents, idle_fraction=0.75, calls=args.calls,
                                          system_len=256, context_len=1024, append_len=32, output_len=8,
                                          tool_latency="exp", call_time=args.call_time, seed=args.seed))
    n_a = args.agents * 0.25
    run("agentic", agents, [float(x) for x in args.capacities.split(",")], args.page, args.call_time,
        f"n_a ≈ {n_a:.0f} < m < n = {args.agents}")
    chats = chat_sessions(ChatSpec(users=args.users, turns=5, think_time=5.0, rewrite_fraction=0.25, seed=args.seed))
    run("multi-turn", chats, [float(x) for x in args.chat_capacities.split(",")], args.page, args.call_time,
        "users think 5 s between turns")
    cost = evict_cost(agents, args.page, args.call_time, warm_calls=len(agents) * 6, calls=30, need=64)
    print("\n## per-evict-call cost on the same tree (agentic, after 6 calls per agent, 30 evictions of 64 tokens, "
          "3 rounds, backends in turn)")
    print("| backend | median ms / evict call | × SGLang lru |")
    print("|---|---|---|")
    for b, v in cost.items():
        print(f"| {b} | {v * 1e3:.3f} | {v / cost['lru']:.2f} |")
    print(f"\nwall {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
