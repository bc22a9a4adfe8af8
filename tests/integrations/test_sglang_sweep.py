"""The sweep of benchmarks/sglang_eviction.py --sweep, small: every backend, and the adaptive backend held
on the tail rule at two cold shares, through SGLang's cache with SGLang's sanity check and the pool ledger
(free + evictable + protected + held = size) after every request start and end; `radixflow-adaptive`
never loses to lru there, and with its evidence for lru it is lru's decisions, call by call. SGLang venv
(scripts/test.sh)."""

from __future__ import annotations

from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sglang_factories import load_twins

load_twins()

from radixflow.core.metrics import percentile  # noqa: E402
from radixflow.integrations.sglang import sweep  # noqa: E402
from radixflow.integrations.sglang.adaptive import DuelRule  # noqa: E402
from radixflow.integrations.sglang.twins import FULL  # noqa: E402
from radixflow.workloads.agentic import AgenticSpec, agentic_sessions  # noqa: E402

HELD = ("tail@0.25", "tail@1.0")


@pytest.fixture(scope="module")
def small():
    out = []
    for cfg in sweep.sweep_configs(small=True):
        out.append((cfg, sweep.run_config(cfg, backends=sweep.SG_SWEEP + HELD, check=True)))
    return out


def test_small_sweep_keeps_integrity_and_adaptive_never_loses(small):
    assert len(small) >= 3
    for cfg, res in small:
        base = res["lru"]
        assert res["lru@py"]["missed"] == base["missed"], f"{cfg['name']}: lru differs between tree cores"
        assert not sweep.loses(res["radixflow-adaptive"], base), cfg["name"]
        for b, r in res.items():
            assert len(r["missed"]) == len(base["missed"]) and r["hit"] >= 0, b
        for b in HELD:  # the tail rule really ran (every evict call), and cut something lru would not
            assert res[b]["tail_calls"] == res[b]["calls"] and res[b]["lru_calls"] == 0, (cfg["name"], b)


def test_held_tail_rule_differs_from_lru_where_it_evicts(small):
    changed = [cfg["name"] for cfg, res in small
               if res["tail@1.0"]["calls"] and res["tail@1.0"]["missed"] != res["lru@py"]["missed"]]
    assert changed, "the tail rule made lru's decisions everywhere: the test checks nothing"


def test_oracle_picks_the_best_rule_that_does_not_lose(small):
    for cfg, res in small:
        rule, gain = sweep.oracle(res)
        assert not sweep.loses(res[rule], res["lru"]) and gain >= 0.0
        for b, r in res.items():
            if b in sweep.ORACLE_RULES and not sweep.loses(r, res["lru"]):
                assert r["p99"] >= res[rule]["p99"], (cfg["name"], b)


def _inside():
    sessions = agentic_sessions(AgenticSpec(n_agents=16, idle_fraction=0.75, calls=8, system_len=256,
                                            context_len=512, append_len=32, output_len=8, seed=7))
    return sweep._pooled("agentic n=16 s=0.75", sessions, 16, (4 + 12 / 3,), 4.0, 16)[0]


def _logged(backend: str, cfg: dict):
    """(twin, [(asked, evicted) per evict call]) after the config's replay."""
    tw = sweep.make_twin(backend, cfg["capacity"], cfg["page"])
    calls = []
    evict = tw.evict

    def logged(n):
        got = evict(n)
        calls.append((n, got))
        return got

    tw.evict = logged
    missed = sweep.replay(tw, cfg["sessions"], 1.0, check=True)
    return tw, calls, missed


def test_adaptive_is_lru_call_by_call_when_its_evidence_says_lru(monkeypatch):
    """On an inside config where the duel takes tails, with its evidence for lru (lru's shadow loses no
    share of its returns whole that counts): every evict call is SGLang's own lru walk, and the cache
    makes lru's decisions: the same calls, the same tokens evicted, the same misses per request."""
    cfg = _inside()
    _, _, lru_missed = _logged("lru@py", cfg)
    tw, calls, missed = _logged("radixflow-adaptive", cfg)
    comp = tw.cache.components[FULL]
    assert comp.tail_calls > 0 and missed != lru_missed  # the duel acts here: the test below means something
    monkeypatch.setattr(DuelRule, "WHOLE", 10**9)  # evidence for lru: never enough whole losses
    tw, calls, missed = _logged("radixflow-adaptive", cfg)
    base, base_calls, base_missed = _logged("lru@py", cfg)
    comp = tw.cache.components[FULL]
    assert comp.tail_calls == 0 and comp.lru_calls == len(base_calls) > 0
    assert calls == base_calls
    assert missed == base_missed


