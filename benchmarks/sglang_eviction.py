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
import random
import statistics
import time

from radixflow.core.metrics import percentile
from radixflow.integrations.sglang.twins import FULL, IndexTwin, SGLangTwin
from radixflow.workloads.agentic import AgenticSpec, agentic_sessions
from radixflow.workloads.multiturn import ChatSpec, chat_sessions
from radixflow.workloads.sessions import CallSpec, Session, full_prefix_unit

SG = ("lru", "tlru", "radixflow-rr-tail", "radixflow-level-tail", "radixflow-flop-aware", "radixflow-adaptive")
SG_SWEEP = ("lru", "lru@py", "radixflow-rr-tail", "radixflow-level-tail", "radixflow-flop-aware",
            "radixflow-adaptive")
RF = ("radixflow-rr-tail", "radixflow-level-tail", "radixflow-flop-aware", "radixflow-adaptive")
OURS = {"radixflow-rr-tail": "rr-tail", "radixflow-level-tail": "level-tail", "radixflow-flop-aware": "flop-aware",
        "lru": "lru"}


def replay(twin, sessions, call_time: float, stop_after: int | None = None, stats: dict | None = None,
           check: bool = False):
    """Missed prompt tokens of every returning call, in call order. `stats` gets `hit` (hit tokens of
    all calls); `check`: SGLang's sanity check and the pool ledger after every start and finish."""
    events = [(s.calls[0].delay, 0, i, 0) for i, s in enumerate(sessions)]  # (time, kind 0=start 1=end, s, c)
    heapq.heapify(events)
    running, missed, done, hit = {}, [], 0, 0
    while events:
        t, kind, si, ci = heapq.heappop(events)
        s, c = sessions[si], sessions[si].calls[ci]
        if kind == 0:
            st = twin.start(list(s.tokens[: c.prompt_end]), c.output_len)
            if ci > 0:
                missed.append(c.prompt_end - st["hit"])
            hit += st["hit"]
            if check:
                twin.check()
            running[(si, ci)] = st
            heapq.heappush(events, (t + call_time, 1, si, ci))
        else:
            twin.finish(running.pop((si, ci)), list(s.tokens[: c.prompt_end + c.output_len]))
            if check:
                twin.check()
            done += 1
            if stop_after is not None and done >= stop_after:
                break
            if ci + 1 < len(s.calls):
                heapq.heappush(events, (t + s.calls[ci + 1].delay, 0, si, ci + 1))
    if stats is not None:
        stats["hit"] = hit
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


# ----------------------------------------------------------------------------- the sweep
def doc_sessions(readers: int, docs: int, doc_len: int, seed: int, questions: int = 3) -> list[Session]:
    """A shared-prefix document mix: one system prompt, `docs` long documents; each reader re-reads one
    document (the first ones more often) over `questions` calls, thinking ~4 s between them."""
    rng = random.Random(seed)
    system = tuple(range(1, 257))
    texts = [tuple(100_000 * (d + 1) + i for i in range(doc_len)) for d in range(docs)]
    out = []
    for r in range(readers):
        d = min(int(rng.paretovariate(1.2)) - 1, docs - 1)
        toks, calls = list(system) + list(texts[d]), []
        delay = rng.uniform(0, 30)
        for q in range(questions):
            toks += [10_000_000 + 1000 * r + 100 * q + i for i in range(32)]
            calls.append(CallSpec(prompt_end=len(toks), output_len=16, delay=delay))
            toks += [20_000_000 + 1000 * r + 100 * q + i for i in range(16)]
            delay = rng.expovariate(1 / 4.0)
        out.append(Session(sid=f"reader{r}", namespace="", tokens=tuple(toks), calls=calls, shared_len=len(system)))
    return out


