"""The closed-loop driver of session workloads and the analytic model of RR-Evict (SPEC §10)."""

from __future__ import annotations

import pytest

from radixflow.config import SchedulerConfig
from radixflow.core.policies import get_arm
from radixflow.core.scheduler import Scheduler
from radixflow.sim.cost_model import CostModel, get_gpu
from radixflow.sim.executor import SimExecutor
from radixflow.sim.sessions import parse_capacity, run_sessions, simulate_policies
from radixflow.spec import get_spec
from radixflow.workloads.agentic import AgenticSpec, agentic_sessions

SMALL = AgenticSpec(n_agents=6, calls=4, system_len=32, context_len=96, append_len=16, output_len=4,
                    tool_latency_mean=0.5, seed=3)


def run_small(eviction: str, capacity: int = 16_000, model: str = "qwen3-8b", spec=SMALL, slots: int = 512):
    sessions = agentic_sessions(spec)
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512, block_size=16, state_interval=64,
                          num_kv_pages=capacity // 16, num_state_slots=slots, eviction=eviction)
    ms = get_spec(model)
    sched = Scheduler(cfg, get_arm("radix"), ms.is_hybrid)
    run = run_sessions(sched, SimExecutor(CostModel(ms, get_gpu("a800"))), sessions,
                       on_round=lambda s, b: s.check_integrity())
    return sessions, run


def test_closed_loop_next_call_waits_for_the_previous_one():
    sessions, run = run_small("lru")
    assert len(run.calls) == 24
    by = {}
    for c in run.calls:
        by.setdefault(c.sid, []).append(c)
    for s in sessions:
        calls = sorted(by[s.sid], key=lambda c: c.call)
        for k, (a, b) in enumerate(zip(calls, calls[1:]), 1):
            assert b.arrival == pytest.approx(a.finished + s.calls[k].delay)
    # No pressure: every returning call finds its whole history (all but the last page-partial bit).
    for c in run.calls:
        if c.call:
            assert c.kept_fraction == 1.0 and c.cached == c.prev_cached
            assert c.uncached <= 16 + 4 + 16


@pytest.mark.parametrize("model", ["qwen3-8b", "qwen3.5-0.8b"])
@pytest.mark.parametrize("eviction", ["lru", "rr-tail", "rr-tail:1", "level-tail", "adaptive"])
def test_under_pressure_both_policies_keep_the_invariants(model, eviction):
    spec = AgenticSpec(n_agents=8, calls=5, system_len=32, context_len=256, append_len=16, output_len=4,
                       tool_latency_mean=0.3, seed=1)
    # 20 snapshot slots: the hybrid runs evict from both pools.
    _, run = run_small(eviction, capacity=1600, model=model, spec=spec, slots=20)
    assert len(run.calls) == 40 and run.evicted_tokens > 0
    assert run.scheduler.index.evicted_snapshots > 0 or model == "qwen3-8b"
    run.scheduler.check_integrity()
    assert run.scheduler.holds_nothing()


def test_capacity_units():
    sessions = agentic_sessions(SMALL)
    assert parse_capacity("1000", sessions) == 1000
    unit = sum(c.prompt_end + c.output_len - 32 for s in sessions for c in s.calls) / 24
    assert parse_capacity("2x", sessions) == int(32 + 2 * unit)
    with pytest.raises(ValueError, match="full prefixes"):
        parse_capacity("lots", sessions)


def test_steady_state_matches_the_analytic_model():
    """n agents, n_a active, capacity m with n_a < m < n: rr-tail keeps about h = (m − n_a)/(n·s) of
    every returning history; lru keeps the same mean, but all or nothing."""
    spec = AgenticSpec(n_agents=32, calls=30, system_len=128, context_len=1024, append_len=32, output_len=8,
                       call_time=0.6, tool_latency="exp", seed=1)
    out = simulate_policies(agentic_sessions(spec), "qwen3-8b", "a800", ["lru", "rr-tail"], "24x")
    lru, rr = out["policies"]
    for row in (lru, rr):
        ss = row["steady_state"]
        assert ss["returning_calls"] > 300
        assert ss["n_active"] < ss["capacity_units"] < ss["n_active"] + ss["n_idle"]  # n_a < m < n
        assert 0.2 < ss["predicted_kept"] < 0.9
        # 0.06: chunk granularity, history growth inside the window and the sampling noise of a
        # few hundred exponential idle times (see docs/eviction.md).
        assert abs(ss["measured_kept"] - ss["predicted_kept"]) < 0.06, row["eviction"]
    assert lru["kept_all_or_nothing"] > 0.95
    assert rr["kept_all_or_nothing"] < 0.6
    assert abs(rr["kept_mean"] - lru["kept_mean"]) < 0.06
