"""Invariants of the scheduler's memory, as code: every page and slot is free, cached or held by exactly
one running branch, the byte budget adds up, and lock counts match what branches hold."""

from __future__ import annotations

from typing import Protocol

from radixflow.cache.pool import IdPool
from radixflow.cache.radix import RadixIndex
from radixflow.core.branch import Branch


class SchedulerMemory(Protocol):
    """What the checks read: the Scheduler passes itself in (this module sits below it)."""

    index: RadixIndex
    pages: IdPool
    slots: IdPool
    block_size: int
    running: list[Branch]
    waiting: list[Branch]
    held: list[Branch]


def check_scheduler(s: SchedulerMemory) -> None:
    """Raises AssertionError if free + cached + in use != total for pages or slots, or locks drift."""
    tree_pages, snap_slots = s.index.check_integrity()
    private: set[int] = set()
    slots: set[int] = set()
    locks = 0
    snap_locks = 0
    for b in s.running:
        tr = b.sched
        assert not (tr.private & private), f"{b.key}: private page shared"
        private |= tr.private
        assert tr.private <= set(tr.page_table), f"{b.key}: private page outside its page table"
        assert len(tr.page_table) * s.block_size >= b.num_computed_tokens
        for slot in (tr.working, tr.rolling):
            if slot is not None:
                assert slot not in slots and slot not in snap_slots, f"{b.key}: slot {slot} used twice"
                slots.add(slot)
        locks += tr.node is not None
        snap_locks += tr.read_snapshot is not None
        snap_locks += getattr(tr, "partial_tail", None) is not None  # vllm-align: its own partial tail
    for b in s.waiting + s.held:
        tr = b.sched
        assert not tr.private and tr.node is None and tr.working is None, f"{b.key}: waiting but holds memory"
    assert not (private & tree_pages), "a private page is also in the tree"
    assert len(private) + len(tree_pages) + s.pages.num_free == s.pages.capacity, (
        f"page leak: private {len(private)} + cached {len(tree_pages)} + free {s.pages.num_free} "
        f"!= {s.pages.capacity}")
    assert len(slots) + len(snap_slots) + s.slots.num_free == s.slots.capacity, "slot leak"
    budget = s.pages.budget
    if budget is not None:
        used = s.pages.num_used * s.pages.unit_bytes + s.slots.num_used * s.slots.unit_bytes
        assert budget.used == used <= budget.total, f"byte budget drift: {budget.used} != {used}"
    top = sum(n.lock_ref for r in s.index._roots.values() for n in r.children.values())
    assert top == locks, f"lock drift: tree says {top}, branches hold {locks}"
    held_snap = sum(n.snapshot.lock for n in s.index._snap_nodes) + sum(t.lock for t in s.index._tails)
    assert held_snap == snap_locks, "snapshot lock drift"


def holds_nothing(s: SchedulerMemory) -> bool:
    """True when no branch holds pages, slots or locks (only the cache itself remains)."""
    pages, slots = s.index.check_integrity()
    return (len(pages) + s.pages.num_free == s.pages.capacity
            and len(slots) + s.slots.num_free == s.slots.capacity
            and all(n.lock_ref == 0 for n in s.index._iter_nodes()))
