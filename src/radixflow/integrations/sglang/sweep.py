"""The sweep of benchmarks/sglang_eviction.py --sweep (and its test version): seeded configs, the
open replay through SGLang's cache (twins.py), and what counts as a loss to lru. Imports SGLang.

A config is a session workload, a page size and a pool. Agentic: n agents, idle fraction s, n_a =
(1 - s) n active on average, history growth per call; pools in units of the mean private history
(`full_prefix_unit`) below, inside and above n_a < m < n, never under 1.1x the peak of what running
calls hold at once (the open replay cannot wait for room; that floor rules out every pool below n_a
here). Multi-turn chat, and a shared-prefix document mix (readers re-reading long documents).
"""

from __future__ import annotations

import bisect
import gc
import heapq
import random
import statistics

from radixflow.core.metrics import percentile
from radixflow.integrations.sglang.twins import FULL, SGLangTwin
from radixflow.workloads.agentic import AgenticSpec, agentic_sessions
from radixflow.workloads.multiturn import ChatSpec, chat_sessions
from radixflow.workloads.sessions import CallSpec, Session, full_prefix_unit

# lru: SGLang's lru on its default tree core (what a user runs); lru@py: the same on the Python core.
SG_SWEEP = ("lru", "lru@py", "radixflow-rr-tail", "radixflow-level-tail", "radixflow-flop-aware",
            "radixflow-adaptive")
# the oracle's 12 fixed rules: lru, the tail rule at eight cold shares (`tail@q`, adaptive.py), and the other three
ORACLE_SHARES = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0)
ORACLE_RULES = ("lru", *(f"tail@{q}" for q in ORACLE_SHARES), "radixflow-rr-tail", "radixflow-level-tail",
                "radixflow-flop-aware")


def replay(twin, sessions, call_time: float, stop_after: int | None = None, stats: dict | None = None,
           check: bool = False, starts: list | None = None):
    """Missed prompt tokens of every returning call, in call order. `stats` gets `hit` (hit tokens of
    all calls); `check`: SGLang's sanity check and the pool ledger after every start and finish;
    `starts` gets, per call in start order, (a return?, hit, missed, evict calls made before it)."""
    events = [(s.calls[0].delay, 0, i, 0) for i, s in enumerate(sessions)]  # (time, kind 0=start 1=end, s, c)
    heapq.heapify(events)
    running, missed, done, hit = {}, [], 0, 0
    while events:
        t, kind, si, ci = heapq.heappop(events)
        s, c = sessions[si], sessions[si].calls[ci]
        if kind == 0:
            before = len(twin.evict_calls) if starts is not None else 0  # (an SGLang twin's)
            st = twin.start(list(s.tokens[: c.prompt_end]), c.output_len)
            if ci > 0:
                missed.append(c.prompt_end - st["hit"])
            hit += st["hit"]
            if starts is not None:
                starts.append((ci > 0, st["hit"], c.prompt_end - st["hit"], before))
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
        delay = rng.uniform(0, 10.0 * readers)  # arrivals spread: a reader or two at a time
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


