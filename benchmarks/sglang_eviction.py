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

`--sweep` (integrations/sglang/sweep.py) ends with per backend `N of K configs lose to lru` and `cost
within bounds on N of K configs (per call <= 2x, total <= 3x, 4x pool <= 1.5x)` (issue #30), with the
worst ratios; K counts the sweep's configs and the three (pool, 4x pool) pairs, or with `--four-x`
every config at 4x its pool as well. A pool where lru makes fewer than 50 evict calls is replayed 3
times per backend and its times are the medians (`sweep.run_config_timed`): a mean over so few calls
is mostly noise and the first call.

`--sweep --oracle --horizons` (issue #43) adds, per config where the oracle cuts lru's P99 by >= 10 %,
the return before which any rule reaching half of that must leave lru (`sweep.lru_deadline`: a bound,
no search), and which rules at half lose to lru at no horizon (the run stopped after an earlier
return): the fixed ones, else those that are lru for j evict calls and then one tail share
(`tail@q>j`); docs/eviction.md, "horizons". `--sweep --single-calls` runs, per config, lru with one
evict call made the tail rule's (`tail@q>j+1`, q = 1/8 and 7/8, ten calls spread over the run): how far a
single non-lru decision moves the run against lru's, and how often it alone is a loss. `--sweep
--oracle --transfer 7,8,9` runs each config's oracle rule (>= 10 %) on the same shape's nearest pool in
those seeds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from radixflow.core.metrics import percentile
from radixflow.integrations.sglang import sweep as sw
from radixflow.integrations.sglang.cost import scaled
from radixflow.integrations.sglang.sweep import (
    FEW_CALLS,
    SG_SWEEP,
    TIMING_REPEATS,
    cost_configs,
    loses,
    replay,
    run_config_timed,
    sweep_configs,
)
from radixflow.integrations.sglang.twins import IndexTwin, SGLangTwin
from radixflow.workloads.agentic import AgenticSpec, agentic_sessions
from radixflow.workloads.multiturn import ChatSpec, chat_sessions
from radixflow.workloads.sessions import full_prefix_unit

SG = ("lru", "tlru", "radixflow-rr-tail", "radixflow-level-tail", "radixflow-flop-aware", "radixflow-adaptive")
OURS = {"radixflow-rr-tail": "rr-tail", "radixflow-level-tail": "level-tail", "radixflow-flop-aware": "flop-aware",
        "lru": "lru"}


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


def _x(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "—"


def within(r: dict, base: dict) -> bool:
    """Issue #30's cost bound on one config: per evict call <= 2x lru's, in all <= 3x lru's (where lru
    makes no evict call, the backend must make none either)."""
    if not base["calls"]:
        return not r["calls"]
    return r["per_call"] <= 2 * base["per_call"] and r["total"] <= 3 * base["total"]


def sweep(small: bool = False, with_oracle: bool = False, four_x: bool = False, only: list[int] | None = None,
          backends_only: list[str] | None = None, seeds: list[int] | None = None, with_horizons: bool = False,
          with_single: bool = False, transfer: list[int] | None = None) -> None:
    t0 = time.perf_counter()
    cfgs = [c for sd in seeds or (0,) for c in sweep_configs(small, seed=sd)]
    if only is not None:
        bad = [i for i in only if not 0 <= i < len(cfgs)]
        if bad:
            raise ValueError(f"--configs: no config {bad} (the sweep has {len(cfgs)}, 0-{len(cfgs) - 1})")
        cfgs = [cfgs[i] for i in only]
    backends = SG_SWEEP + tuple(r for r in sw.ORACLE_RULES if r not in SG_SWEEP) if with_oracle else SG_SWEEP
    if backends_only:
        unknown = [b for b in backends_only if b not in backends]
        if unknown:
            raise ValueError(f"--backends: unknown {unknown}; choose from {', '.join(backends)}")
        backends = ("lru", *(b for b in backends if b in backends_only and b != "lru"))
    print(f"# sweep: {len(cfgs)} configs; lru = SGLang's lru on its default tree core (Rust here); lru@py: the "
          f"same on the Python core; loss = P99 missed > lru x 1.02 or hit tokens < lru x 0.99; times are CPU time; "
          f"cost bound: per call <= 2x lru, total <= 3x lru; a pool where lru makes fewer than {FEW_CALLS} evict calls "
          f"is replayed {TIMING_REPEATS} times, its times the medians (same decisions)"
          + ("; at 4x the pool (4x the sessions, renumbered): the same, and per call <= 1.5x the backend's own at"
             " the pool" if four_x else "")
          + ("; tail@q: the adaptive backend held on the tail rule at cold share q (the oracle's fixed rules)"
             if with_oracle else ""))
    print("| config | page | pool m (units) | regime | backend | P50 / P99 missed | P99 vs lru | hit vs lru | "
          "evict calls | per-call × lru | total × lru | request path × lru | loses |"
          + (" 4x pool: per-call × lru | total × lru | per call 4x / 1x |" if four_x else ""))
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if four_x else ""))
    others = [b for b in backends if b != "lru"]
    lost = dict.fromkeys(others, 0)
    slow_call, slow_total = dict.fromkeys(others, 0), dict.fromkeys(others, 0)
    bounded = dict.fromkeys(others, 0)
    worst = {b: [0.0, 0.0, 0.0] for b in others}  # per call x lru, total x lru, 4x / 1x per call
    gains, path = {b: [] for b in others}, {b: [] for b in others}
    best: list[tuple[str, float]] = []
    halves: list[tuple[str, float, float, bool]] = []  # (config, oracle's gain, adaptive's, adaptive lost)
    checks: list[tuple[str, dict]] = []  # --horizons: (config, sw.horizon_check) per >= 10 % oracle config
    adaptive_horizons: list[str] = []  # --horizons: configs where the adaptive loses at a horizon
    singles: list[tuple[str, list[tuple[float, bool, float, float]]]] = []  # --single-calls, per config
    moved: list[tuple[str, str, list[bool]]] = []  # --transfer: (config, oracle's rule, lost per other seed)
    others_by_seed = {sd: sweep_configs(small, seed=sd) for sd in transfer or ()}
    py_call: dict[str, list[float]] = {b: [] for b in others}  # x lru@py: the same (Python) tree core
    py_path: dict[str, list[float]] = {b: [] for b in others}
    for cfg in cfgs:
        res = run_config_timed(cfg, backends)
        base = res["lru"]
        big = run_config_timed(scaled(cfg, 4), backends) if four_x else None
        for b, r in res.items():
            rel = f"{100 * (r['p99'] / base['p99'] - 1):+.1f} %" if base["p99"] else "—"
            hit = f"{100 * (r['hit'] / base['hit'] - 1):+.2f} %" if base["hit"] else "—"
            bad = b != "lru" and loses(r, base)
            four = ""
            ok = within(r, base)
            if big is not None:
                r4, b4 = big[b], big["lru"]
                grow = r4["per_call"] / r["per_call"] if r["per_call"] else 0.0
                ok = ok and within(r4, b4) and grow <= 1.5
                four = (f" {_x(r4['per_call'], b4['per_call'])} | {_x(r4['total'], b4['total'])} | "
                        f"{_x(r4['per_call'], r['per_call'])} |")
            if b != "lru":
                lost[b] += bad
                slow_call[b] += bool(base["per_call"]) and r["per_call"] > 2 * base["per_call"]
                slow_total[b] += r["total"] > 3 * base["total"]
                bounded[b] += ok
                path[b].append(r["per_request"] / base["per_request"])
                if base["calls"]:
                    w = worst[b]
                    w[0] = max(w[0], r["per_call"] / base["per_call"])
                    w[1] = max(w[1], r["total"] / base["total"])
                if big is not None:
                    r4, b4 = big[b], big["lru"]
                    if b4["calls"]:
                        worst[b][0] = max(worst[b][0], r4["per_call"] / b4["per_call"])
                        worst[b][1] = max(worst[b][1], r4["total"] / b4["total"])
                    if r["per_call"]:
                        worst[b][2] = max(worst[b][2], r4["per_call"] / r["per_call"])
            mode = "" if r["tail_calls"] is None else f" (tail {r['tail_calls']}/{r['tail_calls'] + r['lru_calls']})"
            print(f"| {cfg['name']} | {cfg['page']} | {cfg['m']:.1f} | {cfg['regime']} | {b}{mode} | "
                  f"{r['p50']:.0f} / {r['p99']:.0f} | {rel} | {hit} | {r['calls']}"
                  f"{' (timed over ' + str(r['timing_runs']) + ' replays)' if r.get('timing_runs') else ''} | "
                  f"{_x(r['per_call'], base['per_call'])} | "
                  f"{_x(r['total'], base['total'])} | {_x(r['per_request'], base['per_request'])} | "
                  f"{'LOSS' if bad else ''} |{four}", flush=True)
        if with_single:
            singles.append((f"{cfg['name']} m={cfg['m']:.1f} page {cfg['page']}", single_report(cfg, base)))
        if cfg["regime"] == "inside" and base["p99"]:
            for b in others:
                gains[b].append(1 - res[b]["p99"] / base["p99"])
        py = res.get("lru@py")
        if py is not None:
            for b in others:
                if py["calls"] and res[b]["calls"]:
                    py_call[b].append(res[b]["per_call"] / py["per_call"])
                py_path[b].append(res[b]["per_request"] / py["per_request"])
        if with_oracle:
            rule, gain = sw.oracle(res)
            print(f"| {cfg['name']} | {cfg['page']} | {cfg['m']:.1f} | {cfg['regime']} | **oracle**: {rule} | | "
                  f"{-100 * gain:+.1f} % | | | | | | |", flush=True)
            if cfg["regime"] == "inside":
                best.append((rule, gain))
            ad = res.get("radixflow-adaptive")
            label = f"{cfg['name']} m={cfg['m']:.1f} page {cfg['page']}"
            if ad is not None and gain >= 0.10:
                halves.append((label, gain, 1 - ad["p99"] / base["p99"], loses(ad, base)))
            if transfer and gain >= 0.10:
                moved.append((label, rule, transfer_report(label, cfg, rule, others_by_seed)))
            if with_horizons:
                if ad is not None and sw.horizon_losses(ad, base):
                    adaptive_horizons.append(label)
                if gain >= 0.10:
                    checks.append((label, horizon_report(label, cfg, res, gain)))
    pairs = 0
    if not small and not four_x and only is None and not seeds:
        print("\n## per-call eviction time at a pool and at 4x that pool (4x the agents), CPU µs (× lru); "
              "each pair counts as one config of the cost bound (per call <= 2x and total <= 3x lru at both pools, "
              "per call at 4x <= 1.5x the backend's own at 1x)")
        print("| config | pool | " + " | ".join(backends) + " |")
        print("|---|---|" + "---|" * len(backends))
        for pair in cost_configs():
            per = []
            for cfg in pair:
                res = run_config_timed(cfg, backends)
                per.append(res)
                base = res["lru"]
                print(f"| {cfg['name']} page {cfg['page']} | {cfg['capacity']} | " + " | ".join(
                    f"{res[b]['per_call'] * 1e6:.0f} ({_x(res[b]['per_call'], base['per_call'])}; in all "
                    f"{_x(res[b]['total'], base['total'])})" for b in backends) + " |")
            print("| 4x / 1x per call | | " + " | ".join(_x(per[1][b]["per_call"], per[0][b]["per_call"])
                                                     for b in backends) + " |", flush=True)
            pairs += 1
            for b in others:
                small_r, big_r = per[0][b], per[1][b]
                grow = big_r["per_call"] / small_r["per_call"] if small_r["per_call"] else 0.0
                bounded[b] += within(small_r, per[0]["lru"]) and within(big_r, per[1]["lru"]) and grow <= 1.5
                w = worst[b]
                for r, base in ((small_r, per[0]["lru"]), (big_r, per[1]["lru"])):
                    if base["calls"]:
                        w[0] = max(w[0], r["per_call"] / base["per_call"])
                        w[1] = max(w[1], r["total"] / base["total"])
                w[2] = max(w[2], grow)
    print()
    for b in others:
        print(f"{b}: {lost[b]} of {len(cfgs)} configs lose to lru")
    for b in others:
        print(f"{b}: per-call > 2x lru on {slow_call[b]}, total > 3x lru on {slow_total[b]} of {len(cfgs)} configs; "
              f"request path (match + lock + allocate/evict + insert) median {statistics.median(path[b]):.2f}x lru")
    k = len(cfgs) + pairs
    where = (" (the 4x pool: every config)" if four_x else
             f" (the 4x pool: the {pairs} pairs above)" if pairs else " (no 4x pool)")
    for b in others:
        w = worst[b]
        print(f"{b}: cost within bounds on {bounded[b]} of {k} configs (per call <= 2x, total <= 3x, 4x pool <= 1.5x)"
              f"{where}; worst per call {w[0]:.2f}x, total {w[1]:.2f}x"
              + (f", 4x / 1x per call {w[2]:.2f}" if pairs or four_x else ""))
    inside = gains.get("radixflow-adaptive", [])
    for b in others:
        if gains[b]:
            print(f"{b}: median P99 gain over the {len(gains[b])} configs inside n_a < m < n "
                  f"{100 * statistics.median(gains[b]):.1f} % (losses counted as they are)")
    if inside:
        print(f"radixflow-adaptive median P99 gain over the {len(inside)} configs inside n_a < m < n: "
              f"{100 * statistics.median(inside):.1f} %; P99 -2 % or better without a loss on "
              f"{sum(g >= 0.02 for g in inside)}")
    if best:
        g = [x for _, x in best]
        print(f"oracle (per config the best of {len(sw.ORACLE_RULES)} fixed rules that does not lose to lru): "
              f"median P99 gain over the {len(g)} configs inside {100 * statistics.median(g):.1f} %, >= 30 % on "
              f"{sum(x >= 0.30 for x in g)}, > 0 on {sum(x > 0 for x in g)}; rules: "
              + ", ".join(f"{r} {sum(1 for b, _ in best if b == r)}" for r in sw.ORACLE_RULES
                          if any(b == r for b, _ in best)))
    if with_oracle and "radixflow-adaptive" in others:
        reached = [h for h in halves if h[2] >= h[1] / 2 and not h[3]]
        print(f"oracle P99 gain >= 10 % on {len(halves)} of {len(cfgs)} configs; radixflow-adaptive reaches half of "
              f"it on {len(reached)} of {len(halves)}"
              + "".join(f"\n  {'half' if h in reached else 'SHORT'}: {h[0]}: oracle {100 * h[1]:.1f} %, adaptive "
                        f"{100 * h[2]:.1f} %{' (a loss)' if h[3] else ''}" for h in halves))
    if singles:
        print(single_summary(singles))
    if moved:
        runs = [lost for _, _, lost in moved for lost in lost]
        print(f"oracle's rules on the same shape in seeds {','.join(map(str, transfer or ()))} (the pool nearest "
              f"each config's): {sum(runs)} of {len(runs)} runs lose to lru; on {sum(any(x) for *_, x in moved)} "
              f"of {len(moved)} configs with an oracle >= 10 % at least one does")
    if checks:
        print(horizon_summary(checks, adaptive_horizons, len(cfgs), "radixflow-adaptive" in others))
    for b in others:
        if py_path[b] and b != "lru@py":
            print(f"{b}: on SGLang's Python tree core (x lru@py, medians over the {len(py_path[b])} configs): "
                  f"per evict call {statistics.median(py_call[b]) if py_call[b] else 0:.2f}x, request path "
                  f"(match + lock + "
                  f"allocate/evict + insert) {statistics.median(py_path[b]):.2f}x")
    print(f"wall {time.perf_counter() - t0:.0f} s")


def horizon_report(label: str, cfg: dict, res: dict, gain: float) -> dict:
    """`sw.horizon_check` on one config, printed as one line."""
    h = sw.horizon_check(cfg, res, gain)

    def rules(found: dict) -> str:
        return ", ".join(f"{r} {len(lost)}" for r, lost in sorted(found.items(), key=lambda x: (len(x[1]), x[0]))[:4])

    print(f"horizons: {label}: oracle {100 * gain:.1f} %; any rule at half leaves lru before return "
          f"{h['deadline']} (lru's evict calls before it: {h['calls']}); fixed rules at half, horizons lost: "
          f"{rules(h['fixed']) or 'none'}"
          + (f"; rules switching once at half ({len(h['switch'])}), horizons lost: {rules(h['switch']) or 'none'}"
             if not h["fixed"] or all(h["fixed"].values()) else "")
          + f"; safe at every horizon >= {sw.HORIZON_FROM}: {h['safe'] or 'none'}", flush=True)
    return h


def horizon_summary(checks: list[tuple[str, dict]], adaptive_lost: list[str], k: int, with_adaptive: bool) -> str:
    fixed = [c for c, h in checks if any(not lost for lost in h["fixed"].values())]
    switch = [c for c, h in checks if c not in fixed and h["safe"]]
    none = [c for c, h in checks if not h["safe"]]
    return (f"horizons (the run stopped after return t, t >= {sw.HORIZON_FROM}): of {len(checks)} configs with an "
            f"oracle >= 10 %, a fixed rule reaches half and loses at no horizon on {len(fixed)}, a rule that "
            f"switches once (lru for j evict calls, then tail@q) on {len(switch)} more, neither on {len(none)}"
            + "".join(f"\n  neither: {c}" for c in none)
            + (f"\nradixflow-adaptive loses to lru at some horizon on {len(adaptive_lost)} of {k} configs"
               if with_adaptive else ""))


def transfer_report(label: str, cfg: dict, rule: str, others_by_seed: dict) -> list[bool]:
    """The oracle's rule of `cfg` on the same shape and nearest pool in each other seed: lost per seed."""
    lost, parts = [], []
    for sd, others in others_by_seed.items():
        other = sw.same_shape(cfg, others)
        if other is None:
            continue
        res = sw.run_config(other, ("lru", rule))
        b, r = res["lru"], res[rule]
        lost.append(loses(r, b))
        parts.append(f"seed {sd} m={other['m']:.1f}: P99 {100 * (r['p99'] / b['p99'] - 1) if b['p99'] else 0:+.1f} %, "
                     f"hits {100 * (r['hit'] / b['hit'] - 1):+.2f} %{' LOSS' if lost[-1] else ''}")
    print(f"transfer: {label}: {rule}: " + ("; ".join(parts) or "no config of this shape in those seeds"), flush=True)
    return lost


def single_report(cfg: dict, base: dict) -> list[tuple[float, bool, float, float]]:
    """`sw.single_calls` on one config, one line: per run (share, loses, hit change, P99 change)."""
    runs = sw.single_calls(cfg, base)
    out = [(float(rule[len("tail@"):].split(">")[0]), loses(r, base), r["hit"] / base["hit"] - 1,
            r["p99"] / base["p99"] - 1 if base["p99"] else 0.0) for rule, r in runs.items()]
    if out:
        print(f"single calls: {cfg['name']} m={cfg['m']:.1f} page {cfg['page']}: "
              + "; ".join(f"q = {q}: hits {100 * min(h for s, _, h, _ in out if s == q):+.2f} .. "
                          f"{100 * max(h for s, _, h, _ in out if s == q):+.2f} %, P99 "
                          f"{100 * min(p for s, _, _, p in out if s == q):+.1f} .. "
                          f"{100 * max(p for s, _, _, p in out if s == q):+.1f} %, "
                          f"{sum(lost for s, lost, _, _ in out if s == q)} of {sum(1 for s, *_ in out if s == q)} lose"
                          for q in sw.SINGLE_SHARES), flush=True)
    return out


def single_summary(singles: list) -> str:
    done = [(c, out) for c, out in singles if out]
    lines = [f"single calls (lru on every evict call but one, which is the tail rule at q; 10 such calls spread "
             f"over lru's, per config where lru makes >= 10): {len(done)} configs"]
    for q in sw.SINGLE_SHARES:
        runs = [(c, lost) for c, out in done for s, lost, _, _ in out if s == q]
        cfgs = {c for c, lost in runs if lost}
        lines.append(f"  q = {q}: one such call loses to lru in {sum(lost for _, lost in runs)} of {len(runs)} runs, "
                     f"on {len(cfgs)} of {len(done)} configs")
    return "\n".join(lines)


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
    ap.add_argument("--four-x", action="store_true",
                    help="with --sweep: every config also at 4x the pool (4x the sessions; ~5x the time) for the "
                         "cost bound, instead of the three 4x pairs")
    ap.add_argument("--oracle", action="store_true",
                    help="with --sweep: also the tail rule at 8 cold shares, and per config the best fixed rule "
                         "of 12 that does not lose to lru")
    ap.add_argument("--horizons", action="store_true",
                    help="with --sweep --oracle: per config with an oracle >= 10 %%, the return before which any "
                         "rule at half the oracle must leave lru, and which rules at half (fixed, or switching "
                         "once from lru to a tail share) lose to lru at no horizon (the run stopped earlier)")
    ap.add_argument("--single-calls", action="store_true",
                    help="with --sweep: per config, runs that are lru on every evict call but one, which is the "
                         "tail rule at q = 1/8 or 7/8 (10 such calls spread over lru's): how far one non-lru "
                         "decision moves hits and P99 against lru's, and how often it alone loses")
    ap.add_argument("--transfer", default=None,
                    help="with --sweep --oracle: each config's oracle rule (where it gains >= 10 %%) run on the "
                         "same shape's nearest pool in these seeds (comma list): does the choice hold there?")
    ap.add_argument("--seeds", default=None,
                    help="with --sweep: the sweep's shapes drawn with these seeds instead (comma list; 0 is the "
                         "sweep's own workloads; held-out runs)")
    ap.add_argument("--configs", default=None,
                    help="with --sweep: only these configs, by index (comma list, as sglang_eviction_cost.py; "
                         "no 4x pairs then)")
    ap.add_argument("--backends", default=None,
                    help="with --sweep: only these backends (comma list; lru is always run, as the baseline)")
    args = ap.parse_args()
    if (args.small or args.oracle or args.four_x or args.configs or args.backends or args.seeds
            or args.single_calls) and not args.sweep:
        ap.error("--small, --oracle, --four-x, --configs, --backends, --seeds and --single-calls only go with --sweep")
    if (args.horizons or args.transfer) and not args.oracle:
        ap.error("--horizons and --transfer go with --sweep --oracle (they judge the oracle's rules)")
    if args.sweep:
        try:
            only = None if args.configs is None else [int(x) for x in args.configs.split(",") if x.strip()]
        except ValueError:
            ap.error(f"--configs takes config indices, as 0,2,15; got {args.configs!r}")
        picked = None if args.backends is None else [b.strip() for b in args.backends.split(",") if b.strip()]
        try:
            seeds = None if args.seeds is None else [int(x) for x in args.seeds.split(",") if x.strip()]
        except ValueError:
            ap.error(f"--seeds takes seeds, as 7,8,9; got {args.seeds!r}")
        try:
            transfer = None if args.transfer is None else [int(x) for x in args.transfer.split(",") if x.strip()]
        except ValueError:
            ap.error(f"--transfer takes seeds, as 7,8,9; got {args.transfer!r}")
        try:
            sweep(small=args.small, with_oracle=args.oracle, four_x=args.four_x, only=only, backends_only=picked,
                  seeds=seeds, with_horizons=args.horizons, with_single=args.single_calls,
                  transfer=transfer)
        except ValueError as e:
            ap.error(str(e))
        return
    try:
        fixed_runs(args)
    except RuntimeError as e:  # a pool smaller than one request: one line naming the flag, not a traceback
        ap.error(f"--capacities / --chat-capacities: {e}")


def fixed_runs(args: argparse.Namespace) -> None:
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
