"""Eviction policies of the prefix index, chosen by name (`--eviction lru|rr-tail|level-tail|flop-aware`).

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
- `flop-aware[:W]`: prefill FLOPs a victim's reuse would save per byte it holds, blended with recency
  (weight W, default 0.5), for KV leaves and snapshots alike (Marconi's idea). The model's costs are
  passed in (`ReuseCosts`); without them tokens and units are counted.

The policies are the index's friends: they use its private helpers (`_remove_leaf`, `_split`, ...),
which keep the hash dict, the leaf set and the snapshot set consistent. The index passes itself in;
`IndexInternals` names all a policy may touch, so this module needs nothing from `cache.radix`.

The page walks of `rr-tail`, `level-tail` and `flop-aware` (the cursor, the tail chunks, the scores)
run over a `TreeView`: what the walk reads of a tree, and a `split`. A walk is a generator that
yields one victim (a leaf, or a tail snapshot) at a time and is sent back what removing it freed, so
the tree that owns the nodes does the removal: `IndexView` wraps our `RadixIndex`, and
`integrations/sglang` wraps SGLang's radix tree with the same walk.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np

from radixflow.cache.node import Node, Snapshot
from radixflow.cache.pool import IdPool


class IndexInternals(Protocol):
    """What an eviction policy reads and calls on the `RadixIndex` that passes itself in."""

    block_size: int
    slots: IdPool
    _leaves: dict[Node, None]  # unlocked or not, every node without children, in insertion order
    _snap_nodes: dict[Node, None]  # nodes holding a snapshot, least recently used first
    _tails: dict[Snapshot, None]  # tail snapshots (exact-depth checkpoints), least recently used first

    def _evictable(self, node: Node) -> bool: ...

    def _remove_leaf(self, node: Node) -> int: ...

    def _split(self, node: Node, k: int) -> Node: ...

    def _drop_snapshot(self, node: Node) -> None: ...

    def drop_tail(self, snap: Snapshot) -> None: ...


class TreeView(Protocol):
    """What a page walk reads of a tree (nodes are opaque to it) and the one change it makes itself
    (`split`); removing a victim is left to whoever drives the walk."""

    unit: int  # tokens per page: the chunk granularity
    hybrid: bool  # recurrent states: a cut ends on a node holding one
    trims: bool  # the tree shortens a leaf in place (`Trim`) instead of a `split` and a removal

    def leaves(self) -> list: ...  # evictable leaves, in a stable order

    def is_leaf(self, node) -> bool: ...  # still a leaf of the tree

    def evictable(self, node) -> bool: ...

    def has_children(self, node) -> bool: ...

    def parent(self, node): ...

    def is_root(self, node) -> bool: ...

    def depth(self, node) -> int: ...  # token depth at the node's end

    def start(self, node) -> int: ...

    def has_state(self, node) -> bool: ...  # a recurrent state (snapshot) at the node's end

    def states(self, node) -> list: ...  # the states on the node (`.depth`, `.tail`, `.last_access`)

    def num_pages(self, node) -> int: ...

    def last_access(self, node) -> float: ...

    def trajectory_key(self, leaf) -> tuple: ...

    def split(self, node, depth: int) -> None: ...  # `node` keeps [depth, end)

    def tails(self) -> list: ...  # tail snapshots (exact-depth checkpoints); [] where there are none

    def has_tail(self, snap) -> bool: ...

    def changes(self) -> list | None: ...  # leaves to (re)order since last asked; None: no feed (whole walks)

    def leaf_order(self, leaf) -> int: ...  # position in the order leaves appeared (only with a feed)


class IndexView:
    """`TreeView` over our `RadixIndex`."""

    __slots__ = ("index", "unit", "hybrid")
    trims = False

    def __init__(self, index: IndexInternals) -> None:
        self.index = index
        self.unit = index.block_size
        self.hybrid = index.slots.capacity > 0

    def leaves(self) -> list:
        ev = self.index._evictable
        return [n for n in self.index._leaves if ev(n)]

    def is_leaf(self, node: Node) -> bool:
        return node in self.index._leaves

    def evictable(self, node: Node) -> bool:
        return self.index._evictable(node)

    @staticmethod
    def has_children(node: Node) -> bool:
        return bool(node.children)

    @staticmethod
    def parent(node: Node) -> Node:
        return node.parent

    @staticmethod
    def is_root(node: Node) -> bool:
        return node.is_root

    @staticmethod
    def depth(node: Node) -> int:
        return node.depth

    @staticmethod
    def start(node: Node) -> int:
        return node.start

    @staticmethod
    def has_state(node: Node) -> bool:
        return node.snapshot is not None

    @staticmethod
    def states(node: Node) -> list:
        return [t for t in node.tails] + ([node.snapshot] if node.snapshot is not None else [])

    @staticmethod
    def num_pages(node: Node) -> int:
        return len(node.pages)

    @staticmethod
    def last_access(node: Node) -> float:
        return node.last_access

    @staticmethod
    def trajectory_key(leaf: Node) -> tuple:
        return _trajectory_key(leaf)

    def split(self, node: Node, depth: int) -> None:
        self.index._split(node, (depth - node.start) // self.unit)  # `node` keeps the tail

    def tails(self) -> list:
        return list(self.index._tails)

    def has_tail(self, snap: Snapshot) -> bool:
        return snap in self.index._tails

    @staticmethod
    def changes() -> None:
        return None  # our index's walks take the leaves whole (`_ring`, `view.leaves()`)

    def remove(self, victim) -> int:
        """Removes a victim a walk yielded: a leaf (its pages) or a tail snapshot (one page)."""
        if isinstance(victim, Snapshot):
            self.index.drop_tail(victim)
            return 1
        return self.index._remove_leaf(victim)


def drive(walk, remove) -> int:
    """Runs a page walk: each victim it yields is removed by `remove`, which returns what it freed."""
    freed = 0
    try:
        victim = next(walk)
        while True:
            got = remove(victim)
            freed += got
            victim = walk.send(got)
    except StopIteration:
        pass
    return freed


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


# ----------------------------------------------------------------------------- round-robin tail
@dataclass
class RoundRobinTail:
    """Cuts one tail chunk from each idle trajectory in turn (RR-Evict)."""

    chunk_pages: int = 4
    name: str = "rr-tail"
    _page_cursor: tuple | None = field(default=None, repr=False)
    _snap_cursor: tuple | None = field(default=None, repr=False)
    _rotation: Rotation | None = field(default=None, repr=False)  # views with a change feed only

    def __post_init__(self) -> None:
        if self.chunk_pages < 1:
            raise ValueError(f"rr-tail chunk must be >= 1 page, got {self.chunk_pages}")

    def evict_pages(self, index: IndexInternals, need: int) -> int:
        view = IndexView(index)
        return drive(self.page_walk(view, need), view.remove)

    def page_walk(self, view: TreeView, need: int, chunk_pages: int | None = None):
        """Yields the victims of the rotation until `need` is freed (sent back per victim).
        `chunk_pages`: this walk's chunk where it differs from the policy's (views with a change
        feed only: the SGLang backends' batched cuts)."""
        changes = view.changes()
        if changes is not None:
            yield from self._kept_walk(view, need, changes, chunk_pages)
            return
        freed = 0
        while freed < need:
            progressed = False
            for key, leaf in self._ring(view, self._page_cursor):
                if not view.is_leaf(leaf) or not view.evictable(leaf):
                    continue
                self._page_cursor = key  # before the cut: a driver may stop the walk inside it
                got = 0
                for victim in self._cut_steps(view, leaf):
                    got += yield victim
                progressed |= got > 0
                freed += got
                if freed >= need:
                    break
            if not progressed:
                break

    def _kept_walk(self, view: TreeView, need: int, changes: list, chunk_pages: int | None = None):
        """`page_walk` over the rotation kept across calls (`Rotation`): the same laps, in the same
        order, without sorting the leaves."""
        rot = self._rotation
        if rot is None:
            rot = self._rotation = Rotation()
        rot.enter(view, changes, self._page_cursor)
        freed = 0
        while freed < need:
            progressed = False
            try:
                for key, leaf in rot.lap():
                    if not view.is_leaf(leaf) or not view.evictable(leaf):
                        rot.drop(leaf)
                        continue
                    self._page_cursor = key  # before the cut: a driver may stop the walk inside it
                    got = 0
                    for victim in self._cut_steps(view, leaf, chunk_pages):
                        got += yield victim
                    progressed |= got > 0
                    freed += got
                    if freed >= need:
                        break
            finally:
                rot.close_lap(view, self._page_cursor)
            if not progressed:
                break

    def evict_snapshots(self, index: IndexInternals, need: int) -> int:
        dropped = 0
        while dropped < need:
            progressed = False
            for key, leaf in self._ring(IndexView(index), self._snap_cursor):
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
    def _ring(self, view, cursor: tuple | None) -> list[tuple[tuple, Node]]:
        """Evictable leaves in rotation order, starting just after the trajectory cut last."""
        items = sorted(((view.trajectory_key(n), n) for n in view.leaves()), key=lambda kn: kn[0])
        if cursor is None or not items:
            return items
        i = bisect.bisect_right([k for k, _ in items], cursor)
        return items[i:] + items[:i]

    def _cut_steps(self, view: TreeView, leaf, chunk_pages: int | None = None):
        """The last chunk of `leaf`'s trajectory, one leaf at a time (hybrid: down to a state boundary)."""
        pages = self.chunk_pages if chunk_pages is None else chunk_pages
        yield from cut_to(view, leaf, max(0, view.depth(leaf) - pages * view.unit))

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

    _deepest: DeepestFirst | None = field(default=None, repr=False)  # views with a change feed only

    def page_walk(self, view: TreeView, need: int, chunk_pages: int | None = None):
        changes = view.changes()
        if changes is not None:
            yield from self._kept_walk(view, need, changes, chunk_pages)
            return
        freed = 0
        while freed < need:
            leaves = view.leaves()
            if not leaves:
                break
            deepest = max(view.depth(n) for n in leaves)  # then the largest trajectory key among those
            tied = [n for n in leaves if view.depth(n) == deepest]
            pick = tied[0] if len(tied) == 1 else max(tied, key=view.trajectory_key)
            got = 0
            for victim in self._cut_steps(view, pick):
                got += yield victim
            if not got:
                break
            freed += got

    def _kept_walk(self, view: TreeView, need: int, changes: list, chunk_pages: int | None = None):
        """`page_walk` over the depth order kept across calls (`DeepestFirst`): the same picks."""
        order = self._deepest
        if order is None:
            order = self._deepest = DeepestFirst()
        freed = 0
        while freed < need:
            order.enter(view, view.changes() if changes is None else changes)
            changes = None  # what this cut changes is drained at the next pick (or the next call)
            pick = order.deepest(view)
            if pick is None:
                break
            got = 0
            for victim in self._cut_steps(view, pick, chunk_pages):
                got += yield victim
            if not got:
                break
            freed += got


# ----------------------------------------------------------------------------- orders kept across calls
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


def _trajectory_key(leaf: Node) -> tuple:
    """A key that stays the same while a trajectory is cut: where its unshared chain starts.

    Built from tokens, not from `hash()` of strings, so the rotation is the same in every process.
    """
    node = leaf
    while not node.parent.is_root and len(node.parent.children) == 1:
        node = node.parent
    return (node.namespace, node.start, node.key[: 8])


class Trim(NamedTuple):
    """A victim that is the end of a leaf: the tree shortens `node` in place to end at `depth` tokens
    (what a `split` and the removal of the suffix would leave, without the new node)."""

    node: object
    depth: int


def cut_to(view: TreeView, leaf, target: int):
    """Victims that shorten `leaf`'s trajectory to `target` tokens (on a hybrid tree, to the deepest
    state at or above it), one leaf at a time, splitting the last one (or, where the view `trims`,
    yielding a `Trim` of it); stops at a shared or locked node."""
    if view.hybrid:
        target = _state_at_or_above(view, leaf, target)
    node = leaf
    while view.depth(node) > target and not view.is_root(node):
        if view.has_children(node) or not view.evictable(node):
            return
        if view.start(node) >= target:
            parent = view.parent(node)
            yield node
            node = parent
            continue
        if view.trims:
            yield Trim(node, target)
            return
        view.split(node, target)  # `node` keeps the tail
        yield node
        return


def _state_at_or_above(view: TreeView, leaf, depth: int) -> int:
    """Deepest state boundary on the leaf's path at or above `depth` (0 when there is none)."""
    node = leaf
    while not view.is_root(node):
        if view.has_state(node) and view.depth(node) <= depth:
            return view.depth(node)
        node = view.parent(node)
    return 0


# ----------------------------------------------------------------------------- FLOP-aware
@dataclass
class ReuseCosts:
    """What `flop-aware` needs to know of the model, passed in (the cache imports no model spec).

    The defaults count tokens and units: without a model, a token saved is a token saved and a page
    weighs as much as a slot."""

    flops_per_token: float = 1.0  # dense prefill FLOPs per token
    flops_per_pair: float = 0.0  # attention FLOPs per (query, earlier key) pair: deep tokens cost more
    recurrent_flops_per_token: float = 0.0
    page_bytes: float = 1.0
    slot_bytes: float = 1.0

    def prefill_flops(self, start: int, end: int) -> float:
        """FLOPs to prefill positions [start, end) after `start` cached tokens."""
        n = max(0, end - start)
        pairs = n * start + n * (n + 1) / 2
        return (self.flops_per_token + self.recurrent_flops_per_token) * n + self.flops_per_pair * pairs


# flop-aware ranks this many victims or more with numpy (`FlopAware._ranked_arrays`; fewer: its
# fixed cost exceeds the sorts'). The same order either way.
RANK_ARRAYS_FROM = 48


@dataclass
class FlopAware:
    """Marconi's idea: keep what saves the most prefill FLOPs per byte, blended with recency.

    A victim's value is the prefill it would cost to lose: for a snapshot, the FLOPs from the nearest
    snapshot above it to its depth (a quarter of that when a deeper snapshot below it already serves
    its path); for a leaf of KV pages, the same for the snapshots it carries, or, on a full-attention
    cache, the FLOPs of its own tokens. A hybrid leaf without a snapshot is dead KV (nothing can resume
    inside it): value 0. Efficiency = value / bytes held; the score blends the rank of efficiency with
    the rank of recency (`recency_weight`), lowest evicted first. Tail snapshots (exact-depth
    checkpoints) compete with everything else.
    """

    recency_weight: float = 0.5
    costs: ReuseCosts = field(default_factory=ReuseCosts)
    name: str = "flop-aware"
    handles_tails: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.recency_weight <= 1.0:
            raise ValueError(f"flop-aware recency weight must be in [0, 1], got {self.recency_weight}")

    def evict_pages(self, index: IndexInternals, need: int) -> int:
        view = IndexView(index)
        return drive(self.page_walk(view, need), view.remove)

    def page_walk(self, view: TreeView, need: int):
        freed = 0
        while freed < need:
            tails = [(t, *self._snap_value(view, t)) for t in view.tails() if _droppable(t)]
            unordered = None if view.hybrid or tails else getattr(view, "unordered_leaves", None)
            if unordered is not None:  # the leaves unsorted, with their leaf order: ranked by it
                leaves, order = unordered()
                cands = self._full_leaf_values(view, leaves)
                ranked = self._ranked_in_order(cands, order)
            else:
                if view.hybrid:
                    cands = [(n, *self._leaf_value(view, n)) for n in view.leaves()]
                else:
                    cands = self._full_leaf_values(view, view.leaves())
                cands += tails
                ranked = self._ranked(cands) if cands else []
            if not cands:
                break
            progressed = False
            for victim in ranked:
                if freed >= need:
                    break
                if isinstance(victim, Snapshot):  # a tail snapshot: one page and one slot
                    if view.has_tail(victim) and _droppable(victim):
                        freed += yield victim
                        progressed = True
                elif not view.has_children(victim) and view.evictable(victim) and view.is_leaf(victim):
                    freed += yield victim
                    progressed = True
            if not progressed:
                break

    def evict_snapshots(self, index: IndexInternals, need: int) -> int:
        cands = [(n.snapshot, *self._snap_value(index, n.snapshot)) for n in index._snap_nodes
                 if _droppable(n.snapshot)]
        cands += [(t, *self._snap_value(index, t)) for t in index._tails if _droppable(t)]
        dropped = 0
        for snap in self._ranked(cands)[:need]:
            if snap.tail:
                index.drop_tail(snap)
            else:
                index._drop_snapshot(snap.node)
            dropped += 1
        return dropped

    # ------------------------------------------------------------------ helpers
    def _full_leaf_values(self, view: TreeView, leaves: list) -> list[tuple]:
        """`_leaf_value` of every leaf of a full-attention tree, inline (the same floats: the
        operations of `ReuseCosts.prefill_flops` in its order)."""
        c = self.costs
        per_token = c.flops_per_token + c.recurrent_flops_per_token
        per_pair, page_bytes = c.flops_per_pair, c.page_bytes
        depth, num_pages, last_access = view.depth, view.num_pages, view.last_access
        # A view may keep the values across walks (`value_memo`: node id -> (key object, efficiency));
        # its nodes replace `.key` whenever their span changes, so an entry holds while its key does.
        memo = getattr(view, "value_memo", None)
        out = []
        for leaf in leaves:
            if memo is not None:
                m = memo.get(leaf.id)
                if m is not None and m[0] is leaf.key:
                    out.append((leaf, m[1], last_access(leaf)))
                    continue
            end = depth(leaf)
            start = view.start(leaf)
            k = max(0, end - start)
            pairs = k * start + k * (k + 1) / 2
            held = num_pages(leaf) * page_bytes
            eff = (per_token * k + per_pair * pairs) / max(held, 1e-9)
            if memo is not None:
                memo[leaf.id] = (leaf.key, eff)
            out.append((leaf, eff, last_access(leaf)))
        return out

    def _ranked(self, cands: list[tuple]) -> list:
        """Victims, lowest blended score first. cands: (victim, efficiency, last_access)."""
        n = len(cands)
        if n == 1:
            return [cands[0][0]]
        if n >= RANK_ARRAYS_FROM:
            return self._ranked_arrays(cands)
        effs = [c[1] for c in cands]
        ages = [c[2] for c in cands]
        by_eff = sorted(range(n), key=effs.__getitem__)
        by_age = sorted(range(n), key=ages.__getitem__)
        score = [0.0] * n
        w = self.recency_weight
        for r, i in enumerate(by_eff):
            score[i] += (1 - w) * r / (n - 1)
        for r, i in enumerate(by_age):
            score[i] += w * r / (n - 1)
        # Worthless victims (dead KV) go first whatever their age; then the blended score.
        return [cands[i][0] for i in sorted(range(n), key=lambda i: (cands[i][1] > 0, score[i], cands[i][2]))]

    def _ranked_in_order(self, cands: list[tuple], order: list) -> list:
        """`_ranked` of `cands` sorted by `order` (distinct leaf orders, one per candidate), without
        sorting them first where numpy ranks: the order breaks every tie instead of the position."""
        n = len(cands)
        if n < RANK_ARRAYS_FROM:
            pos = sorted(range(n), key=order.__getitem__)
            return self._ranked([cands[i] for i in pos]) if n else []
        return self._ranked_arrays(cands, np.array(order, dtype=np.int64))

    def _ranked_arrays(self, cands: list[tuple], order=None) -> list:
        """`_ranked` in numpy, the same order: the rank sorts stable (ties by position, as `sorted`),
        the score the same float64 operations in the same order ((1 - w) * r / (n - 1), then + w * r'
        / (n - 1), onto 0.0), the final sort a stable lexsort by (value > 0, score, last access)."""
        n = len(cands)
        effs = np.array([c[1] for c in cands], dtype=np.float64)
        ages = np.array([c[2] for c in cands], dtype=np.float64)
        at = np.arange(n)
        if order is None:
            order = at  # ties by position
        by_eff = np.empty(n, dtype=np.int64)
        by_eff[np.lexsort((order, effs))] = at
        by_age = np.empty(n, dtype=np.int64)
        by_age[np.lexsort((order, ages))] = at
        w = self.recency_weight
        score = (1 - w) * by_eff / (n - 1) + w * by_age / (n - 1)
        return [cands[i][0] for i in np.lexsort((order, ages, score, effs > 0)).tolist()]

    def _leaf_value(self, view: TreeView, leaf) -> tuple[float, float]:
        c = self.costs
        held = view.num_pages(leaf) * c.page_bytes
        if not view.hybrid:  # full attention: every page is a resume point
            return c.prefill_flops(view.start(leaf), view.depth(leaf)) / max(held, 1e-9), view.last_access(leaf)
        snaps = view.states(leaf)
        if not snaps:
            return 0.0, view.last_access(leaf)  # dead KV: no state to resume from anywhere in it
        held += sum(c.slot_bytes + (c.page_bytes if s.tail else 0) for s in snaps)
        deepest = max(s.depth for s in snaps)
        value = c.prefill_flops(_state_above(view, view.parent(leaf)), deepest)
        return value / max(held, 1e-9), max(view.last_access(leaf), max(s.last_access for s in snaps))

    def _snap_value(self, index, snap) -> tuple[float, float]:
        c = self.costs
        node = snap.node
        above = node.depth if snap.tail and node.snapshot is not None else _snapshot_above(
            node if snap.tail else node.parent)
        value = c.prefill_flops(above, snap.depth)
        if _served_below(node, snap):
            value *= 0.25
        held = c.slot_bytes + (c.page_bytes if snap.tail else 0)
        return value / max(held, 1e-9), snap.last_access


def _droppable(snap) -> bool:
    return snap.published and snap.lock == 0


def _state_above(view: TreeView, node) -> int:
    """Depth of the deepest state at or above `node` (0: a cold start)."""
    while node is not None and not view.is_root(node):
        if view.has_state(node):
            return view.depth(node)
        node = view.parent(node)
    return 0


def _snapshot_above(node: Node | None) -> int:
    """Depth of the deepest snapshot at or above `node` (0: a cold start)."""
    while node is not None and not node.is_root:
        if node.snapshot is not None:
            return node.depth
        node = node.parent
    return 0


def _served_below(node: Node, snap) -> bool:
    """True when a deeper snapshot on the same path already serves what `snap` serves."""
    stack = [c for c in node.children.values() if not snap.tail or c.key[: len(snap.tail)] == snap.tail]
    if not snap.tail and any(t for t in node.tails):
        return True
    while stack:
        n = stack.pop()
        if n.snapshot is not None or n.tails:
            return True
        stack.extend(n.children.values())
    return False


# ----------------------------------------------------------------------------- registry
EVICTION_POLICIES: dict[str, type] = {"lru": LRU, "rr-tail": RoundRobinTail, "level-tail": LevelTail,
                                      "flop-aware": FlopAware}


def get_eviction(spec: str) -> EvictionPolicy:
    """A fresh policy from its name; `rr-tail:N` sets the chunk to N pages."""
    name, _, arg = spec.strip().lower().partition(":")
    cls = EVICTION_POLICIES.get(name)
    if cls is None:
        raise ValueError(f"unknown eviction policy {spec!r}; choose from: {', '.join(EVICTION_POLICIES)} "
                         f"(rr-tail:N and level-tail:N set the chunk to N pages)")
    if not arg:
        return cls()
    if cls is FlopAware:
        try:
            return FlopAware(recency_weight=float(arg))
        except ValueError as e:
            raise ValueError(f"bad eviction policy {spec!r}: flop-aware:W takes a recency weight in [0, 1] "
                             f"({e})") from None
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