def sweep_configs(small: bool = False, seed: int = 0) -> list[dict]:
    """Seeded configs: agentic (n agents, idle fraction s, n_a = (1 - s) n, pools below, inside and above
    n_a < m < n in units of the mean private history), multi-turn chat, a shared-prefix document mix.
    `seed` 0 is the sweep's own workloads; another draws the same shapes with other seeds (held-out runs:
    each workload's seed moved by 1,000 x `seed`)."""
    if seed < 0:
        raise ValueError(f"a sweep seed is >= 0, got {seed}")
    off = 1000 * seed
    tag = f" seed {seed}" if seed else ""
    agentic = [(8, 0.75, 32, 16, 1024), (16, 0.75, 32, 16, 1024), (16, 0.9, 128, 16, 1024), (32, 0.5, 32, 16, 1024),
               (32, 0.75, 32, 16, 1024), (32, 0.9, 64, 16, 1024), (64, 0.75, 32, 16, 1024), (64, 0.9, 32, 16, 1024),
               (8, 0.5, 32, 16, 1024), (64, 0.5, 32, 16, 1024), (32, 0.75, 128, 16, 1024), (48, 0.9, 32, 16, 512),
               (8, 0.5, 32, 1, 512), (16, 0.75, 32, 1, 512), (24, 0.9, 32, 1, 512)]
    if small:
        agentic = [(8, 0.75, 32, 16, 512)]
    out = []
    for i, (n, s, grow, page, ctx) in enumerate(agentic):
        spec = AgenticSpec(n_agents=n, idle_fraction=s, calls=12 if not small else 8, system_len=256, context_len=ctx,
                           append_len=grow, output_len=8, tool_latency="exp", call_time=1.0, seed=100 + i + off)
        sessions = agentic_sessions(spec)
        n_a = n * (1 - s)
        pools = (0.8 * n_a, n_a + (n - n_a) / 3, n_a + 2 * (n - n_a) / 3, 1.15 * n)
        if small:
            pools = (n_a + (n - n_a) / 3, 1.15 * n)
        out += _pooled(f"agentic n={n} s={s} +{grow}/call{tag}", sessions, page, pools, n_a, n)
    chats = [(32, 16), (32, 1)] if not small else [(12, 16)]
    for users, page in chats:
        sessions = chat_sessions(ChatSpec(users=users, turns=5, think_time=5.0, rewrite_fraction=0.25,
                                          seed=users + off))
        n_a = users / 6  # 1 s calls, 5 s think time
        out += _pooled(f"multi-turn users={users}{tag}", sessions, page, (n_a + (users - n_a) / 3, 0.6 * users),
                       n_a, users)
    docs = [(48, 16), (48, 1)] if not small else []
    for readers, page in docs:
        sessions = doc_sessions(readers, 8, 1536, seed=readers + page + off)
        out += _pooled(f"documents readers={readers} docs=8{tag}", sessions, page, (4.0, 6.0), None, None, unit=1536)
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
        tw = make_twin(b, cfg["capacity"], cfg["page"])
        gc.collect()
        st: dict = {}
        starts: list = []
        gc.disable()  # a collection would land on whichever timed call crossed its threshold (as cost.py)
        try:
            missed = replay(tw, cfg["sessions"], 1.0, stats=st, check=check, starts=starts)
        finally:
            gc.enable()
        comp = tw.cache.components[FULL]
        res[b] = {"missed": missed, "p50": percentile(missed, 0.5), "p99": percentile(missed, 0.99), "hit": st["hit"],
                  "calls": len(tw.evict_calls), "total": sum(tw.evict_calls),
                  "per_call": statistics.mean(tw.evict_calls) if tw.evict_calls else 0.0,
                  "per_request": tw.request_cpu / max(1, tw.requests),
                  "tail_calls": getattr(comp, "tail_calls", None), "lru_calls": getattr(comp, "lru_calls", None),
                  "starts": starts}
    return res


FEW_CALLS = 50  # a config whose lru makes fewer evict calls is timed over TIMING_REPEATS replays
TIMING_REPEATS = 3


def run_config_timed(cfg: dict, backends=SG_SWEEP, few: int = FEW_CALLS, repeats: int = TIMING_REPEATS) -> dict:
    """`run_config`, and where lru makes fewer than `few` evict calls, `repeats` replays in all with
    each backend's per-call, total and request-path times the medians over them. A mean over a few
    calls is mostly the machine's noise and the run's first call (which costs several times the
    later ones for every backend); the decisions are the same on every replay (checked)."""
    res = run_config(cfg, backends)
    if res["lru"]["calls"] >= few or repeats <= 1:
        return res
    runs = [res] + [run_config(cfg, backends) for _ in range(repeats - 1)]
    out = {}
    for b in backends:
        for other in runs[1:]:
            if other[b]["calls"] != res[b]["calls"] or other[b]["missed"] != res[b]["missed"]:
                raise RuntimeError(f"{b} on {cfg['name']}: a replay made other decisions")
        out[b] = dict(res[b], timing_runs=repeats)
        for key in ("per_call", "total", "per_request"):
            out[b][key] = statistics.median(r[b][key] for r in runs)
    return out


