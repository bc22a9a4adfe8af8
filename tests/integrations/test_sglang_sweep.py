"""The sweep of benchmarks/sglang_eviction.py --sweep, small: every backend through SGLang's cache with
SGLang's sanity check and the pool ledger (free + evictable + protected + held = size) after every
request start and end; `radixflow-adaptive` is lru's decisions where its evidence says so, and cuts
tails (and beats lru's P99) where recency loses whole histories. SGLang venv (scripts/test.sh)."""

from __future__ import annotations

import pytest
from sglang_factories import load_twins

load_twins()

from radixflow.integrations.sglang import sweep  # noqa: E402
from radixflow.workloads.agentic import AgenticSpec, agentic_sessions  # noqa: E402


@pytest.fixture(scope="module")
def small():
    out = []
    for cfg in sweep.sweep_configs(small=True):
        out.append((cfg, sweep.run_config(cfg, check=True)))
    return out


def test_small_sweep_keeps_integrity_and_adaptive_never_loses(small):
    assert len(small) >= 3
    for cfg, res in small:
        base = res["lru"]
        assert res["lru@py"]["missed"] == base["missed"], f"{cfg['name']}: lru differs between tree cores"
        assert not sweep.loses(res["radixflow-adaptive"], base), cfg["name"]
        for b, r in res.items():
            assert len(r["missed"]) == len(base["missed"]) and r["hit"] >= 0, b


def test_adaptive_is_lru_node_for_node_when_recency_keeps_histories(small):
    """Where no return would have lost its history under recency, the adaptive backend runs SGLang's
    own walk on every evict call: the same misses as lru, call by call."""
    checked = 0
    for cfg, res in small:
        r = res["radixflow-adaptive"]
        if r["tail_calls"] == 0:
            assert r["lru_calls"] == res["lru@py"]["calls"] > 0
            assert r["missed"] == res["lru@py"]["missed"], cfg["name"]
            checked += 1
    assert checked >= 1


def _inside():
    sessions = agentic_sessions(AgenticSpec(n_agents=16, idle_fraction=0.75, calls=8, system_len=256,
                                            context_len=512, append_len=32, output_len=8, seed=7))
    return sweep._pooled("agentic n=16 s=0.75", sessions, 16, (4 + 12 / 3,), 4.0, 16)[0]


def test_adaptive_cuts_tails_where_recency_loses_whole_histories():
    cfg = _inside()
    assert cfg["regime"] == "inside"
    res = sweep.run_config(cfg, backends=("lru@py", "radixflow-adaptive"), check=True)
    base, r = res["lru@py"], res["radixflow-adaptive"]
    assert r["tail_calls"] > 0
    assert max(base["missed"]) > 0.9 * max(r["missed"] + [1])  # lru loses whole histories here
    assert r["p99"] < base["p99"]


def _lru_ghost(monkeypatch, ticks: int):
    from radixflow.integrations.sglang.backend import AdaptiveFullComponent
    from radixflow.integrations.sglang.twins import FULL, SGLangTwin

    monkeypatch.setattr(AdaptiveFullComponent, "THETA", 2.0)  # never tails: the cache is lru
    monkeypatch.setattr(AdaptiveFullComponent, "TICKS", ticks)
    cfg = _inside()
    tw = SGLangTwin("radixflow-adaptive", cfg["capacity"], cfg["page"], small_kv=True)
    sweep.replay(tw, cfg["sessions"], 1.0)
    comp = tw.cache.components[FULL]
    assert comp.tail_calls == 0
    return comp


def test_recency_ghost_counts_the_whole_losses_lru_really_has(monkeypatch):
    """The ghost (stack distances from the request stream alone) counts about the same returns lost
    whole as the cache, running lru, really loses. With 64 ticks the Fenwick tree is compacted every
    32 inserts (renumbered, the newest 32 of the 16 trajectories kept): the same counts."""
    comp = _lru_ghost(monkeypatch, 1 << 15)
    assert comp.returns > 50 and comp.lost_real > 5  # lru loses whole histories here
    assert abs(comp.lost_est - comp.lost_real) <= max(2, comp.lost_real // 10)
    small = _lru_ghost(monkeypatch, 64)
    assert (small.returns, small.lost_est, small.lost_real) == (comp.returns, comp.lost_est, comp.lost_real)
