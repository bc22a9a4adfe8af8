"""Orders kept across evict calls, for a view that reports which leaves changed (`TreeView.changes`):
rr-tail's rotation (`Rotation`), level-tail's deepest pick (`DeepestFirst`), flop-aware's GreedyDual
priorities (`GreedyDual`), lru's recency (`RecencyHeap`) and the adaptive's cold share (`ColdOrder`).
Each gives what a walk over the whole tree, sorted afresh, would give
(tests/integrations/test_sglang_decisions.py). The heaps are lazy (`Lazy`): a moved leaf gets a new
entry and its old one goes stale in place, skipped where it is met and dropped by `compact`.
"""

from __future__ import annotations

import bisect
import heapq

from radixflow.cache.eviction.view import TreeView


class Lazy:
    """The one rule of the lazy heaps: `entry[item]` is an item's live entry (a tuple ending in the
    item); any other entry of it still in a heap is stale, skipped when met (`is_live`). Once the
    heaps hold more than 1.5x the live entries plus 32, `compact` drops the stale ones (a view that
    enters changes between walks re-enters leaves many times before a walk pops them)."""

    __slots__ = ("entry", "_uid")

    def __init__(self) -> None:
        self.entry: dict = {}
        self._uid = 0

    def is_live(self, e) -> bool:
        return self.entry.get(e[-1]) is e

    def drop(self, item) -> None:
        """`item` loses its live entry (what it left in a heap goes stale)."""
        self.entry.pop(item, None)

    def heaps(self) -> tuple:
        raise NotImplementedError

    def compact(self) -> None:
        live = self.entry
        if sum(map(len, self.heaps())) <= 3 * len(live) // 2 + 32:
            return
        for heap in self.heaps():
            heap[:] = [e for e in heap if live.get(e[-1]) is e]
            heapq.heapify(heap)


class LazyHeap(Lazy):
    """One lazy heap."""

    __slots__ = ("heap",)

    def __init__(self) -> None:
        super().__init__()
        self.heap: list = []

    def heaps(self) -> tuple:
        return (self.heap,)


class Rotation(Lazy):
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

    __slots__ = ("ahead", "behind", "ties", "at", "visited")

    def __init__(self) -> None:
        super().__init__()
        self.ahead: list = []
        self.behind: list = []
        self.ties: list = []
        self.at = None  # the cursor key the heaps are split at (None: every entry is ahead)
        self.visited: list = []

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
            if view.evictable_leaf(leaf):
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

    def laps(self) -> tuple:
        """The heaps in lap order."""
        return self.ahead, self.behind, self.ties

    heaps = laps

    def lap(self, view: TreeView):
        """(key, leaf) of every live entry, from just after the cursor, once around; a leaf that is
        no longer an evictable leaf of `view` when its turn comes loses its entry instead."""
        self.visited = visited = []
        entry = self.entry
        evictable_leaf = view.evictable_leaf
        for heap in self.laps():
            while heap:
                e = heapq.heappop(heap)
                leaf = e[3]
                if entry.get(leaf) is not e:
                    continue  # superseded or dropped
                if not evictable_leaf(leaf):
                    del entry[leaf]
                    continue
                visited.append(e)
                yield e[0], leaf

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
        self.enter(view, view.changes() or (), cursor)

    def compact(self) -> None:
        if not self.visited:  # not inside a lap
            super().compact()

    def order(self, view: TreeView) -> list:
        """(key, leaf) of the next lap, in order, less what it would skip (tests)."""
        entry = self.entry
        return [(e[0], e[3]) for heap in self.laps() for e in sorted(heap)
                if entry.get(e[3]) is e and view.evictable_leaf(e[3])]


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


class DeepestFirst(LazyHeap):
    """level-tail's pick kept across calls: a heap of (-depth, reversed key, leaf order) over the
    evictable leaves, for a view that reports which leaves changed (a cut leaf's depth, a new leaf, a
    moved key). `deepest` is `max` by depth, then by key, the first in leaf order among equals."""

    __slots__ = ()

    def enter(self, view: TreeView, leaves) -> None:
        entry = self.entry
        for leaf in leaves:
            if view.evictable_leaf(leaf):
                depth, key, order = -view.depth(leaf), view.trajectory_key(leaf), view.leaf_order(leaf)
                old = entry.get(leaf)
                if old is not None and old[0] == depth and old[2] == order and old[1].key == key:
                    continue  # its live entry already sits in place
                self._uid += 1
                e = entry[leaf] = (depth, _Rev(key), order, self._uid, leaf)
                heapq.heappush(self.heap, e)
            else:
                entry.pop(leaf, None)

    def deepest(self, view: TreeView):
        heap, entry = self.heap, self.entry
        while heap:
            e = heap[0]
            leaf = e[4]
            if entry.get(leaf) is e and view.evictable_leaf(leaf):
                return leaf
            heapq.heappop(heap)
            if entry.get(leaf) is e:
                del entry[leaf]
        return None


