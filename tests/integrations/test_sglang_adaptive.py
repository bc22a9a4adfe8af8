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


def test_duel_is_lru_until_the_warmup_and_where_lru_keeps_every_history():
    rule = DuelRule()
    _stream(rule, 8, 40, 1000, budget=8 * 3000)  # room for all: nothing lost whole
    assert rule.returns > rule.WARMUP and rule.lru.whole == 0
    assert rule.decide() is None
    early = DuelRule()
    _stream(early, 8, 2, 1000, budget=6 * 1100)  # lru loses whole histories, but only 8 returns
    assert early.returns < early.WARMUP and early.decide() is None


def test_duel_takes_a_tail_where_lru_loses_whole_histories_and_tails_keep_the_hits():
    rule = DuelRule()
    _stream(rule, 16, 24, 1000, budget=15 * 1100)  # round robin, 15 of 16 fit: lru loses returns whole
    assert rule.lru.whole > 0.5 * rule.returns
    assert rule.decide() is not None
    best = next(s for s in rule.tails if s.q == rule.decide())
    assert best.p99() <= 0.9 * rule.lru.p99() and best.hits >= rule.lru.hits * (1 - rule.HIT_SLACK)


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