def test_adaptive_cuts_the_p99_where_lru_loses_whole_histories():
    cfg = _inside()
    assert cfg["regime"] == "inside"
    res = sweep.run_config(cfg, backends=("lru@py", "radixflow-adaptive"), check=True)
    base, r = res["lru@py"], res["radixflow-adaptive"]
    assert r["tail_calls"] > 0
    assert max(base["missed"]) > 0.9 * max(r["missed"] + [1])  # lru loses whole histories here
    assert r["p99"] < base["p99"] and not sweep.loses(r, base)


def test_few_call_pools_are_timed_over_replays_with_the_same_decisions():
    """`run_config_timed`: a pool where lru makes fewer than `few` evict calls is replayed; each
    backend's times are the medians of the replays (between their least and greatest), and the
    decisions are the same on every replay. A pool with enough calls is run once."""
    cfg = sweep.sweep_configs(small=True)[0]
    backends = ("lru", "radixflow-adaptive")
    once = sweep.run_config(cfg, backends=backends)
    assert once["lru"]["calls"] > 0
    seen: list = []
    real = sweep.run_config

    def spy(c, backends=sweep.SG_SWEEP, check=False):
        r = real(c, backends, check)
        seen.append(r)
        return r

    with mock.patch.object(sweep, "run_config", spy):
        timed = sweep.run_config_timed(cfg, backends, few=once["lru"]["calls"] + 1, repeats=3)
        assert len(seen) == 3
        for b in backends:
            assert timed[b]["timing_runs"] == 3
            assert timed[b]["calls"] == once[b]["calls"] and timed[b]["missed"] == once[b]["missed"]
            for key in ("per_call", "total", "per_request"):
                vals = sorted(r[b][key] for r in seen)
                assert timed[b][key] == vals[1]
        seen.clear()
        single = sweep.run_config_timed(cfg, backends, few=once["lru"]["calls"], repeats=3)
        assert len(seen) == 1 and "timing_runs" not in single["lru"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2000), min_size=1, max_size=300), st.floats(0, 2500))
def test_lru_deadline_is_the_first_return_whose_misses_alone_fix_a_p99_above_the_target(missed, target):
    """`lru_deadline`: from return r on, lru's misses alone (every later return missing nothing, the
    least it can) give a P99 above the target; up to r - 1 they do not. None: lru's run reaches it."""
    n = len(missed)
    r = sweep.lru_deadline(missed, target)
    if r is None:
        assert percentile(missed, 0.99) <= target
        return
    assert percentile(missed[:r] + [0] * (n - r), 0.99) > target
    assert percentile(missed[: r - 1] + [0] * (n - r + 1), 0.99) <= target


def _run(misses: list[int], hits: list[int]) -> dict:
    """A run as `run_config` records it: a first call of 100 hit tokens, then one return per entry."""
    return {"starts": [(False, 100, 0, 0)] + [(True, h, m, 0) for h, m in zip(hits, misses)]}


def test_horizon_losses_judge_the_run_stopped_after_each_return():
    """A run that misses more than lru early and wins at the end loses at the early horizons only; one
    that trails lru's hits by over 1 % at a horizon loses there though its P99 is lru's."""
    n = 40
    base = _run([100] * n, [1000] * n)
    late = _run([300] * 20 + [0] * 20, [1000] * n)  # its P99 is 300 until its misses fall under lru's
    assert sweep.horizon_losses(late, base, first=1) == list(range(1, 41))  # P99 over 40 returns: still 300
    early = _run([300] + [0] * 199, [1000] * 200)
    base200 = _run([100] * 200, [1000] * 200)
    lost = sweep.horizon_losses(early, base200, first=1)
    assert lost == list(range(1, lost[-1] + 1)) and lost[-1] < 200  # one big miss leaves the P99 as returns come
    thin = _run([100] * n, [1000] * 10 + [800] + [1000] * 29)
    # 200 behind from return 11: below 0.99 x (100 + 1000 t) while 10 t < 199, i.e. up to return 19
    assert sweep.horizon_losses(thin, base, first=1) == list(range(11, 20))
    assert sweep.horizon_losses(thin, base, first=15) == [15, 16, 17, 18, 19]
    with pytest.raises(ValueError, match="different traces"):
        sweep.horizon_losses(_run([1], [1]), base)


def test_a_rule_that_switches_once_is_lru_until_its_call_then_the_tail_rule():
    """`tail@q>j`: the first j evict calls are SGLang's lru (the same calls and frees as lru's), every
    later one the tail rule; the run parts from lru's after call j."""
    cfg = _inside()
    _, lru_calls, lru_missed = _logged("lru@py", cfg)
    j = 5
    tw, calls, missed = _logged(f"tail@1.0>{j}", cfg)
    comp = tw.cache.components[FULL]
    assert len(lru_calls) > j and comp.lru_calls == j and comp.tail_calls == len(calls) - j
    assert calls[:j] == lru_calls[:j]
    _, tail_calls, tail_missed = _logged("tail@1.0", cfg)
    assert tail_missed != missed != lru_missed
    with pytest.raises(ValueError, match="count of lru calls"):
        sweep.make_twin("tail@1.0>x", cfg["capacity"], cfg["page"])
    with pytest.raises(ValueError, match="evict calls >= 0"):
        sweep.make_twin("tail@1.0>-1", cfg["capacity"], cfg["page"])


