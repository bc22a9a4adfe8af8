"""`radixflow-adaptive`'s rule (integrations/sglang/adaptive.py) on its own: the shadows, the duel, the
veto, and the tail rule's cut on SGLang's tree. SGLang venv (scripts/test.sh)."""

from __future__ import annotations

import pytest
from sglang_factories import load_twins

load_twins()

from radixflow.integrations.sglang import adaptive  # noqa: E402
from radixflow.integrations.sglang.adaptive import DuelRule, Shadow, water_level  # noqa: E402


def _stream(rule, n: int, rounds: int, length: int, budget: int, grow: int = 32, active: int = 1):
    """n trajectories returning in turn (round robin: the least recent returns next, what lru loses
    whole when the budget holds fewer than n), each growing by `grow` per call; the real cache's hit
    is what rule's lru shadow would give (the cache runs lru)."""
    lens = dict.fromkeys(range(n), length)
    for _ in range(rounds):
        for t in range(n):
            key = ("", 256, (t,))
            rule.begin(key)
            hit = 256 + min(rule.lru.kept_of(key), lens[t])
            lens[t] += grow
            rule.observe(key, 256, lens[t], hit, budget)


def test_shadow_lru_loses_the_least_recent_whole_and_tails_level_the_cold():
    lru, tail = Shadow(None), Shadow(1.0)
    for s in (lru, tail):
        for t in range(4):
            s.access(("", 0, (t,)), 0, 100, None, t + 1, budget=1000)
        s.access(("", 0, (9,)), 0, 100, None, 5, budget=400)  # 500 held, 400 fit: 100 must go
    assert lru.total == tail.total == 400
    assert lru.kept_of(("", 0, (0,))) == 0 and lru.kept_of(("", 0, (1,))) == 100  # the oldest, whole
    assert [tail.kept_of(("", 0, (t,))) for t in range(4)] == [75] * 4  # levelled: 25 from each idle one
    assert tail.kept_of(("", 0, (9,))) == 100  # the one just inserted is not cut


def test_shadow_never_cuts_a_running_trajectory():
    s = Shadow(None)
    for t in range(3):
        s.access(("", 0, (t,)), 0, 100, None, t + 1, budget=1000)
    s.begin(("", 0, (0,)), 4)  # the oldest is running: lru takes the next one
    s.access(("", 0, (5,)), 0, 100, None, 5, budget=300)
    assert s.kept_of(("", 0, (0,))) == 100 and s.kept_of(("", 0, (1,))) == 0
    s.access(("", 0, (0,)), 0, 132, 100, 6, budget=400)
    assert s.hits == 100 and list(s.missed) == [32]


def test_shadow_rename_carries_a_trajectory_to_its_new_key():
    s = Shadow(None)
    s.access(("", 0, (1,)), 0, 300, None, 1, budget=1000)
    s.rename(("", 0, (1,)), ("", 100, (2,)), 100)  # 100 tokens above became shared
    assert s.kept == {("", 100, (2,)): 200} and s.total == 200


def test_shadow_lru_frees_whole_nodes_as_sglangs_lru_does():
    """A history inserted in two requests is two nodes (its first call's 100 tokens, then the 40 the
    second added): lru's shadow frees the last node whole for a 10-token need, then the first."""
    s = Shadow(None)
    s.access(("", 0, (1,)), 0, 100, None, 1, budget=1000)
    s.begin(("", 0, (1,)), 2)
    s.access(("", 0, (1,)), 0, 140, 100, 3, budget=1000)
    s.access(("", 0, (2,)), 0, 100, None, 4, budget=230)  # 240 held, 230 fit
    assert s.kept_of(("", 0, (1,))) == 100 and s.total == 200
    s.access(("", 0, (3,)), 0, 10, None, 5, budget=205)
    assert s.kept_of(("", 0, (1,))) == 0 and s.total == 110


def test_shadow_p99_is_the_metrics_percentile_over_its_window():
    from radixflow.core.metrics import percentile

    s = Shadow(None)
    s.WINDOW, s.RECENT = 50, 30
    vals = [(7 * i) % 97 for i in range(120)]
    for v in vals:
        s._count(10, v)
    assert s.p99() == percentile(vals[-50:], 0.99) and s.hit_sum == 500 and s.recent_sum == 300


def test_duel_is_lru_before_its_evidence_and_where_lru_keeps_every_history():
    rule = DuelRule()
    _stream(rule, 8, 40, 1000, budget=8 * 3000)  # room for all: nothing lost whole
    assert rule.returns > rule.MIN_RETURNS and rule.lru.whole == 0
    assert rule.decide() is None
    early = DuelRule()
    _stream(early, 8, 1, 1000, budget=6 * 1100)  # lru loses whole histories, but no return yet
    assert early.returns < early.MIN_RETURNS and early.decide() is None


def test_duel_takes_a_tail_where_lru_loses_whole_histories_and_tails_keep_the_hits():
    rule = DuelRule()
    _stream(rule, 16, 24, 1000, budget=15 * 1100)  # round robin, 15 of 16 fit: lru loses returns whole
    assert rule.lru.whole > 0.5 * rule.returns
    assert rule.decide() is not None
    best = next(s for s in rule.tails if s.q == rule.decide())
    assert best.p99() <= (1 - rule.P99_GAIN) * rule.lru.p99()
    assert best.hit_sum >= rule.lru.hit_sum * (1 - rule.STAY_SLACK)


