"""`flop-aware[:W]`: prefill FLOPs a victim's reuse would save per byte it holds, blended with recency
(Marconi's idea), for KV leaves and snapshots alike."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from radixflow.cache.eviction.view import IndexInternals, IndexView, TreeView, drive
from radixflow.cache.node import Node, Snapshot


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
                elif not view.has_children(victim) and view.evictable_leaf(victim):
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
    def efficiency(self, view: TreeView, leaf) -> float:
        """A full-attention leaf's value per byte: the prefill FLOPs of its own tokens (every page a
        resume point) over the bytes of its pages. The one leaf-value function of a full-attention
        tree (the ranking here, SGLang's kept `GreedyDual`)."""
        c = self.costs
        return c.prefill_flops(view.start(leaf), view.depth(leaf)) / max(view.num_pages(leaf) * c.page_bytes, 1e-9)

    def _full_leaf_values(self, view: TreeView, leaves: list) -> list[tuple]:
        """(leaf, `efficiency`, last access) of leaves of a full-attention tree; through the view's
        memo where it keeps one (`memo_value`: the values across walks)."""
        last_access = view.last_access
        memo = getattr(view, "memo_value", None)
        if memo is None:
            eff = self.efficiency
            return [(leaf, eff(view, leaf), last_access(leaf)) for leaf in leaves]
        eff = self.efficiency
        return [(leaf, memo(leaf, eff), last_access(leaf)) for leaf in leaves]

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
        if not view.hybrid:
            return self.efficiency(view, leaf), view.last_access(leaf)
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
