"""Ghost entries: a bounded memory of what eviction took from the prefix index (ARC's ghost lists).

The index forgets an evicted page or snapshot; the ghosts remember its chain hash (and, for a
snapshot, its depth) for a while, so that a later miss on that path is counted as "evicted" rather
than "no shared prefix" or "checkpoint missing" (SPEC §14). They hold no memory of the cache pools.
"""

from __future__ import annotations

from collections import OrderedDict


class Ghosts:
    def __init__(self, capacity: int = 1 << 18) -> None:
        if capacity < 1:
            raise ValueError(f"ghost capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._pages: OrderedDict[int, None] = OrderedDict()  # chain hash of an evicted page
        self._snaps: OrderedDict[tuple, None] = OrderedDict()  # (anchor, depth, tail hash)
        self._by_anchor: dict[object, set[tuple[int, int]]] = {}

    def add_pages(self, hashes) -> None:
        for h in hashes:
            self._put(self._pages, h)

    def add_snapshot(self, anchor, depth: int, tail: tuple[int, ...]) -> None:
        """`anchor`: the chain hash of the last whole page at or above `depth` (or a root key)."""
        key = (anchor, depth, hash(tail))
        self._by_anchor.setdefault(anchor, set()).add((depth, key[2]))
        old = self._put(self._snaps, key)
        if old is not None:
            entries = self._by_anchor.get(old[0])
            if entries is not None:
                entries.discard((old[1], old[2]))
                if not entries:
                    del self._by_anchor[old[0]]

    def snapshots_at(self, anchor) -> set[tuple[int, int]]:
        """(depth, tail hash) of the evicted snapshots on the page after `anchor`."""
        return self._by_anchor.get(anchor, set())

    def page(self, h: int) -> bool:
        return h in self._pages

    def __len__(self) -> int:
        return len(self._pages) + len(self._snaps)

    def _put(self, table: OrderedDict, key):
        """Adds `key` as the newest entry; returns the oldest one if it had to go."""
        table.pop(key, None)
        table[key] = None
        if len(table) > self.capacity:
            return table.popitem(last=False)[0]
        return None
