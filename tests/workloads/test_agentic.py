"""Agentic sessions: the generator (SPEC §10, RR-Evict)."""

from __future__ import annotations

import random
import statistics

import pytest

from radixflow.workloads.agentic import AgenticSpec, agentic_sessions, sample_latency

SMALL = AgenticSpec(n_agents=6, calls=4, system_len=32, context_len=96, append_len=16, output_len=4,
                    tool_latency_mean=0.5, seed=3)


def test_each_call_resends_the_whole_history():
    sessions = agentic_sessions(SMALL)
    assert len(sessions) == 6 and all(len(s.calls) == 4 for s in sessions)
    for s in sessions:
        assert s.tokens[:32] == sessions[0].tokens[:32]  # shared system prompt
        ends = [c.prompt_end for c in s.calls]
        assert ends[0] == 32 + 96 + 16
        assert all(b - a == 4 + 16 for a, b in zip(ends, ends[1:]))  # answer + next tool result
    assert sessions[0].tokens[32:40] != sessions[1].tokens[32:40]


def test_spec_validation_and_latencies():
    with pytest.raises(ValueError, match="idle-fraction"):
        AgenticSpec(idle_fraction=1.0)
    with pytest.raises(ValueError, match="tool latency"):
        AgenticSpec(tool_latency="pareto")
    assert AgenticSpec(idle_fraction=0.75, call_time=2.0).mean_tool_latency == pytest.approx(6.0)
    assert AgenticSpec(idle_fraction=0.75).active_fraction == 0.25
    rng = random.Random(0)
    for kind in ("exp", "fixed", "uniform", "lognormal"):
        xs = [sample_latency(kind, 2.0, rng) for _ in range(4000)]
        assert statistics.mean(xs) == pytest.approx(2.0, rel=0.08), kind