def test_horizon_check_finds_the_deadline_and_judges_the_rules_at_half_at_every_horizon():
    """On an inside config where tails win: the deadline is where lru's own misses fix a P99 above half
    the oracle's; every rule listed reaches half without a loss at the end, with the horizons it loses
    at; the rules that switch once are tried (j up to the deadline's calls) when no fixed one is safe;
    a rule named safe loses at no horizon."""
    cfg = _inside()
    res = sweep.run_config(cfg, backends=sweep.ORACLE_RULES)
    rule, gain = sweep.oracle(res)
    assert gain >= 0.10, rule
    h = sweep.horizon_check(cfg, res, gain, grid=4)
    base = res["lru"]
    assert h["target"] == pytest.approx(base["p99"] * (1 - gain / 2))
    assert h["deadline"] == sweep.lru_deadline(base["missed"], h["target"])
    assert 0 < h["calls"] <= base["calls"]
    assert rule in h["fixed"]
    fixed_safe = [r for r, lost in h["fixed"].items() if not lost]
    assert bool(h["switch"]) <= (not fixed_safe)
    names = [r for r in (*h["fixed"], *h["switch"]) if r not in res]
    runs = {**res, **(sweep.run_config(cfg, backends=tuple(names)) if names else {})}
    for r, lost in (*h["fixed"].items(), *h["switch"].items()):
        assert runs[r]["p99"] <= h["target"] and not sweep.loses(runs[r], base), r
        assert lost == sweep.horizon_losses(runs[r], base), r
    for r in h["switch"]:
        share, after = r[len("tail@"):].split(">")
        assert float(share) in sweep.ORACLE_SHARES and 0 < int(after) <= h["calls"]
    assert h["safe"] is None or not (h["fixed"].get(h["safe"]) or h["switch"].get(h["safe"]))
    assert h["safe"] is not None or all(h["fixed"].values()) and all(h["switch"].values())


def test_one_non_lru_call_is_lru_on_every_other_call():
    """`tail@q>j+1`: the (j+1)-th evict call is the tail rule's, every other one SGLang's lru; the
    calls before it are lru's own, and `single_calls` spreads such runs over lru's calls."""
    cfg = _inside()
    _, lru_calls, lru_missed = _logged("lru@py", cfg)
    j = 4
    tw, calls, missed = _logged(f"tail@1.0>{j}+1", cfg)
    comp = tw.cache.components[FULL]
    assert comp.tail_calls == 1 and comp.lru_calls == len(calls) - 1
    assert calls[:j] == lru_calls[:j] and missed != lru_missed
    base = sweep.run_config(cfg, backends=("lru",))["lru"]
    runs = sweep.single_calls(cfg, base, shares=(0.5,), k=3)
    n = base["calls"]
    assert sorted(runs) == sorted({f"tail@0.5>{j}+1" for j in (0, (n - 1) // 2, n - 1)})
    assert all(r["tail_calls"] == 1 for r in runs.values())
    assert sweep.single_calls(cfg, base, k=n + 1) == {}
    with pytest.raises(ValueError, match="count of calls of the share"):
        sweep.make_twin("tail@1.0>2+x", cfg["capacity"], cfg["page"])
    with pytest.raises(ValueError, match="span must be"):
        sweep.make_twin("tail@1.0>2+0", cfg["capacity"], cfg["page"])


def test_same_shape_is_the_nearest_pool_of_the_same_workload_page_and_regime():
    cfg = {"name": "agentic n=16 s=0.75", "page": 16, "regime": "inside", "m": 13.6}
    others = [{"name": "agentic n=16 s=0.75 seed 7", "page": 16, "regime": "inside", "m": m} for m in (11.9, 12.0)]
    others += [{"name": "agentic n=16 s=0.75 seed 7", "page": 1, "regime": "inside", "m": 13.6},
               {"name": "agentic n=16 s=0.75 seed 7", "page": 16, "regime": "above", "m": 13.6},
               {"name": "agentic n=16 s=0.9 seed 7", "page": 16, "regime": "inside", "m": 13.6}]
    assert sweep.same_shape(cfg, others)["m"] == 12.0
    assert sweep.same_shape(cfg, others[2:]) is None
    real = sweep.sweep_configs(small=True)
    assert sweep.same_shape(real[0], sweep.sweep_configs(small=True, seed=3))["name"].startswith(real[0]["name"])
