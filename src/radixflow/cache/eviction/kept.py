"""Orders kept across evict calls, for a view that reports which leaves changed (`TreeView.changes`):
rr-tail's rotation (`Rotation`) and level-tail's deepest pick (`DeepestFirst`). Each gives what a
walk over the whole tree, sorted afresh, would give (tests/integrations/test_sglang_decisions.py)."""

from __future__ import annotations

import heapq

from radixflow.cache.eviction.view import TreeView


class Rotation:
    """rr-tail's circle kept across calls, for a view that reports which leaves changed.

    `_ring` sorts the evictable leaves by (trajectory key, leaf order) at the start of each lap and
    walks them from just after the cursor key, wrapping once. Here the live entries (key, leaf order,
    leaf) sit in three heaps split at the cursor key `at`: `ahead` (key > at), `behind` (key < at) and
    `ties` (key == at). A lap pops `ahead`, then `behind`, then `ties`: the same order, as
    `bisect_right` puts the cursor's ties last. What a lap changes (a cut leaf, a leaf it exposes, a key
    it moves) is only entered when the lap closes, as `_ring` only sees it at the next lap; the visited
    entries go back split at the new cursor. A lap costs O(v log L) for v entries visited, not
    O(L log L); a tie group (many leaves under one key: sessions that open alike) moves between heaps
    once when the cursor reaches or leaves its key, not at every lap that stays on it."""

    __slots__ = ("ahead", "behind", "ties", "at", "entry", "visited", "_uid", "_phase")

    def __init__(self) -> None:
        self.ahead: list = []
        self.behind: list = []
        self.ties: list = []
        self.at = None  # the cursor key the heaps are split at (None: every entry is ahead)
        self.entry: dict = {}  # leaf -> its live entry (an older one in a heap is stale)
        self.visited: list = []
        self._uid = 0
        self._phase = 0  # 0: popping `ahead`, 1: `behind`, 2: `ties`

    def __len__(self) -> int:
        """Entries in the heaps, superseded ones included."""
        return len(self.ahead) + len(self.behind) + len(self.ties)

    def _heap_for(self, key) -> list:
        at = self.at
        if at is None or key > at:
            return self.ahead
        return self.behind if key < at else self.ties

    def enter(self, view: TreeView, leaves, cursor) -> None:
        """(Re-)enters `leaves` (evictable leaves get an entry at their current key, others lose it)."""
        if cursor != self.at:
            self._split(cursor)
        entry = self.entry
        for leaf in leaves:
            if view.is_leaf(leaf) and view.evictable(leaf):
                key, order = view.trajectory_key(leaf), view.leaf_order(leaf)
                old = entry.get(leaf)
                if old is not None and old[1] == order and old[0] == key:
                    continue  # its live entry already sits in place (no stale copy to pop later)
                self._uid += 1
                e = entry[leaf] = (key, order, self._uid, leaf)
                heapq.heappush(self._heap_for(key), e)
            else:
                entry.pop(leaf, None)

    def _split(self, cursor) -> None:
        """Every live entry re-split at `cursor` (a cursor moved outside a lap: not on the walks' paths)."""
        live = list(self.entry.values())
        self.at = cursor
        self.ahead, self.behind, self.ties = [], [], []
        for e in live:
            self._heap_for(e[0]).append(e)
        for heap in (self.ahead, self.behind, self.ties):
            heapq.heapify(heap)

    def drop(self, leaf) -> None:
        self.entry.pop(leaf, None)

    def laps(self) -> tuple:
        """The heaps in lap order."""
        return self.ahead, self.behind, self.ties

    def lap(self):
        """(key, leaf) of every live entry, from just after the cursor, once around."""
        self.visited = []
        entry = self.entry
        for phase, heap in enumerate(self.laps()):
            self._phase = phase
            while heap:
                e = heapq.heappop(heap)
                if entry.get(e[3]) is not e:
                    continue  # superseded or dropped
                self.visited.append(e)
                yield e[0], e[3]

    def close_lap(self, view: TreeView, cursor) -> None:
        """Splits what is left and what was visited at the new cursor, then enters what changed.
        A lap pops each heap in order, so what is left of the heap the last cut came from starts
        at the new cursor's key: only that key's ties move, and the old ties join a side whole."""
        old = self.at
        if cursor != old:
            ahead, behind, ties = self.ahead, self.behind, self.ties
            new_ties: list = []
            if old is None or cursor > old:  # the cut was ahead: old ties and behind lie below
                low = _merge(behind, ties)
                while ahead and ahead[0][0] <= cursor:
                    e = heapq.heappop(ahead)
                    heapq.heappush(new_ties if e[0] == cursor else low, e)
                self.ahead, self.behind = ahead, low
            else:  # the cut was behind, after `ahead` ran out: what is left of behind lies above
                low: list = []
                while behind and behind[0][0] <= cursor:
                    e = heapq.heappop(behind)
                    heapq.heappush(new_ties if e[0] == cursor else low, e)
                self.ahead, self.behind = _merge(_merge(ahead, ties), behind), low
            self.ties = new_ties
            self.at = cursor
        entry = self.entry
        for e in self.visited:
            if entry.get(e[3]) is e:
                heapq.heappush(self._heap_for(e[0]), e)
        self.visited = []
        self._phase = 0
        self.enter(view, view.changes() or (), cursor)

    def compact(self) -> None:
        """Drops superseded entries from the heaps once they outnumber the live ones (a view that
        enters changes between walks re-enters leaves many times before a lap pops them)."""
        live = self.entry
        if self.visited or len(self) <= 3 * len(live) // 2 + 32:
            return
        for heap in self.laps():
            heap[:] = [e for e in heap if live.get(e[3]) is e]
            heapq.heapify(heap)

    def order(self, view: TreeView) -> list:
        """(key, leaf) of the next lap, in order, less what it would skip (tests)."""
        entry = self.entry
        return [(e[0], e[3]) for heap in self.laps() for e in sorted(heap)
                if entry.get(e[3]) is e and view.is_leaf(e[3]) and view.evictable(e[3])]


