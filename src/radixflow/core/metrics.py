"""The measures of SPEC §9 computed from a finished run, and the cost identity between two arms."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from radixflow.core.branch import Branch, group_requests
from radixflow.core.loop import RunResult
from radixflow.core.misses import Misses, total


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated quantile q in [0, 1]; NaN for no values."""
    if not values:
        return float("nan")
    v = sorted(values)
    k = (len(v) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


@dataclass
class ArmMeasures:
    policy: str
    rounds: int
    fragments: int
    tokens: int
    rows_per_round: float
    tokens_per_round: float
    empty_slots: int
    reuse_rate: float  # percent
    latency_mean: float
    latency_p50: float
    latency_p95: float
    first_selection_wait_mean: float
    host_time: float
    cost_per_round: float
    host_ms_per_1k_tokens: float
    blocked_deferrals: int
    preemptions: int
    requests: int
    branches: int
    prompt_tokens: int
    cached_tokens: int
    makespan: float
    lower_bound: int | None
    dependency_depth: int
    max_num_seqs: int
    max_num_batched_tokens: int
    # SPEC §14: the prompt split by cause, the exact-depth checkpoints made, the modelled capture time.
    misses: dict = field(default_factory=dict)
    exact_checkpoints: int = 0
    capture_time: float = 0.0
    # SPEC §15: dependent rows, rounds that had any, the most levels in one forward, the modelled (simulator)
    # or measured (engine) time of the extra levels (part of host_time).
    handoff_rows: int = 0
    handoff_rounds: int = 0
    max_levels: int = 1
    handoff_time: float = 0.0
    # Per-request latencies, kept so that merged parts give pooled percentiles (not written to JSON).
    latencies: list[float] = field(default_factory=list, repr=False)

    @property
    def rows_per_branch(self) -> float:
        """Fragments ÷ branches: how often vLLM-style chunking splits a branch (1.0 = never)."""
        return self.fragments / self.branches if self.branches else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["latencies"]
        d["rows_per_branch"] = self.rows_per_branch
        return d


def measure(policy: str, run: RunResult) -> ArmMeasures:
    s = run.scheduler
    rounds = s.rounds
    k = len(rounds)
    frags = sum(r.rows for r in rounds)
    tokens = sum(r.tokens for r in rounds)
    host = sum(r.host_time for r in rounds)
    branches: list[Branch] = run.branches
    prompt = sum(b.prompt_len for b in branches)
    cached = sum(b.cached_tokens or 0 for b in branches)
    lat = [r.latency for r in group_requests(branches) if r.latency is not None]
    waits = [b.first_selected_at - b.arrival for b in branches if b.first_selected_at is not None]
    S, T = s.config.max_num_seqs, s.config.max_num_batched_tokens
    fixed = all(b.arrival == 0 for b in branches)
    lb = lower_bound(tokens, frags, s.max_level, S, T, levels_per_forward(s)) if fixed and k else None
    return ArmMeasures(
        policy=policy, rounds=k, fragments=frags, tokens=tokens,
        rows_per_round=frags / k if k else 0.0, tokens_per_round=tokens / k if k else 0.0,
        empty_slots=S * k - frags, reuse_rate=100.0 * cached / prompt if prompt else 0.0,
        latency_mean=mean(lat), latency_p50=percentile(lat, 0.5), latency_p95=percentile(lat, 0.95),
        first_selection_wait_mean=mean(waits), host_time=host, cost_per_round=host / k if k else 0.0,
        host_ms_per_1k_tokens=1e6 * host / tokens if tokens else 0.0,
        blocked_deferrals=s.blocked_total, preemptions=s.preemptions,
        requests=len(group_requests(branches)), branches=len(branches), prompt_tokens=prompt,
        cached_tokens=cached, makespan=run.makespan, lower_bound=lb, dependency_depth=s.max_level,
        max_num_seqs=S, max_num_batched_tokens=T, misses=total(branches).to_dict(),
        exact_checkpoints=s.exact_checkpoints, capture_time=sum(r.capture_time for r in rounds),
        handoff_rows=sum(r.handoff_rows for r in rounds), handoff_rounds=sum(r.handoff_rows > 0 for r in rounds),
        max_levels=max((r.levels for r in rounds), default=1), handoff_time=sum(r.handoff_time for r in rounds),
        latencies=lat)


def levels_per_forward(s) -> int:
    """L: recurrent levels one forward may run (SPEC §15; 1 without hand-off)."""
    return s.config.handoff_max_levels if getattr(s, "handoff", False) else 1


def lower_bound(tokens: int, rows: int, depth: int, max_rows: int, max_tokens: int, levels: int = 1) -> int:
    """SPEC §9 / §15: K >= max(⌈W/T⌉, ⌈V/S⌉, ⌈D/L⌉) for W tokens, V row visits, D dependency depth."""
    return max(math.ceil(tokens / max_tokens), math.ceil(rows / max_rows), math.ceil(depth / levels))


@dataclass
class CostIdentity:
    """T_host,0 − T_host,1 = (K0 − K1)·c̄0 − K1·(c̄1 − c̄0): round gain minus cost drift."""

    delta_host: float
    round_gain: float
    cost_drift: float

    @property
    def residual(self) -> float:
        return self.delta_host - (self.round_gain - self.cost_drift)


def cost_identity(base: ArmMeasures, arm: ArmMeasures) -> CostIdentity:
    c0, c1 = base.cost_per_round, arm.cost_per_round
    return CostIdentity(base.host_time - arm.host_time, (base.rounds - arm.rounds) * c0,
                        arm.rounds * (c1 - c0))


def merge(policy: str, parts: list[ArmMeasures]) -> ArmMeasures:
    """Combines per-stream/per-order runs of one arm into one row (sums, pooled latencies, weighted waits)."""
    if len(parts) == 1:
        return parts[0]
    k = sum(p.rounds for p in parts)
    frags = sum(p.fragments for p in parts)
    tokens = sum(p.tokens for p in parts)
    host = sum(p.host_time for p in parts)
    reqs = sum(p.requests for p in parts)
    br = sum(p.branches for p in parts)
    prompt = sum(p.prompt_tokens for p in parts)
    cached = sum(p.cached_tokens for p in parts)
    S = parts[0].max_num_seqs
    lat = [x for p in parts for x in p.latencies]
    pooled = all(p.latencies or not p.requests for p in parts)

    def wmean(attr, weight):
        tot = sum(getattr(p, weight) for p in parts)
        return sum(getattr(p, attr) * getattr(p, weight) for p in parts) / tot if tot else float("nan")

    lbs = [p.lower_bound for p in parts]
    return ArmMeasures(
        policy=policy, rounds=k, fragments=frags, tokens=tokens, rows_per_round=frags / k if k else 0.0,
        tokens_per_round=tokens / k if k else 0.0, empty_slots=sum(p.empty_slots for p in parts),
        reuse_rate=100.0 * cached / prompt if prompt else 0.0,
        # Parts read back without their per-request latencies (a bench file) keep the mean only:
        # percentiles cannot be pooled from percentiles.
        latency_mean=mean(lat) if pooled else wmean("latency_mean", "requests"),
        latency_p50=percentile(lat, 0.5) if pooled else float("nan"),
        latency_p95=percentile(lat, 0.95) if pooled else float("nan"),
        first_selection_wait_mean=wmean("first_selection_wait_mean", "branches"), host_time=host,
        cost_per_round=host / k if k else 0.0, host_ms_per_1k_tokens=1e6 * host / tokens if tokens else 0.0,
        blocked_deferrals=sum(p.blocked_deferrals for p in parts), preemptions=sum(p.preemptions for p in parts),
        requests=reqs, branches=br, prompt_tokens=prompt, cached_tokens=cached,
        makespan=sum(p.makespan for p in parts),
        lower_bound=sum(lbs) if all(x is not None for x in lbs) else None,
        dependency_depth=max(p.dependency_depth for p in parts), max_num_seqs=S,
        max_num_batched_tokens=parts[0].max_num_batched_tokens, misses=_sum_misses(parts),
        exact_checkpoints=sum(p.exact_checkpoints for p in parts),
        capture_time=sum(p.capture_time for p in parts), handoff_rows=sum(p.handoff_rows for p in parts),
        handoff_rounds=sum(p.handoff_rounds for p in parts), max_levels=max(p.max_levels for p in parts),
        handoff_time=sum(p.handoff_time for p in parts), latencies=lat)


def _sum_misses(parts: list[ArmMeasures]) -> dict:
    out = Misses()
    for p in parts:
        out.add(Misses(**p.misses))
    return out.to_dict()