def peak_footprint(sessions, call_time: float, page: int) -> int:
    """Most tokens running calls hold at once (prompt + answer, whole pages): no pool can be smaller."""
    events = [(s.calls[0].delay, 0, i, 0) for i, s in enumerate(sessions)]
    heapq.heapify(events)
    held = peak = 0
    while events:
        t, kind, si, ci = heapq.heappop(events)
        c = sessions[si].calls[ci]
        size = -(-(c.prompt_end + c.output_len) // page) * page
        if kind == 0:
            held += size
            peak = max(peak, held)
            heapq.heappush(events, (t + call_time, 1, si, ci))
        else:
            held -= size
            if ci + 1 < len(sessions[si].calls):
                heapq.heappush(events, (t + sessions[si].calls[ci + 1].delay, 0, si, ci + 1))
    return peak


def sweep_configs(small: bool = False) -> list[dict]:
    """Seeded configs: agentic (n agents, idle fraction s, n_a = (1 - s) n, pools below, inside and above
    n_a < m < n in units of the mean private history), multi-turn chat, a shared-prefix document mix."""
    agentic = [(8, 0.75, 32, 16, 1024), (16, 0.75, 32, 16, 1024), (16, 0.9, 128, 16, 1024), (32, 0.5, 32, 16, 1024),
               (32, 0.75, 32, 16, 1024), (32, 0.9, 64, 16, 1024), (64, 0.75, 32, 16, 1024), (64, 0.9, 32, 16, 1024),
               (8, 0.5, 32, 16, 1024), (64, 0.5, 32, 16, 1024), (32, 0.75, 128, 16, 1024), (48, 0.9, 32, 16, 512),
               (8, 0.5, 32, 1, 512), (16, 0.75, 32, 1, 512), (24, 0.9, 32, 1, 512)]
    if small:
        agentic = [(8, 0.75, 32, 16, 512)]
    out = []
    for i, (n, s, grow, page, ctx) in enumerate(agentic):
        spec = AgenticSpec(n_agents=n, idle_fraction=s, calls=12 if not small else 8, system_len=256, context_len=ctx,
                           append_len=grow, output_len=8, tool_latency="exp", call_time=1.0, seed=100 + i)
        sessions = agentic_sessions(spec)
        n_a = n * (1 - s)
        pools = (0.8 * n_a, n_a + (n - n_a) / 3, n_a + 2 * (n - n_a) / 3, 1.15 * n)
        if small:
            pools = (n_a + (n - n_a) / 3, 1.15 * n)
        out += _pooled(f"agentic n={n} s={s} +{grow}/call", sessions, page, pools, n_a, n)
    chats = [(32, 16), (32, 1)] if not small else [(12, 16)]
    for users, page in chats:
        sessions = chat_sessions(ChatSpec(users=users, turns=5, think_time=5.0, rewrite_fraction=0.25, seed=users))
        n_a = users / 6  # 1 s calls, 5 s think time
        out += _pooled(f"multi-turn users={users}", sessions, page, (n_a + (users - n_a) / 3, 0.6 * users), n_a, users)
    docs = [(48, 16), (48, 1)] if not small else []
    for readers, page in docs:
        sessions = doc_sessions(readers, 8, 1536, seed=readers + page)
        out += _pooled(f"documents readers={readers} docs=8", sessions, page, (4.0, 8.0), None, None, unit=1536)
    return out


def _pooled(name, sessions, page, pools, n_a, n, unit=None) -> list[dict]:
    u, shared = full_prefix_unit(sessions)
    unit = unit or u
    floor = int(1.1 * peak_footprint(sessions, 1.0, page))
    out, caps = [], set()
    for x in pools:
        cap = max(int(shared + x * unit), floor) // page * page + page
        if cap in caps:
            continue  # the pool floor (the peak of running calls) made two pools one
        caps.add(cap)
        xm = (cap - shared) / unit
        regime = "mix" if n is None else ("below" if xm <= n_a else "inside" if xm < n else "above")
        out.append({"name": name, "sessions": sessions, "page": page, "capacity": cap, "m": xm, "regime": regime,
                    "n_a": n_a, "n": n})
    return out


def run_config(cfg: dict, backends=SG_SWEEP, check: bool = False) -> dict:
    """Every backend on one config (same requests): missed / hit tokens, eviction time per call and in all."""
    res = {}
    for b in backends:
        name, core = (b[:-len("@py")], "python") if b.endswith("@py") else (b, "default" if b in ("lru", "tlru")
                                                                             else "python")
        tw = SGLangTwin(name, cfg["capacity"], cfg["page"], small_kv=True, core=core)
        st: dict = {}
        missed = replay(tw, cfg["sessions"], 1.0, stats=st, check=check)
        comp = tw.cache.components[FULL]
        res[b] = {"missed": missed, "p50": percentile(missed, 0.5), "p99": percentile(missed, 0.99), "hit": st["hit"],
                  "calls": len(tw.evict_calls), "total": sum(tw.evict_calls),
                  "per_call": statistics.mean(tw.evict_calls) if tw.evict_calls else 0.0,
                  "tail_calls": getattr(comp, "tail_calls", None), "lru_calls": getattr(comp, "lru_calls", None)}
    return res


def loses(r: dict, base: dict) -> bool:
    """A loss to lru: P99 missed above lru x 1.02, or hit tokens below lru x 0.99."""
    return r["p99"] > base["p99"] * 1.02 or r["hit"] < base["hit"] * 0.99


def sweep(small: bool = False) -> None:
    t0 = time.perf_counter()
    cfgs = sweep_configs(small)
    print(f"# sweep: {len(cfgs)} configs; lru = SGLang's lru on its default tree core "
          f"(lru@py: the same on the Python core); loss = P99 missed > lru x 1.02 or hit tokens < lru x 0.99")
    print("| config | page | pool m (units) | regime | backend | P50 / P99 missed | P99 vs lru | hit vs lru | "
          "evict calls | per-call × lru | total × lru | loses |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    lost = {b: 0 for b in SG_SWEEP if b != "lru"}
    gains = []
    for cfg in cfgs:
        res = run_config(cfg)
        base = res["lru"]
        for b, r in res.items():
            rel = f"{100 * (r['p99'] / base['p99'] - 1):+.1f} %" if base["p99"] else "—"
            hit = f"{100 * (r['hit'] / base['hit'] - 1):+.2f} %" if base["hit"] else "—"
            pc = f"{r['per_call'] / base['per_call']:.2f}" if base["per_call"] else "—"
            tot = f"{r['total'] / base['total']:.2f}" if base["total"] else "—"
            bad = b != "lru" and loses(r, base)
            if b != "lru":
                lost[b] += bad
            mode = "" if r["tail_calls"] is None else f" (tail {r['tail_calls']}/{r['tail_calls'] + r['lru_calls']})"
            print(f"| {cfg['name']} | {cfg['page']} | {cfg['m']:.1f} | {cfg['regime']} | {b}{mode} | "
                  f"{r['p50']:.0f} / {r['p99']:.0f} | {rel} | {hit} | {r['calls']} | {pc} | {tot} | "
                  f"{'LOSS' if bad else ''} |", flush=True)
        if cfg["regime"] == "inside" and base["p99"]:
            gains.append(1 - res["radixflow-adaptive"]["p99"] / base["p99"])
    print()
    for b, k in lost.items():
        print(f"{b}: {k} of {len(cfgs)} configs lose to lru")
    if gains:
        print(f"radixflow-adaptive median P99 gain over the {len(gains)} configs inside n_a < m < n: "
              f"{100 * statistics.median(gains):.1f} %")
    print(f"wall {time.perf_counter() - t0:.0f} s")


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
    ap.add_argument("--sweep", action="store_true", help="the seeded config sweep against lru (see sweep_configs)")
    ap.add_argument("--small", action="store_true", help="with --sweep: a few small configs")
    args = ap.parse_args()
    if args.small and not args.sweep:
        ap.error("--small only goes with --sweep")
    if args.sweep:
        sweep(small=args.small)
        return
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