def _merge(a: list, b: list) -> list:
    """One heap of the heaps `a` and `b` (the smaller pushed into the larger; either may be reused)."""
    if len(a) < len(b):
        a, b = b, a
    for e in b:
        heapq.heappush(a, e)
    return a


class _Rev:
    """Reverses a key's order in a min-heap (level-tail takes the largest key among the deepest)."""

    __slots__ = ("key",)

    def __init__(self, key) -> None:
        self.key = key

    def __lt__(self, other: _Rev) -> bool:
        return other.key < self.key

    def __eq__(self, other) -> bool:
        return self.key == other.key


class DeepestFirst:
    """level-tail's pick kept across calls: a heap of (-depth, reversed key, leaf order) over the
    evictable leaves, for a view that reports which leaves changed (a cut leaf's depth, a new leaf, a
    moved key). `deepest` is `max` by depth, then by key, the first in leaf order among equals."""

    __slots__ = ("heap", "entry", "_uid")

    def __init__(self) -> None:
        self.heap: list = []
        self.entry: dict = {}
        self._uid = 0

    def enter(self, view: TreeView, leaves) -> None:
        entry = self.entry
        for leaf in leaves:
            if view.is_leaf(leaf) and view.evictable(leaf):
                depth, key, order = -view.depth(leaf), view.trajectory_key(leaf), view.leaf_order(leaf)
                old = entry.get(leaf)
                if old is not None and old[0] == depth and old[2] == order and old[1].key == key:
                    continue  # its live entry already sits in place
                self._uid += 1
                e = entry[leaf] = (depth, _Rev(key), order, self._uid, leaf)
                heapq.heappush(self.heap, e)
            else:
                entry.pop(leaf, None)

    def compact(self) -> None:
        """Drops superseded entries once they outnumber the live ones (see `Rotation.compact`)."""
        live = self.entry
        if len(self.heap) > 3 * len(live) // 2 + 32:
            self.heap[:] = [e for e in self.heap if live.get(e[4]) is e]
            heapq.heapify(self.heap)

    def deepest(self, view: TreeView):
        heap, entry = self.heap, self.entry
        while heap:
            e = heap[0]
            leaf = e[4]
            if entry.get(leaf) is e and view.is_leaf(leaf) and view.evictable(leaf):
                return leaf
            heapq.heappop(heap)
            if entry.get(leaf) is e:
                del entry[leaf]
        return None
