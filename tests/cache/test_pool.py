"""IdPool hands out ascending runs: a prompt's KV pages are consecutive in the pool (attention then reads
its context through a view, `BatchContext.context_runs`), and ids freed together come back in order."""

from __future__ import annotations

import pytest

from radixflow.cache.pool import ByteBudget, IdPool


def test_fresh_pool_hands_out_ascending_runs():
    pool = IdPool(10, "kv")
    assert pool.allocate(3) == [0, 1, 2]
    assert pool.allocate_one() == 3
    assert pool.allocate(2) == [4, 5]
    assert pool.num_free == 4 and pool.num_used == 6


def test_freed_ids_come_back_in_the_order_freed():
    pool = IdPool(8, "kv")
    first = pool.allocate(4)
    pool.allocate(2)
    pool.free(first)
    assert pool.allocate(4) == first
    pool.free([5, 4])
    assert pool.allocate(2) == [5, 4]          # the order they were freed in, not re-sorted
    pool.free(x for x in (0, 1))               # any iterable
    assert pool.allocate_one() == 0 and pool.allocate_one() == 1


def test_double_free_and_overdraw_are_refused():
    pool = IdPool(4, "slots", unit_bytes=10, budget=ByteBudget(30))
    ids = pool.allocate(3)
    with pytest.raises(MemoryError, match="asked for 1"):
        pool.allocate(1)                        # the byte budget, not the ids, runs out
    pool.free(ids[:1])
    with pytest.raises(AssertionError, match="double free"):
        pool.free(ids[:1])
    assert sorted(pool.free_ids()) == [0, 3]
