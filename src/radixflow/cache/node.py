"""The prefix index's tree nodes and state snapshots: plain data, shared by the index and its eviction
policies (which get the nodes, not the index's module)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False, slots=True)
class Snapshot:
    slot: int
    depth: int
    published: bool
    producer: int | None  # uid of the branch writing it this round (None once published)
    lock: int = 0
    last_access: float = 0.0
    level: int = 0  # dependency depth of the fragment that produced it (for the lower bound)
    node: Node | None = field(default=None, repr=False, compare=False)  # the node it sits on
    tail: tuple[int, ...] = ()  # tokens past node.depth (an exact-depth checkpoint inside a page)
    tail_page: int | None = None  # KV page owned by a tail snapshot: the K/V of `tail`


@dataclass(eq=False, slots=True)
class Node:
    parent: Node | None
    namespace: str
    key: tuple[int, ...]
    pages: list[int]
    hashes: list[int]
    depth: int  # token depth at the end of this node
    children: dict[tuple[int, ...], Node] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: float = 0.0
    pending: bool = False  # pages registered this round, not yet computed
    snapshot: Snapshot | None = None
    tails: list[Snapshot] = field(default_factory=list)  # exact-depth snapshots inside the next page
    # The token sequence the key was cut from (key == origin[start:depth]), when the inserter named
    # one: a branch known equal to `origin` there needs no token-by-token collision check.
    origin: tuple[int, ...] | None = field(default=None, repr=False)

    @property
    def start(self) -> int:
        return self.depth - len(self.key)

    @property
    def is_root(self) -> bool:
        return self.parent is None

    def path(self):
        node = self
        while node is not None and not node.is_root:
            yield node
            node = node.parent