def test_duel_returns_to_lru_at_once_when_the_tail_shadow_shows_a_hit_loss():
    rule = DuelRule()
    _stream(rule, 16, 24, 1000, budget=15 * 1100)
    q = rule.decide()
    assert q is not None
    cur = next(s for s in rule.tails if s.q == q)
    for s in rule.tails:  # every tail shadow now trails lru's hits by more than the slack
        s.hit_sum = int(rule.lru.hit_sum * (1 - 2 * rule.STAY_SLACK))
    assert cur.p99() < rule.lru.p99() and rule.duel() is None


def test_veto_reverts_to_lru_when_the_real_hits_fall_behind_the_lru_ghost():
    rule = DuelRule()
    _stream(rule, 16, 24, 1000, budget=15 * 1100)
    assert rule.decide() is not None
    for i in range(rule.VETO_MIN + 1):  # tails act, and the real cache hits far less than the ghost says
        key = ("", 256, (i % 16,))
        rule.begin(key)
        rule.observe(key, 256, rule.seen[key] + 32, 0, 15 * 1100)
    assert rule.vetoes == 1 and rule.decide() is None


def test_forced_rule_is_the_cache_built_inside_only():
    from radixflow.integrations.sglang.twins import FULL, SGLangTwin

    with adaptive.forced(0.5):
        held = SGLangTwin("radixflow-adaptive", 4096, 16)
    free = SGLangTwin("radixflow-adaptive", 4096, 16)
    assert held.cache.components[FULL].rule.decide() == 0.5
    assert isinstance(free.cache.components[FULL].rule, DuelRule) and free.cache.components[FULL].rule.decide() is None


@pytest.mark.parametrize("depths,need,unit,level", [
    ([100, 80, 60], 30, 1, 75), ([100, 80, 60], 30, 16, 64), ([100, 100], 300, 1, 0), ([64], 16, 16, 48)])
def test_water_level(depths, need, unit, level):
    assert water_level(depths, need, unit) == level
    assert sum(max(0, d - level) for d in depths) >= min(need, sum(depths))


@pytest.mark.parametrize("agents, seed", [(16, 8), (16, 9)])
def test_our_cache_runs_the_same_duel_as_the_sglang_backend_on_a_shared_trace(monkeypatch, agents, seed):
    """`radixflow simulate --eviction adaptive`'s policy (our `RadixIndex`, cache/eviction/adaptive.py)
    and SGLang's `radixflow-adaptive` on the same agentic requests, tail calls unbatched on both (the
    walk our index runs): the same duel, fed by each cache's hooks, makes the same choice (lru, or the
    tail rule's cold share) on every evict call of the trace, every tail call frees the same tokens,
    and every request finds the same hit in both caches. An lru call is each cache's own lru: SGLang's
    orders by its access counter, which SGLang's split (and so a tail cut) renews on the kept prefix
    and ours does not, so the two may take other leaves after a cut, and on some traces the duels
    part there (docs/eviction.md, "Issue #43")."""
    from radixflow.integrations.sglang import sweep
    from radixflow.integrations.sglang.twins import FULL, IndexTwin, SGLangTwin
    from radixflow.workloads.agentic import AgenticSpec, agentic_sessions

    monkeypatch.setenv("RADIXFLOW_SGLANG_CUT_AHEAD", "1")
    monkeypatch.setenv("RADIXFLOW_SGLANG_CUTS_PER_CALL", "0")
    sessions = agentic_sessions(AgenticSpec(n_agents=agents, idle_fraction=0.75, calls=8, system_len=256,
                                            context_len=512, append_len=32, output_len=8, seed=seed))
    cfg = sweep._pooled("agentic", sessions, 16, (4 + 2 * 12 / 3,), 4.0, 16)[0]
    calls: dict[str, list] = {"ours": [], "sglang": []}

    def logged(twin, rule, out):
        decide, evict = rule.decide, twin.evict

        def decided():
            out.append([decide(), rule.returns])
            return out[-1][0]

        def evicted(n):
            got = evict(n)
            out[-1] += [n, got]  # (every evict call asks the duel first)
            return got

        rule.decide, twin.evict = decided, evicted

    ours = IndexTwin("adaptive", cfg["capacity"], cfg["page"])
    logged(ours, ours.index.eviction.rule, calls["ours"])
    theirs = SGLangTwin("radixflow-adaptive", cfg["capacity"], cfg["page"])
    logged(theirs, theirs.cache.components[FULL].rule, calls["sglang"])
    ours_missed = sweep.replay(ours, sessions, 1.0)
    theirs_missed = sweep.replay(theirs, sessions, 1.0)
    tails = sum(c[0] is not None for c in calls["sglang"])
    assert tails >= 10 and len(calls["sglang"]) - tails >= 5, "the trace must hold both lru and tail calls"
    # The duel's choice and the returns it had seen, at every evict call; what a call asks and frees
    # on every tail call (the duel's own walk); every request's hit.
    assert [c[:2] for c in calls["ours"]] == [c[:2] for c in calls["sglang"]]
    assert [c for c in calls["ours"] if c[0] is not None] == [c for c in calls["sglang"] if c[0] is not None]
    assert ours_missed == theirs_missed
