"""The tail policies: `rr-tail` (one tail chunk from each idle trajectory in turn) and `level-tail`
(each chunk from the deepest idle trajectory: water-filling). Over a view without a change feed a
walk sorts the leaves per lap / pick; over one with a feed (SGLang's) the same laps and picks come
from the orders kept across calls (`kept.py`)."""

from __future__ import annotations

import bisect
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