class GreedyDual(LazyHeap):
    """flop-aware's order kept across calls (FULL-only device trees): GreedyDual-Size with
    frequency-free values (Cao & Irani), a heap keyed by one number per leaf, so a call costs
    O((changes + victims) log L), not a ranking of every leaf.

    A leaf's priority is H = level(at its last access) + k * efficiency, with efficiency its
    prefill FLOPs per byte (`FlopAware`'s value of a full-attention leaf) and k = (1 - w) / w for
    the recency weight w (w = 1: recency alone; w = 0: efficiency alone). The lowest H goes first
    (worthless leaves before all; ties: the least recent, then leaf order); the `level` rises to
    each victim's H, so a leaf not accessed for a while falls below newer ones by how much it
    saves: recency and FLOPs per byte blended in one key that never moves while the leaf is
    idle. The level in force at an access is looked up from its history (one entry per evict
    call that raised it), so a parent a deletion exposes keeps the priority of its last access.
    Entries are entered from the component's change feed (joined the evictable set, split,
    re-stamped) and checked when popped (superseded, locked, no longer a leaf: skipped)."""

    __slots__ = ("level", "clocks", "levels", "k")

    def __init__(self, recency_weight: float) -> None:
        super().__init__()
        self.level = 0.0
        self.clocks: list[int] = []  # the access clock at which the level rose to `levels[i]`
        self.levels: list[float] = []
        self.k = (1 - recency_weight) / recency_weight if recency_weight > 0 else None

    def level_at(self, access: int) -> float:
        """The level in force when an access stamped `access` happened."""
        i = bisect.bisect_left(self.clocks, access) - 1
        return self.levels[i] if i >= 0 else 0.0

    def priority(self, access: int, eff: float) -> float:
        return eff if self.k is None else self.level_at(access) + self.k * eff

    def enter(self, view, leaves, eff) -> None:
        live_leaf = view.live_leaf
        for leaf in leaves:
            if live_leaf(leaf):
                acc = view.last_access(leaf)
                e_ = eff(leaf)
                self._uid += 1
                e = (e_ > 0, self.priority(acc, e_), acc, view.leaf_order(leaf), self._uid, leaf)
                self.entry[leaf] = e
                heapq.heappush(self.heap, e)
            else:
                self.entry.pop(leaf, None)

    def pop(self, view):
        """The live entry of least priority, off the heap (None: no evictable leaf)."""
        heap, entry = self.heap, self.entry
        while heap:
            e = heapq.heappop(heap)
            leaf = e[5]
            if entry.get(leaf) is not e:
                continue
            del entry[leaf]
            if view.live_leaf(leaf):
                return e
        return None

    def raise_level(self, h: float, clock: int) -> None:
        if h <= self.level:
            return
        self.level = h
        if self.clocks and self.clocks[-1] == clock:
            self.levels[-1] = h
        else:
            self.clocks.append(clock)
            self.levels.append(h)

    def clear(self) -> None:
        """Drops the entries (the feed re-enters every leaf), keeps the level's history."""
        self.heap = []
        self.entry = {}

    def order(self, view) -> list:
        """The leaves in the order the walk would take them now, less what it would skip (tests)."""
        return [e[5] for e in sorted(self.heap) if self.is_live(e) and view.live_leaf(e[5])]


