"""The closed-loop driver of session workloads, and eviction policies compared on it.

A session's next call arrives only after the previous one finished plus a tool latency.
`run_sessions` drives this through the same Scheduler and executor as `run_trace` (which is
open-loop: its arrivals are fixed in advance). The answers are scripted (`ScriptedExecutor`): their
tokens are part of the session from the start, so two eviction policies see exactly the same prompts
and only the cache differs.
"""

from __future__ import annotations

import heapq
from dataclasses import replace

from radixflow.config import SchedulerConfig
from radixflow.core.batch import Batch, ExecResult, Sample
from radixflow.core.branch import Branch
from radixflow.core.policies import get_arm
from radixflow.core.scheduler import Scheduler
from radixflow.sim.cost_model import CostModel, get_gpu
from radixflow.sim.executor import SimExecutor
from radixflow.sim.runner import reuse_costs
from radixflow.sim.session_measures import CallRecord, SessionRun, measure_sessions, steady_state
from radixflow.spec import get_spec
from radixflow.workloads.sessions import Session, full_prefix_unit


class ScriptedExecutor:
    """Wraps an executor (for timing); the tokens sampled are the session's scripted answer."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def execute(self, batch: Batch) -> ExecResult:
        res = self.inner.execute(batch)
        for i, f in enumerate(batch.fragments):
            script = f.branch.user_data
            if f.samples and script is not None:
                res.samples[i] = Sample(script[len(f.branch.output)])
        return res


def run_sessions(scheduler: Scheduler, executor, sessions: list[Session], on_round=None) -> SessionRun:
    """Runs every call of every session; a call arrives `delay` after its predecessor finished."""
    executor = ScriptedExecutor(executor)
    arrivals = [(s.calls[0].delay, i, 0) for i, s in enumerate(sessions) if s.calls]
    heapq.heapify(arrivals)
    prev_cached: dict[int, int] = {}
    started: dict[int, tuple[int, int]] = {}  # branch uid -> (session, call)
    records: list[CallRecord] = []
    bs = scheduler.block_size
    now = arrivals[0][0] if arrivals else 0.0
    while arrivals or scheduler.has_unfinished:
        while arrivals and arrivals[0][0] <= now + 1e-12:
            t, si, ci = heapq.heappop(arrivals)
            s, c = sessions[si], sessions[si].calls[ci]
            b = Branch(f"{s.sid}/{ci}", 0, s.tokens[: c.prompt_end], s.namespace, t, c.output_len,
                       user_data=s.tokens[c.prompt_end : c.prompt_end + c.output_len])
            scheduler.add(b)
            started[b.uid] = (si, ci)
        deadline = scheduler.admit(now)
        batch = scheduler.schedule(now)
        if not batch:
            nxt = [x for x in (arrivals[0][0] if arrivals else None, deadline) if x is not None]
            if not nxt:
                raise RuntimeError(f"stuck at t={now:.3f}s: {len(scheduler.waiting)} waiting, "
                                   f"{len(scheduler.running)} running (is the cache smaller than one call?)")
            now = max(now, min(nxt))
            continue
        result = executor.execute(batch)
        now += result.host_time
        for b in scheduler.complete(batch, result, now):
            si, ci = started.pop(b.uid)
            s = sessions[si]
            records.append(CallRecord(s.sid, ci, b.arrival, now, b.prompt_len, len(b.output),
                                      b.cached_tokens or 0, b.identity_hit or 0, b.first_token_at - b.arrival,
                                      prev_cached.get(si), s.shared_len))
            # What this history leaves in the cache: every full page it computed (the last token's
            # KV is never computed), as a decode would leave it.
            prev_cached[si] = (b.num_tokens - 1) // bs * bs
            if ci + 1 < len(s.calls):
                heapq.heappush(arrivals, (now + s.calls[ci + 1].delay, si, ci + 1))
        if on_round is not None:
            on_round(scheduler, batch)
    return SessionRun(records, now, scheduler.index.evicted_pages * bs, scheduler)


def parse_capacity(text: str, sessions: list[Session]) -> int:
    """`N` tokens, or `Nx`: N full prefixes (mean private history per call) plus the shared prefix once."""
    t = str(text).strip().lower()
    try:
        if t.endswith("x"):
            unit, shared = full_prefix_unit(sessions)
            return int(shared + float(t[:-1]) * unit)
        return int(float(t))
    except ValueError:
        raise ValueError(f"--cache-capacity {text!r}: give tokens (e.g. 80000) "
                         f"or full prefixes (e.g. 24x)") from None


def simulate_policies(sessions: list[Session], model: str, gpu: str, evictions: list[str], capacity: str,
                      block_size: int = 16, max_num_seqs: int = 16, max_num_batched_tokens: int = 8192,
                      state_interval: int = 512, state_slots: int | None = None, check: bool = False,
                      config: SchedulerConfig | None = None, arm: str = "radix") -> dict:
    """Runs the same sessions under each eviction policy; measures, steady state and p99 ratios.

    `config`, if given, is the scheduler's configuration (snapshot mode, checkpoints, hand-off, ...)
    and its block size, budgets and interval replace the four arguments above; each run sets only
    the pool sizes (from `capacity`, `state_slots`) and the eviction policy."""
    if config is None:
        config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                 block_size=block_size, state_interval=state_interval)
    block_size = config.block_size
    spec = get_spec(model)
    cost = CostModel(spec, get_gpu(gpu))
    cost.block_size = block_size  # what a page copy moves
    cap = parse_capacity(capacity, sessions)
    unit, shared = full_prefix_unit(sessions)
    longest = max((c.prompt_end + c.output_len for s in sessions for c in s.calls), default=0)
    if cap < longest + block_size:
        raise ValueError(f"--cache-capacity is {cap:,} tokens, less than the longest call ({longest:,} tokens "
                         f"with its answer): give at least {longest + block_size:,}")
    rows = []
    for ev in evictions:
        cfg = replace(config, num_kv_pages=max(1, cap // block_size), eviction=ev, cache_memory_bytes=0)
        if state_slots is not None:
            cfg.num_state_slots = state_slots
        cfg.validate()
        sched = Scheduler(cfg, get_arm(arm), spec.is_hybrid, reuse_costs(spec, block_size))
        run = run_sessions(sched, SimExecutor(cost, spec.vocab_size), sessions,
                           on_round=(lambda s, b: s.check_integrity()) if check else None)
        row = vars(measure_sessions(ev, run))
        try:
            row["steady_state"] = vars(steady_state(run, cap))
        except ValueError:
            row["steady_state"] = None
        row["preemptions"] = sched.preemptions
        rows.append(row)
    ratios = []  # percent change of each policy against the first one
    for alt in rows[1:]:
        base = rows[0]
        r = {"baseline": base["eviction"], "policy": alt["eviction"]}
        for k in ("uncached_p99", "ttft_p99", "uncached_mean", "ttft_mean", "returning_uncached_p99",
                  "returning_ttft_p99", "returning_uncached_mean", "returning_ttft_mean"):
            r[k] = 100.0 * (alt[k] / base[k] - 1.0) if base[k] else float("nan")
        ratios.append(r)
    return {"capacity_tokens": cap, "full_prefix_unit": unit, "shared_prefix": shared, "policies": rows,
            "ratios": ratios}
