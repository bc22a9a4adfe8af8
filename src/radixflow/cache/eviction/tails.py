"""The tail policies: `rr-tail` (one tail chunk from each idle trajectory in turn) and `level-tail`
(each chunk from the deepest idle trajectory: water-filling).

A policy's choice is written once, as its `cuts`: a generator of (leaf, target depth) that is sent
back what each cut freed. `page_walk` takes each cut one victim at a time (`cut_victims`); a tree
that removes a whole cut at once drives `cuts` itself (SGLang's batched calls). Over a view without a
change feed a lap sorts the leaves (`_ring`) and a pick takes the deepest; over one with a feed
(SGLang's) the same laps and picks come from the orders kept across calls (`kept.py`), which the
tree may feed between calls (`enter_changes`)."""

from __future__ import annotations

import bisect
from collections.abc import Generator
from dataclasses import dataclass, field

from radixflow.cache.eviction.kept import DeepestFirst, Rotation
from radixflow.cache.eviction.lru import LRU
from radixflow.cache.eviction.view import IndexInternals, IndexView, TreeView, cut_to, drive
from radixflow.cache.node import Node


@dataclass
class RoundRobinTail:
    """Cuts one tail chunk from each idle trajectory in turn (RR-Evict)."""

    chunk_pages: int = 4
    name: str = "rr-tail"
    _page_cursor: tuple | None = field(default=None, repr=False)
    _snap_cursor: tuple | None = field(default=None, repr=False)
    _rotation: Rotation = field(default_factory=Rotation, repr=False)  # read over views with a change feed only

    def __post_init__(self) -> None:
        if self.chunk_pages < 1:
            raise ValueError(f"rr-tail chunk must be >= 1 page, got {self.chunk_pages}")

    def evict_pages(self, index: IndexInternals, need: int) -> int:
        view = IndexView(index)
        return drive(self.page_walk(view, need), view.remove)

    def page_walk(self, view: TreeView, need: int, chunk_pages: int | None = None):
        """Yields the victims of `cuts` until `need` is freed (sent back per victim)."""
        yield from cut_victims(view, self.cuts(view, need, chunk_pages))

    def cuts(self, view: TreeView, need: int, chunk_pages: int | None = None, cut=None) -> Cuts:
        """The rotation's cuts until `need` is freed: each idle trajectory in turn, from just after
        the one cut last, loses its last `chunk_pages` pages (`chunk_pages`: this call's chunk where
        it differs from the policy's, the SGLang backends' batched calls). `cut(leaf, target) -> freed`:
        each cut made by that call instead of yielded (a tree that removes a whole cut at once: the
        same cuts without a generator switch each; the generator then ends at its first `next`)."""
        span = (self.chunk_pages if chunk_pages is None else chunk_pages) * view.unit
        changes = view.changes()
        if changes is not None:
            rot = self._rotation
            rot.enter(view, changes, self._page_cursor)
        freed = 0
        while freed < need:
            progressed = False
            lap = rot.lap(view) if changes is not None else _live(view, self._ring(view, self._page_cursor))
            try:
                for key, leaf in lap:
                    self._page_cursor = key  # before the cut: a driver may stop the walk inside it
                    d = view.depth(leaf)
                    target = d - span if d > span else 0
                    got = cut(leaf, target) if cut is not None else (yield leaf, target)
                    progressed |= got > 0
                    freed += got
                    if freed >= need:
                        break
            finally:
                if changes is not None:  # what the lap changed enters now, as `_ring` sees it at the next
                    rot.close_lap(view, self._page_cursor)
            if not progressed:
                break

    def enter_changes(self, view: TreeView, changes) -> None:
        """Enters what changed into the kept order now (a tree feeding it between calls)."""
        rot = self._rotation
        rot.enter(view, changes, self._page_cursor)
        rot.compact()

    def forget_orders(self) -> None:
        """The kept order starts afresh (its feed restarts with every leaf); the cursor stays."""
        self._rotation = Rotation()

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

    _deepest: DeepestFirst = field(default_factory=DeepestFirst, repr=False)  # read over views with a change feed only

    def cuts(self, view: TreeView, need: int, chunk_pages: int | None = None, cut=None) -> Cuts:
        """The deepest idle trajectory (then the largest key, then the first in leaf order) loses
        its last chunk, again until `need` is freed (`cut`: as `RoundRobinTail.cuts`)."""
        span = (self.chunk_pages if chunk_pages is None else chunk_pages) * view.unit
        changes = view.changes()
        order = self._deepest if changes is not None else None
        freed = 0
        while freed < need:
            if order is not None:
                order.enter(view, view.changes() if changes is None else changes)
                changes = None  # what this cut changes is drained at the next pick (or the next call)
                pick = order.deepest(view)
            else:
                pick = self._deepest_leaf(view)
            if pick is None:
                break
            d = view.depth(pick)
            target = d - span if d > span else 0
            got = cut(pick, target) if cut is not None else (yield pick, target)
            if not got:
                break
            freed += got

    @staticmethod
    def _deepest_leaf(view: TreeView):
        leaves = view.leaves()
        if not leaves:
            return None
        deepest = max(view.depth(n) for n in leaves)  # then the largest trajectory key among those
        tied = [n for n in leaves if view.depth(n) == deepest]
        return tied[0] if len(tied) == 1 else max(tied, key=view.trajectory_key)

    def enter_changes(self, view: TreeView, changes) -> None:
        order = self._deepest
        order.enter(view, changes)
        order.compact()

    def forget_orders(self) -> None:
        self._deepest = DeepestFirst()


def _live(view: TreeView, ring):
    """The (key, leaf) of `ring` that are still evictable leaves of `view` when their turn comes
    (a lap's cuts change the tree as it goes)."""
    for key, leaf in ring:
        if view.evictable_leaf(leaf):
            yield key, leaf


Cuts = Generator[tuple, int, None]  # (leaf, target depth) per cut; sent back what the cut freed


def cut_victims(view: TreeView, cuts: Cuts):
    """The victims of `cuts`, each cut taken one victim at a time (`cut_to`), what each victim
    freed sent back per victim and the cut's total to `cuts`."""
    try:
        cut = next(cuts)
        while True:
            got = 0
            for victim in cut_to(view, *cut):
                got += yield victim
            cut = cuts.send(got)
    except StopIteration:
        return
    finally:
        cuts.close()
