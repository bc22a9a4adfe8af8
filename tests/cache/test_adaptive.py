"""`adaptive` on our own cache (cache/eviction/adaptive.py): the duel's lru calls are lru's decisions,
its tail calls cut the cold share, and the scheduler runs it."""

from __future__ import annotations

import copy
import random

import pytest

from radixflow.cache.eviction import LRU, get_eviction
from radixflow.cache.eviction.adaptive import Adaptive
from radixflow.cache.eviction.duel import DuelRule, FixedRule
from radixflow.cache.pool import IdPool
from radixflow.cache.radix import RadixIndex, chain_hashes

BS = 4


class Scripted(DuelRule):
    """The duel fed as usual, its answer per call scripted (a seeded mix of lru and tail shares)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.rng = random.Random(seed)

    def decide(self):
        self.mode = self.rng.choice((None, None, 0.25, 0.5))
        return self.mode


def _tree(index: RadixIndex) -> list:
    return sorted((n.namespace, n.depth, n.key) for n in index._iter_nodes())


def replay(index: RadixIndex, seed: int, requests: int = 300, on_evict=None) -> None:
    """Agents behind a shared prompt returning with a longer history, as a scheduler would run them:
    match, the hit locked, room made, the sequence inserted, the request's end told to the index."""
    rng = random.Random(seed)
    prompt = [7] * (3 * BS)
    hist = {a: prompt + [1000 * (a + 1) + i for i in range(BS * rng.randint(1, 4))] for a in range(12)}
    for now in range(1, requests + 1):
        a = rng.randrange(12)
        toks = hist[a] = hist[a] + [1000 * (a + 1) + len(hist[a]) + i for i in range(BS * rng.randint(1, 3))]
        hashes = chain_hashes("", toks, BS)
        n = len(hashes)
        m = index.match(hashes)
        index.request_begins("", toks, m)
        node = index.node_at(m) if m.depth else None
        index.lock(node, float(now))
        have = m.depth // BS
        short = n - have - index.pages.num_free
        if short > 0:
            (on_evict or RadixIndex.evict_pages)(index, short)
        if index.pages.can_allocate(n - have):
            table = index.pages_upto(m, have) + index.pages.allocate(n - have)
            end, adopted = index.insert("", toks, hashes, table, n, float(now))
            assert adopted == have
            index.publish()
            index.touch(end, float(now))
            index.request_ends(end, m.depth)
        index.unlock(node)
        index.check_integrity()


@pytest.mark.parametrize("seed", range(4))
def test_adaptive_makes_lrus_decisions_call_for_call_where_its_duel_says_lru(seed):
    """Every evict call the duel answers with lru frees what `LRU` frees on a copy of the same tree and
    leaves the same tree; the tail calls between them change the trees both see."""
    rule = Scripted(seed)
    index = RadixIndex(BS, IdPool(60, "KV page"), IdPool(0, "state slot"), Adaptive(rule=rule))
    policy = index.eviction
    checked = []

    def on_evict(idx, need):
        twin = copy.deepcopy(idx)
        want = LRU().evict_pages(twin, need)
        calls = policy.lru_calls
        got = idx.evict_pages(need)
        if policy.lru_calls > calls:  # the duel said lru
            assert got == want and _tree(idx) == _tree(twin)
            checked.append(need)

    replay(index, seed, on_evict=on_evict)
    assert len(checked) > 5 and policy.tail_calls > 5


def test_adaptive_under_a_duel_that_always_says_lru_is_lru():
    """With the duel's answer lru on every call (fewer returns than its warm-up), a whole replay
    leaves the tree lru leaves, call for call."""
    a = RadixIndex(BS, IdPool(60, "KV page"), IdPool(0, "state slot"), "adaptive")
    b = RadixIndex(BS, IdPool(60, "KV page"), IdPool(0, "state slot"), "lru")
    for idx in (a, b):
        replay(idx, 5, requests=60)
    assert a.eviction.tail_calls == 0 and a.eviction.lru_calls > 0
    assert _tree(a) == _tree(b) and a.evicted_pages == b.evicted_pages


def test_adaptive_is_named_and_observes():
    pol = get_eviction("adaptive")
    assert isinstance(pol, Adaptive) and pol.observes
    with pytest.raises(ValueError, match="adaptive:3"):
        get_eviction("adaptive:3")


def test_water_level_of_a_shadow_is_the_deepest_that_frees_the_need():
    """`duel._level` (sorted ends and starts merged) against its definition, level by level: the deepest L
    at which cutting every chain to max(L, its start) frees at least `need` tokens, 0 when none does."""
    from radixflow.cache.eviction.duel import _level

    def freed(level, start, kept):
        return sum(max(0, start[k] + kept[k] - max(level, start[k])) for k in start)

    rng = random.Random(3)
    for _ in range(3000):
        keys = list(range(rng.randint(0, 9)))
        start = {k: rng.choice([0, 16, rng.randint(0, 120)]) for k in keys}
        kept = {k: rng.choice([16, rng.randint(1, 150)]) for k in keys}
        need = rng.randint(1, 700)
        top = max((start[k] + kept[k] for k in keys), default=0)
        want = next((lv for lv in range(top, 0, -1) if freed(lv, start, kept) >= need), 0)
        assert _level(keys, start, kept, need) == want, (start, kept, need)


def test_a_trajectory_keys_tokens_are_equal_exactly_when_the_tokens_are():
    """`duel.token_tag` packs the key's tokens (a bytes object keeps its hash, a 64-int tuple is hashed at
    every lookup): the same tokens give the same key from a list, a tuple or an array (SGLang's token ids),
    other tokens another key, and a token outside int64 falls back to the tuple (no key merges two)."""
    from array import array

    from radixflow.cache.eviction.duel import token_tag

    toks = [5, 0, 1 << 40, 7, 2**63 - 1]
    assert token_tag(toks) == token_tag(tuple(toks)) == token_tag(array("q", toks))
    assert hash(token_tag(toks)) == hash(token_tag(tuple(toks)))
    assert token_tag(toks) != token_tag(toks[:-1]) and token_tag(toks) != token_tag([5, 0, 1 << 40, 7, 2**63 - 2])
    assert token_tag([0]) != token_tag([0, 0]) and token_tag([]) == token_tag(())
    big = [1, 2**64]
    assert token_tag(big) == (1, 2**64) and token_tag(big) != token_tag([1, 0])
    rule = DuelRule()  # one history under two spellings of its tokens is one trajectory to the duel
    rule.observe(("", 0, token_tag(toks)), 0, 100, 0, 10**6)
    rule.observe(("", 0, token_tag(tuple(toks))), 0, 132, 100, 10**6)
    assert rule.returns == 1 and len(rule.seen) == 1


@pytest.mark.parametrize("after,span,want", [
    (0, None, [0.5] * 6),  # the share on every call (the oracle's fixed rules)
    (2, None, [None, None, 0.5, 0.5, 0.5, 0.5]),  # switches once, after two lru calls
    (2, 1, [None, None, 0.5, None, None, None]),  # one non-lru call, the third
    (0, 2, [0.5, 0.5, None, None, None, None]),
])
def test_fixed_rule_holds_its_share_on_the_calls_it_names(after, span, want):
    rule = FixedRule(0.5, after, span)
    got = [rule.decide() for _ in want]
    assert got == want and rule.mode == want[-1]


def test_fixed_rule_rejects_negative_and_empty_spans():
    with pytest.raises(ValueError, match="after must be"):
        FixedRule(0.5, -1)
    with pytest.raises(ValueError, match="span must be"):
        FixedRule(0.5, 0, 0)
