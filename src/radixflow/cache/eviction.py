"""Eviction policies of the prefix index, chosen by name (`--eviction lru|rr-tail`).

A policy frees memory from the two pools of the hybrid cache: KV pages (`evict_pages`) and state
snapshot slots (`evict_snapshots`). It only ever removes tails: an unlocked leaf, or the last pages
of one, so the tree stays prefix-closed and nothing a running branch holds is touched.

- `lru`: node-level LRU; a hit refreshes the whole matched path (`RadixIndex.touch`). Every node of
  an agent's history then carries the time of its last call ("recency synchronisation"), so LRU
  evicts whole agents one after the other: a returning history is kept whole or lost whole.
- `rr-tail`: round-robin tail chunks. The demand is spread over the idle trajectories (unlocked
  leaves) in a fixed rotation; each turn cuts one chunk (`chunk_pages` pages) from the end of one
  trajectory, so every one keeps a contiguous reusable prefix. On a hybrid cache a cut ends on a
  state snapshot (see docs/eviction.md): KV past the last snapshot cannot be resumed from anyway.
- `level-tail`: the same cuts, always from the deepest idle trajectory (water-filling), so every
  idle history is levelled to one depth whatever its idle time.

The policies are the index's friends: they use its private helpers (`_remove_leaf`, `_split`, ...),
which keep the hash dict, the leaf set and the snapshot set consistent. The index passes itself in;
`IndexInternals` names all a policy may touch, so this module needs nothing from `cache.radix`.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, field
from typing import Protocol

from radixflow.cache.node import Node
from radixflow.cache.pool import IdPool


class IndexInternals(Protocol):
    """What an eviction policy reads and calls on the `RadixIndex` that passes itself in."""

    block_size: int
    slots: IdPool
    _leaves: set[Node]  # unlocked or not, every node without children
    _snap_nodes: dict[Node, None]  # nodes holding a snapshot, least recently used first

    def _evictable(self, node: Node) -> bool: ...

    def _remove_leaf(self, node: Node) -> int: ...

    def _split(self, node: Node, k: int) -> Node: ...

    def _drop_snapshot(self, node: Node) -> None: ...


class EvictionPolicy(Protocol):
    name: str

    def evict_pages(self, index: IndexInternals, need: int) -> int:
        """Frees at least `need` KV pages if it can; returns the number freed."""
        ...

    def evict_snapshots(self, index: IndexInternals, need: int) -> int:
        """Drops at least `need` snapshots if it can (their KV may stay); returns the number dropped."""
        ...


# ----------------------------------------------------------------------------- LRU
@dataclass
class LRU:
    """Least recently used node first; a hit refreshes the whole path (what radix caches do today)."""

    name: str = "lru"

    def evict_pages(self, index: IndexInternals, need: int) -> int:
        freed = 0
        heap = [(n.last_access, _order(n), n) for n in index._leaves if index._evictable(n)]
        heapq.heapify(heap)
        while freed < need and heap:
            _, _, node = heapq.heappop(heap)
            if node.children or not index._evictable(node):
                continue
            parent = node.parent
            freed += index._remove_leaf(node)
            if parent is not None and not parent.is_root and not parent.children and index._evictable(parent):
                heapq.heappush(heap, (parent.last_access, _order(parent), parent))
        return freed

    def evict_snapshots(self, index: IndexInternals, need: int) -> int:
        # The index keeps its snapshot nodes in LRU order: take the oldest droppable ones.
        victims = []
        for n in index._snap_nodes:
            if n.snapshot.published and n.snapshot.lock == 0:
                victims.append(n)
                if len(victims) >= need:
                    break
        for node in victims:
            index._drop_snapshot(node)
        return len(victims)


def _order(n: Node) -> tuple:
    """Tie-break between equally recent nodes, the same in every process (unlike `id`)."""
    return (n.namespace, n.depth, n.key[:8], id(n))


# ----------------------------------------------------------------------------- round-robin tail
@dataclass
class RoundRobinTail:
    """Cuts one tail chunk from each idle trajectory in turn (RR-Evict)."""

    chunk_pages: int = 4
    name: str = "rr-tail"
    _page_cursor: tuple | None = field(default=None, repr=False)
    _snap_cursor: tuple | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.chunk_pages < 1:
            raise ValueError(f"rr-tail chunk must be >= 1 page, got {self.chunk_pages}")

    def evict_pages(self, index: IndexInternals, need: int) -> int:
        freed = 0
        while freed < need:
            progressed = False
            for key, leaf in self._ring(index, self._page_cursor):
                if leaf not in index._leaves or not index._evictable(leaf):
                    continue
                got = self._cut(index, leaf)
                self._page_cursor = key
                progressed |= got > 0
                freed += got
                if freed >= need:
                    break
            if not progressed:
                break
        return freed

    def evict_snapshots(self, index: IndexInternals, need: int) -> int:
        dropped = 0
        while dropped < need:
            progressed = False
            for key, leaf in self._ring(index, self._snap_cursor):
                node = self._deepest_droppable_snapshot(leaf)
                self._snap_cursor = key
                if node is None:
                    continue
                index._drop_snapshot(node)
                dropped += 1
                progressed = True
                if dropped >= need:
                    break
            if not progressed:
                break
        if dropped < need:  # what is left sits on shared or locked paths: oldest first
            dropped += LRU().evict_snapshots(index, need - dropped)
        return dropped

    # ------------------------------------------------------------------ helpers
    def _ring(self, index: IndexInternals, cursor: tuple | None) -> list[tuple[tuple, Node]]:
        """Evictable leaves in rotation order, starting just after the trajectory cut last."""
        items = sorted(((_trajectory_key(n), n) for n in index._leaves if index._evictable(n)),
                       key=lambda kn: kn[0])
        if cursor is None or not items:
            return items
        i = bisect.bisect_right([k for k, _ in items], cursor)
        return items[i:] + items[:i]

    def _cut(self, index: IndexInternals, leaf: Node) -> int:
        """Removes the last chunk of `leaf`'s trajectory (hybrid: down to a snapshot boundary)."""
        bs = index.block_size
        target = max(0, leaf.depth - self.chunk_pages * bs)
        if index.slots.capacity > 0:
            target = _snapshot_at_or_above(leaf, target)
        freed = 0
        node = leaf
        while node.depth > target and not node.is_root:
            if node.children or not index._evictable(node):
                break
            if node.start >= target:
                parent = node.parent
                freed += index._remove_leaf(node)
                node = parent
                continue
            index._split(node, (target - node.start) // bs)  # `node` keeps the tail
            freed += index._remove_leaf(node)
            break
        return freed

    @staticmethod
    def _deepest_droppable_snapshot(leaf: Node) -> Node | None:
        """Deepest unlocked published snapshot on the leaf's own (unshared, unlocked) tail."""
        node = leaf
        while not node.is_root and node.lock_ref == 0:
            snap = node.snapshot
            if snap is not None and snap.published and snap.lock == 0:
                return node
            if node.parent.is_root or len(node.parent.children) != 1:
                return None
            node = node.parent
        return None


@dataclass
class LevelTail(RoundRobinTail):
    """Water-filling variant: each chunk comes from the deepest idle trajectory, so idle histories are
    levelled to one depth instead of being cut in proportion to how long they have been idle."""

    name: str = "level-tail"

    def evict_pages(self, index: IndexInternals, need: int) -> int:
        freed = 0
        while freed < need:
            leaves = [n for n in index._leaves if index._evictable(n)]
            if not leaves:
                break
            got = self._cut(index, max(leaves, key=lambda n: (n.depth, _trajectory_key(n))))
            if not got:
                break
            freed += got
        return freed


def _trajectory_key(leaf: Node) -> tuple:
    """A key that stays the same while a trajectory is cut: where its unshared chain starts.

    Built from tokens, not from `hash()` of strings, so the rotation is the same in every process.
    """
    node = leaf
    while not node.parent.is_root and len(node.parent.children) == 1:
        node = node.parent
    return (node.namespace, node.start, node.key[: 8])


def _snapshot_at_or_above(leaf: Node, depth: int) -> int:
    """Deepest snapshot boundary on the leaf's path at or above `depth` (0 when there is none)."""
    node = leaf
    while not node.is_root:
        if node.snapshot is not None and node.depth <= depth:
            return node.depth
        node = node.parent
    return 0


# ----------------------------------------------------------------------------- registry
EVICTION_POLICIES: dict[str, type] = {"lru": LRU, "rr-tail": RoundRobinTail, "level-tail": LevelTail}


def get_eviction(spec: str) -> EvictionPolicy:
    """A fresh policy from its name; `rr-tail:N` sets the chunk to N pages."""
    name, _, arg = spec.strip().lower().partition(":")
    cls = EVICTION_POLICIES.get(name)
    if cls is None:
        raise ValueError(f"unknown eviction policy {spec!r}; choose from: {', '.join(EVICTION_POLICIES)} "
                         f"(rr-tail:N and level-tail:N set the chunk to N pages)")
    if not arg:
        return cls()
    if not issubclass(cls, RoundRobinTail) or not arg.isdigit():
        raise ValueError(f"bad eviction policy {spec!r}: only the tail policies take a chunk size, "
                         f"as rr-tail:N pages")
    return cls(chunk_pages=int(arg))


def parse_evictions(spec: str) -> list[str]:
    """A comma list of policy names, each checked."""
    names = [s for s in (x.strip() for x in spec.split(",")) if s]
    if not names:
        raise ValueError("empty eviction policy list")
    for n in names:
        get_eviction(n)
    return names
