"""What eviction costs inside SGLang's cache, per backend, on the sweep's configs (benchmarks/
sglang_eviction_cost.py; imports SGLang through twins.py).

Every backend replays the same requests (sweep.replay: match, lock, allocate with `cache.evict` when
short, insert, unlock) into its own fresh cache; each `cache.evict` call and each request's path are
timed in CPU time of this process (the machine is shared; an evict call is single-threaded and never
waits). `lru` is SGLang's lru on its default tree core (Rust where it loads: what a user runs),
`lru@py` the same on the Python core our backends need. A config at `scale` k has k copies of every
session (private tokens renumbered, the shared prefix kept) and k times the pool's private part, so
the tree is k times larger and as full.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics

from radixflow.integrations.sglang.sweep import replay
from radixflow.integrations.sglang.twins import FULL, SGLangTwin
from radixflow.workloads.sessions import Session

COST_BACKENDS = ("lru", "lru@py", "radixflow-rr-tail", "radixflow-level-tail", "radixflow-flop-aware",
                 "radixflow-adaptive")
OFFSET = 1 << 40  # renumbers a copy's private tokens (the sweep's tokens stay far below it)


def scaled(cfg: dict, k: int) -> dict:
    """`cfg` with k copies of each session and k times the pool above the shared prefix."""
    if k < 1:
        raise ValueError(f"scale must be >= 1, got {k}")
    if k == 1:
        return cfg
    sessions = []
    for copy in range(k):
        for s in cfg["sessions"]:
            toks = s.tokens[: s.shared_len] + tuple(t + copy * OFFSET for t in s.tokens[s.shared_len:])
            sessions.append(Session(sid=f"{s.sid}#{copy}", namespace=s.namespace, tokens=toks,
                                    calls=list(s.calls), shared_len=s.shared_len))
    shared = max((s.shared_len for s in cfg["sessions"]), default=0)
    page = cfg["page"]
    cap = (shared + k * (cfg["capacity"] - shared)) // page * page
    return {**cfg, "sessions": sessions, "capacity": cap, "name": f"{cfg['name']} x{k}"}


@dataclasses.dataclass
class Cost:
    """One backend's eviction cost on one config (medians over repeats)."""

    calls: int  # evict calls in the replay
    per_call: float  # mean CPU seconds per evict call
    total: float  # CPU seconds in all evict calls
    per_request: float  # mean CPU seconds per request path (match + lock + allocate/evict + insert + unlock)
    missed: list  # missed prompt tokens per returning call (the first repeat's)


def twin_for(backend: str, cfg: dict) -> SGLangTwin:
    name, core = backend, "python"
    if backend.endswith("@py"):
        name = backend[: -len("@py")]
    elif backend in ("lru", "tlru"):
        core = "default"
    return SGLangTwin(name, cfg["capacity"], cfg["page"], small_kv=True, core=core)


def measure(cfg: dict, backend: str, repeats: int = 1) -> Cost:
    """Replays `cfg` under `backend` `repeats` times, each in a fresh cache; medians of the figures."""
    runs = []
    for _ in range(repeats):
        tw = twin_for(backend, cfg)
        gc.collect()
        gc.disable()  # a collection inside one backend's timed calls would land on it alone
        try:
            missed = replay(tw, cfg["sessions"], 1.0)
        finally:
            gc.enable()
        calls = tw.evict_calls
        runs.append(Cost(len(calls), statistics.mean(calls) if calls else 0.0, sum(calls),
                         tw.request_cpu / max(1, tw.requests), missed))
    med = statistics.median
    return Cost(runs[0].calls, med(r.per_call for r in runs), med(r.total for r in runs),
                med(r.per_request for r in runs), runs[0].missed)


def measure_all(cfg: dict, backends=COST_BACKENDS, repeats: int = 1) -> dict[str, Cost]:
    """Every backend on one config; the backends take turns repeat by repeat, so load on the machine
    falls on all of them alike."""
    per: dict[str, list[Cost]] = {b: [] for b in backends}
    for _ in range(repeats):
        for b in backends:
            per[b].append(measure(cfg, b))
    med = statistics.median
    return {b: Cost(v[0].calls, med(c.per_call for c in v), med(c.total for c in v),
                    med(c.per_request for c in v), v[0].missed) for b, v in per.items()}


def tail_calls(tw: SGLangTwin) -> int | None:
    """Evict calls the adaptive backend answered with tail cuts (None for the others)."""
    return getattr(tw.cache.components[FULL], "tail_calls", None)