def make_twin(backend: str, capacity: int, page: int) -> SGLangTwin:
    """SGLang's cache under `backend`: a name of SG_SWEEP, `tail@q` (the adaptive backend held on
    the tail rule at cold share q on every evict call), `tail@q>j` (lru on the first j evict calls,
    then the tail rule at q: a rule that switches once) or `tail@q>j+n` (the tail rule on n calls
    after the first j, lru on every other: `+1` is one non-lru decision)."""
    if backend.startswith("tail@"):
        from radixflow.integrations.sglang import adaptive  # after twins.py's CPU shim

        share, _, when = backend[len("tail@"):].partition(">")
        after, plus, span = when.partition("+")
        try:
            q, j, n = float(share), int(after or 0), int(span) if plus else None
        except ValueError:
            raise ValueError(f"bad rule {backend!r}: tail@q takes a cold share in (0, 1], tail@q>j also a "
                             f"count of lru calls first, tail@q>j+n a count of calls of the share") from None
        with adaptive.forced(q, j, n):
            return SGLangTwin("radixflow-adaptive", capacity, page, small_kv=True)
    if backend.endswith("@py"):
        return SGLangTwin(backend[:-len("@py")], capacity, page, small_kv=True, core="python")
    return SGLangTwin(backend, capacity, page, small_kv=True,
                      core="default" if backend in ("lru", "tlru") else "python")


def oracle(res: dict) -> tuple[str, float]:
    """The best fixed rule of `res` (rule -> run_config's figures, lru among them) that does not lose
    to lru: (its name, its P99 gain over lru's, a share)."""
    base = res["lru"]
    best, p99 = "lru", base["p99"]
    for rule in ORACLE_RULES:
        r = res.get(rule)
        if r is not None and not loses(r, base) and r["p99"] < p99:
            best, p99 = rule, r["p99"]
    return best, (1 - p99 / base["p99"]) if base["p99"] else 0.0


def cost_configs() -> list[tuple[dict, dict]]:
    """(pool, 4x pool) pairs for the per-call cost: the same agentic shape with 4x the agents and 4x the
    pool (inside n_a < m < n), so the tree is 4x larger and as full."""
    out = []
    for n, s, page in ((8, 0.75, 16), (16, 0.75, 16), (16, 0.75, 1)):
        pair = []
        for scale in (1, 4):
            sessions = agentic_sessions(AgenticSpec(n_agents=n * scale, idle_fraction=s, calls=8, system_len=256,
                                                    context_len=1024 if page > 1 else 512, append_len=32,
                                                    output_len=8, seed=5))
            n_a = n * scale * (1 - s)
            pair.append(_pooled(f"agentic n={n * scale} s={s}", sessions, page, (n_a + (n * scale - n_a) / 2,),
                                n_a, n * scale)[0])
        out.append(tuple(pair))
    return out


def loses(r: dict, base: dict) -> bool:
    """A loss to lru: P99 missed above lru x 1.02, or hit tokens below lru x 0.99."""
    return r["p99"] > base["p99"] * 1.02 or r["hit"] < base["hit"] * 0.99


# ------------------------------------------------------------------ horizons (issue #43)
# The no-loss line and the oracle are judged where the run ends. A horizon t is the same run stopped
# after its t-th return (the same requests, the same decisions up to there: the replay is open, so a
# rule's run on a shorter trace is the start of its run on this one).
HORIZON_FROM = 16  # returns: horizons judged from this one on (a P99 over fewer is one or two misses)


def horizons(starts: list) -> tuple[list[float], list[int]]:
    """Per horizon t = 1..returns: the P99 missed over returns 1..t, and the hit tokens of every call
    started up to return t (`run_config`'s `starts`)."""
    p99s, hits, srt, hit = [], [], [], 0
    for returning, h, miss, _ in starts:
        hit += h
        if returning:
            bisect.insort(srt, miss)
            p99s.append(percentile(srt, 0.99))
            hits.append(hit)
    return p99s, hits


def horizon_losses(r: dict, base: dict, first: int = HORIZON_FROM) -> list[int]:
    """The horizons t >= `first` (returns) at which `r`'s run, stopped there, loses to `base`'s (as
    `loses`: P99 missed above base x 1.02 or hit tokens below base x 0.99)."""
    p, h = horizons(r["starts"])
    bp, bh = horizons(base["starts"])
    if len(p) != len(bp):
        raise ValueError(f"runs of different traces: {len(p)} and {len(bp)} returns")
    return [t for t in range(first, len(p) + 1)
            if p[t - 1] > bp[t - 1] * 1.02 or h[t - 1] < bh[t - 1] * 0.99]