class RecencyHeap(LazyHeap):
    """lru's order kept across calls: an entry (priority when entered, leaf) per evictable leaf. A
    priority only grows (SGLang's access counter), so an entry's is at most its leaf's now: one popped
    with an old priority goes back with the new one, and the first popped whose priority is its
    leaf's now is the least recent leaf, as a heap of every leaf built afresh gives it."""

    __slots__ = ()

    def enter(self, leaf, priority) -> None:
        e = self.entry[leaf] = (priority, leaf)
        heapq.heappush(self.heap, e)

    def least(self, members, priority):
        """The least recent leaf of `members`, its entry taken out (None: none)."""
        heap, live = self.heap, self.entry
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            e = pop(heap)
            x = e[1]
            if live.get(x) is not e:
                continue
            if x not in members:
                del live[x]
                continue
            t = priority(x)
            if e[0] != t:
                e = live[x] = (t, x)
                push(heap, e)
                continue
            del live[x]
            return x
        return None


class ColdOrder:
    """The tail rule's cold leaves kept across calls: every evictable leaf's recency key (our stamp,
    then leaf order) in a sorted list, the `q` share with the lowest keys (`cold`, the same count as
    `leaves[: max(1, int(len(leaves) * q + 0.999))]`) in a second sorted list by (-depth, recency),
    so that a pass takes its deepest cold leaves in the order a sort of the cold share by depth
    gives (stable: the least recent first among equal depths) without sorting it. Fed by the
    component's change feed (leaves joining and leaving SGLang's set, trims, re-stamps): a change
    costs O(log L) plus the leaves it moves across the cold boundary (and a memmove of the lists);
    a pass reads its t leaves off the front of `deep`: nothing changes the lists during a pass (the
    feed enters at the next pass's sync)."""

    __slots__ = ("rec", "node_at", "key_of", "q", "bound", "cold", "deep", "_uid")

    def __init__(self) -> None:
        self.rec: list[tuple] = []  # (stamp, leaf order) of every evictable leaf, sorted
        self.node_at: dict[tuple, object] = {}
        self.key_of: dict = {}  # leaf -> its key in `rec`
        self.q: float | None = None
        self.bound: tuple | None = None  # the key of the coldest share's warmest leaf
        self.cold: dict = {}  # cold leaf -> its entry in `deep`
        self.deep: list = []  # (-depth, stamp, leaf order, uid, leaf) of the cold leaves, sorted
        self._uid = 0

    def reset(self) -> None:
        self.__init__()

    def count(self) -> int:
        n = len(self.rec)
        return max(1, int(n * self.q + 0.999)) if n else 0

    def update(self, view, nodes, members) -> None:
        """Re-keys `nodes` (present in `members`, the tree's evictable set: entered at their key
        (recency, leaf order); else taken out), then moves the cold boundary."""
        rec, node_at, key_of = self.rec, self.node_at, self.key_of
        last_access, leaf_order = view.last_access, view.leaf_order
        for n in nodes:
            old = key_of.pop(n, None)
            if old is not None:
                del rec[bisect.bisect_left(rec, old)]
                del node_at[old]
            if n in members:
                key = (last_access(n), leaf_order(n))
                bisect.insort(rec, key)
                node_at[key] = n
                key_of[n] = key
        if self.q is not None:
            self._move_bound(view, nodes)

    def set_share(self, view, q: float) -> None:
        if q == self.q:
            return
        self.q, self.bound, self.cold, self.deep = q, None, {}, []
        self._move_bound(view, ())

    def _move_bound(self, view, changed) -> None:
        rec, node_at = self.rec, self.node_at
        k = self.count()
        new = rec[k - 1] if k else None
        old = self.bound
        if new is None:
            self.cold, self.deep = {}, []
        elif old is None:
            for key in rec[:k]:
                self._join(view, node_at[key])
        elif new > old:
            for key in rec[bisect.bisect_right(rec, old):k]:
                self._join(view, node_at[key])
        elif new < old:
            for key in rec[k:bisect.bisect_right(rec, old)]:
                self._leave(node_at[key])
        self.bound = new
        key_of = self.key_of
        for n in changed:
            key = key_of.get(n)
            if key is not None and key <= new:
                self._join(view, n)
            else:
                self._leave(n)

    def _join(self, view, n) -> None:
        self._leave(n)
        self._uid += 1
        key = self.key_of[n]
        e = (-view.depth(n), key[0], key[1], self._uid, n)
        self.cold[n] = e
        bisect.insort(self.deep, e)

    def _leave(self, n) -> None:
        e = self.cold.pop(n, None)
        if e is not None:
            deep = self.deep
            del deep[bisect.bisect_left(deep, e)]

    def order(self) -> list:
        """The cold leaves in the order a pass takes them (tests)."""
        return [e[4] for e in self.deep]
