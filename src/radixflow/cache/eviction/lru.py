"""`lru`: the least recently used node first; a hit refreshes the whole matched path."""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from radixflow.cache.eviction.view import IndexInternals
from radixflow.cache.node import Node


@dataclass
class LRU:
    """Least recently used node first; a hit refreshes the whole path (what radix caches do today)."""

    name: str = "lru"

    def evict_pages(self, index: IndexInternals, need: int) -> int:
        freed = 0
        # Evictability is tested as leaves come off the heap (eviction does not change it for others).
        heap = [(n.last_access, _order(n), n) for n in index._leaves]
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
    return (n.namespace, n.depth, n.key, id(n))  # the whole key: leaves often share their first tokens
