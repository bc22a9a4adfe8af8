"""What a session run records (`CallRecord`, `SessionRun`) and its measures: TTFT and uncached tokens
per call, and the analytic check of RR-Evict (SPEC §10: ideal round-robin keeps h = (m − n_a)/(n·s)
of each idle history)."""

from __future__ import annotations

from dataclasses import dataclass, field

from radixflow.core.metrics import mean, percentile
from radixflow.core.scheduler import Scheduler


@dataclass
class CallRecord:
    """One finished call: what it asked for and what the cache gave it."""

    sid: str
    call: int
    arrival: float
    finished: float
    prompt_len: int
    output_len: int
    cached: int  # h: the tokens it resumed from
    identity_hit: int  # ĥ: the index's longest match
    ttft: float
    prev_cached: int | None  # tokens of this history cached when its previous call ended
    shared_len: int = 0

    @property
    def uncached(self) -> int:
        return self.prompt_len - self.cached

    @property
    def kept_fraction(self) -> float | None:
        """Share of the returning history (beyond the shared prefix) still cached at this call."""
        if self.prev_cached is None or self.prev_cached <= self.shared_len:
            return None
        kept = (min(self.cached, self.prev_cached) - self.shared_len) / (self.prev_cached - self.shared_len)
        return max(0.0, kept)


@dataclass
class SessionRun:
    calls: list[CallRecord]
    makespan: float
    evicted_tokens: int
    scheduler: Scheduler = field(repr=False)


@dataclass
class EvictionMeasures:
    eviction: str
    calls: int
    ttft_mean: float
    ttft_p50: float
    ttft_p99: float
    uncached_mean: float
    uncached_p99: float
    hit_rate: float  # percent of prompt tokens served from cache
    evicted_tokens: int
    kept_mean: float  # mean kept fraction of returning histories
    kept_all_or_nothing: float  # share of returning calls that kept < 5 % or > 95 % of their history
    makespan: float
    # The same over returning calls only: a session's first call is cold under every policy.
    returning_ttft_mean: float = float("nan")
    returning_ttft_p99: float = float("nan")
    returning_uncached_mean: float = float("nan")
    returning_uncached_p99: float = float("nan")


def measure_sessions(name: str, run: SessionRun) -> EvictionMeasures:
    calls = run.calls
    ttft = [c.ttft for c in calls]
    unc = [c.uncached for c in calls]
    prompt = sum(c.prompt_len for c in calls)
    kept = [k for k in (c.kept_fraction for c in calls) if k is not None]
    back = [c for c in calls if c.prev_cached is not None]
    return EvictionMeasures(
        eviction=name, calls=len(calls), ttft_mean=mean(ttft), ttft_p50=percentile(ttft, 0.5),
        ttft_p99=percentile(ttft, 0.99), uncached_mean=mean(unc), uncached_p99=percentile(unc, 0.99),
        hit_rate=100.0 * sum(c.cached for c in calls) / prompt if prompt else 0.0,
        evicted_tokens=run.evicted_tokens, kept_mean=mean(kept),
        kept_all_or_nothing=mean(1.0 if k < 0.05 or k > 0.95 else 0.0 for k in kept),
        makespan=run.makespan,
        returning_ttft_mean=mean(c.ttft for c in back), returning_ttft_p99=percentile([c.ttft for c in back], 0.99),
        returning_uncached_mean=mean(c.uncached for c in back),
        returning_uncached_p99=percentile([c.uncached for c in back], 0.99))


@dataclass
class SteadyState:
    """Inputs of the analytic model h = (m − n_a)/(n·s), measured over a window of a run."""

    n_active: float  # time-average of calls in flight
    n_idle: float  # time-average of agents between calls (n·s)
    capacity_units: float  # m: cache capacity in full-prefix units
    predicted_kept: float  # h
    measured_kept: float  # mean kept fraction of the calls returning inside the window
    returning_calls: int


def live_window(run: SessionRun, warmup: int = 2) -> tuple[float, float]:
    """The span where every session is past its first `warmup` calls and none has made its last."""
    by_session: dict[str, list[CallRecord]] = {}
    for c in run.calls:
        by_session.setdefault(c.sid, []).append(c)
    cs = [sorted(v, key=lambda c: c.call) for v in by_session.values()]
    t0 = max(v[min(warmup, len(v) - 1)].arrival for v in cs)
    t1 = min(v[-1].arrival for v in cs)
    if t1 <= t0:
        raise ValueError("the run has no steady-state window: give the agents more calls")
    return t0, t1


def steady_state(run: SessionRun, capacity_tokens: int,
                 window: tuple[float, float] | None = None) -> SteadyState:
    """Compares the measured kept fraction with h over `window` (seconds; default `live_window`).
    Prefixes exclude the shared system prompt, which is cached once for everyone."""
    t0, t1 = window or live_window(run)
    span = t1 - t0
    by_session: dict[str, list[CallRecord]] = {}
    for c in sorted(run.calls, key=lambda c: c.arrival):
        by_session.setdefault(c.sid, []).append(c)
    active = idle = 0.0
    for cs in by_session.values():
        for i, c in enumerate(cs):
            active += max(0.0, min(c.finished, t1) - max(c.arrival, t0))
            if i + 1 < len(cs):
                idle += max(0.0, min(cs[i + 1].arrival, t1) - max(c.finished, t0))
    inside = [c for c in run.calls if t0 <= c.arrival <= t1]
    shared = inside[0].shared_len if inside else 0
    unit = mean(c.prompt_len + c.output_len - shared for c in inside)
    m = (capacity_tokens - shared) / unit if inside else float("nan")
    n_a, n_i = active / span, idle / span
    kept = [k for k in (c.kept_fraction for c in inside) if k is not None]
    return SteadyState(n_a, n_i, m, min(1.0, max(0.0, (m - n_a) / n_i)) if n_i else float("nan"),
                       mean(kept), len(kept))