def lru_deadline(missed: list[int], target: float) -> int | None:
    """The first return r such that any run whose returns 1..r miss what `missed` (lru's) does has a
    P99 above `target`, whatever the later returns miss (>= 0): a rule that reaches `target` must
    decide otherwise than lru at an evict call before return r. None: lru's own run reaches it."""
    n = len(missed)
    srt = [0] * n  # returns after r counted as missing nothing: the lowest P99 such a run can have
    for r, miss in enumerate(missed, 1):
        del srt[0]
        bisect.insort(srt, miss)
        if percentile(srt, 0.99) > target:
            return r
    return None


def evict_calls_before(starts: list, r: int) -> int:
    """lru's evict calls made before its return `r` started (`starts` of its run)."""
    seen = 0
    for returning, _, _, before in starts:
        seen += returning
        if seen == r:
            return before
    raise ValueError(f"the run has {seen} returns, not {r}")


def horizon_check(cfg: dict, res: dict, gain: float, grid: int = 12) -> dict:
    """For a config whose oracle cuts lru's P99 by `gain` (`res`: run_config's runs, lru and the
    oracle's rules among them): the return before which any rule reaching half of that must leave lru
    (`deadline`, and lru's evict calls before it, `calls`); the fixed rules at half without a loss at
    the end, each with its horizon losses (`fixed`); and when none of those is free of them, the rules
    that switch once (`tail@q>j`: lru for j calls, then q; j on a grid of about `grid` steps up to
    `calls`, q the oracle's shares) at half without a loss at the end, each with its horizon losses
    (`switch`). `safe`: a rule at half that loses at no horizon >= HORIZON_FROM (None: none)."""
    base = res["lru"]
    target = base["p99"] * (1 - gain / 2)
    deadline = lru_deadline(base["missed"], target)
    calls = evict_calls_before(base["starts"], deadline) if deadline else base["calls"]

    def at_half(runs: dict) -> dict:
        return {rule: horizon_losses(r, base) for rule, r in runs.items()
                if rule != "lru" and r["p99"] <= target and not loses(r, base)}

    fixed = at_half({rule: res[rule] for rule in ORACLE_RULES if rule in res})
    safe = next((rule for rule, lost in fixed.items() if not lost), None)
    switch: dict = {}
    if safe is None:
        step = max(1, calls // grid)
        names = [f"tail@{q}>{j}" for j in range(step, calls + 1, step) for q in ORACLE_SHARES]
        switch = at_half(run_config(cfg, tuple(names)))
        safe = next((rule for rule, lost in switch.items() if not lost), None)
    return {"target": target, "deadline": deadline, "calls": calls, "fixed": fixed, "switch": switch, "safe": safe}


SINGLE_SHARES = (0.125, 0.875)  # the mildest tail share, and the oracle's most frequent one


def single_calls(cfg: dict, base: dict, shares=SINGLE_SHARES, k: int = 10) -> dict:
    """One non-lru decision: runs `tail@q>j+1` (lru on every evict call but the (j+1)-th, which cuts
    at share q) for j at k points spread over lru's evict calls (`base`: lru's run), each share.
    Rule -> run_config's figures (empty when lru makes fewer than k calls)."""
    n = base["calls"]
    if n < k:
        return {}
    js = sorted({(n - 1) * i // max(1, k - 1) for i in range(k)})
    return run_config(cfg, tuple(f"tail@{q}>{j}+1" for q in shares for j in js))


def same_shape(cfg: dict, others: list[dict]) -> dict | None:
    """The config of `others` (another seed's sweep) with `cfg`'s workload shape (name without its seed,
    page, regime) whose pool is nearest `cfg`'s (in the shape's units); None: that seed has none."""
    name = cfg["name"].split(" seed ")[0]
    match = [c for c in others if c["name"].split(" seed ")[0] == name and c["page"] == cfg["page"]
             and c["regime"] == cfg["regime"]]
    return min(match, key=lambda c: abs(c["m"] - cfg["m"]), default=None)
