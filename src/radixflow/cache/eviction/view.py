"""What an eviction walk reads of a tree, and the one cut every policy makes.

`TreeView` is what a page walk reads of a tree (nodes are opaque to it) plus a `split`; `IndexView`
is it over our `RadixIndex` (`IndexInternals` names what a policy may touch of the index, so this
package needs nothing from `cache.radix`), and `integrations/sglang` wraps SGLang's tree with the
same protocol. A walk is a generator that yields one victim (a leaf, a `Trim` of one, or a tail
snapshot) at a time and is sent back what removing it freed (`drive`), so the tree that owns the
nodes does the removal. `cut_to` is the cut: a trajectory shortened to a depth, one leaf at a time.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

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

    def evictable_leaf(self, node) -> bool: ...  # `is_leaf` and `evictable`, in one call (the kept orders' check)

    def live_leaf(self, node) -> bool: ...  # an evictable leaf the tree lists as one

    def has_children(self, node) -> bool: ...

    def children(self, node): ...

    def num_children(self, node) -> int: ...

    def tokens(self, node): ...  # the node's own tokens (its key)

    def namespace(self, node) -> str: ...

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

    def evictable_leaf(self, node: Node) -> bool:
        return node in self.index._leaves and self.index._evictable(node)

    live_leaf = evictable_leaf  # (the index lists every leaf it has)

    @staticmethod
    def has_children(node: Node) -> bool:
        return bool(node.children)

    @staticmethod
    def children(node: Node):
        return node.children.values()

    @staticmethod
    def num_children(node: Node) -> int:
        return len(node.children)

    @staticmethod
    def tokens(node: Node) -> tuple:
        return node.key

    @staticmethod
    def namespace(node: Node) -> str:
        return node.namespace

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

    def trajectory_key(self, leaf: Node) -> tuple:
        return trajectory_key(self, leaf)

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


# The trajectory key's tokens: a rotation and level-tail's ties are ordered by a chain's first
# ORDER_TOKENS (8: the orders pinned by the decision digests; 64 moves them), while the duel tells
# histories apart by their first KEY_TOKENS (64: enough to part users whose chains start inside a
# page of a shared prompt, which share far more than 8 tokens; duel.py).
ORDER_TOKENS = 8
KEY_TOKENS = 64


def chain_top(view: TreeView, node):
    """The first node of `node`'s unshared chain (where its parent has other than one child)."""
    up = view.parent(node)
    while not view.is_root(up) and view.num_children(up) == 1:
        node, up = up, view.parent(up)
    return node


def trajectory_key(view: TreeView, leaf) -> tuple:
    """A key that stays the same while a trajectory is cut: where its unshared chain starts
    (namespace, depth, the top node's first ORDER_TOKENS tokens). Built from tokens, not from
    `hash()` of strings, so the rotation is the same in every process."""
    top = chain_top(view, leaf)
    return view.namespace(top), view.start(top), tuple(view.tokens(top)[:ORDER_TOKENS])


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
