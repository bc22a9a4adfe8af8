"""flop-aware's ranking: why it cannot be kept incrementally, and the numpy ranking equals the sorts."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import radixflow.cache.eviction.flops as ev
from radixflow.cache.eviction import RANK_ARRAYS_FROM, FlopAware


def test_adding_a_leaf_reorders_two_untouched_leaves():
    # The score blends two ranks over all leaves, so a leaf entering moves the order of leaves it
    # never touched: no heap keyed by a leaf's own (value, recency) can hold the exact order, and an
    # exact kept order would re-score every leaf whose rank moved (most of them).
    rank = FlopAware(recency_weight=0.5)._ranked
    a, b, c = (("a", 1.0, 3), ("b", 2.0, 1), ("c", 1.5, 0.5))
    assert rank([a, b]) == ["b", "a"]  # equal scores (0.5): the older goes first
    assert rank([a, b, c]) == ["c", "a", "b"]  # a: 0.5, b: 0.75 (c sits between them in value)


_cand = st.tuples(st.sampled_from([0.0, 1.0, 16.0, 16.0, 17.5, 0.3, 1e9]),  # ties on purpose
                  st.one_of(st.integers(0, 40), st.sampled_from([0.5, 2.25, 7.0])))


@settings(max_examples=300, deadline=None)
@given(cands=st.lists(_cand, min_size=2, max_size=3 * RANK_ARRAYS_FROM),
       w=st.sampled_from([0.0, 0.3, 0.5, 0.7, 1.0]))
def test_numpy_ranking_is_the_sorts_order(cands, w):
    fa = FlopAware(recency_weight=w)
    cands = [(i, eff, age) for i, (eff, age) in enumerate(cands)]
    saved = ev.RANK_ARRAYS_FROM
    try:
        ev.RANK_ARRAYS_FROM = 1 << 30  # the pure-Python sorts
        want = fa._ranked(cands)
    finally:
        ev.RANK_ARRAYS_FROM = saved
    assert fa._ranked_arrays(cands) == want
    assert fa._ranked(cands) == want


@settings(max_examples=200, deadline=None)
@given(cands=st.lists(_cand, min_size=0, max_size=3 * RANK_ARRAYS_FROM), w=st.sampled_from([0.0, 0.5, 1.0]),
       data=st.data())
def test_ranking_unsorted_leaves_by_their_order_is_ranking_them_sorted(cands, w, data):
    # SGLang's view hands its leaves unsorted with their leaf order (`unordered_leaves`).
    fa = FlopAware(recency_weight=w)
    order = data.draw(st.permutations(range(0, 3 * len(cands), 3)))
    cands = [(i, eff, age) for i, (eff, age) in enumerate(cands)]
    in_order = [c for _, c in sorted(zip(order, cands))]
    want = fa._ranked(in_order) if cands else []
    assert fa._ranked_in_order(cands, list(order)) == want
