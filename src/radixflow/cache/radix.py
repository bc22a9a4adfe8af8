"""The prefix index: a radix tree over (namespace, tokens) holding KV pages and state snapshots.

Keys are stored in whole pages (`block_size` tokens). Every page also has a chain hash (namespace,
all tokens up to the end of the page), kept in a dict so that the longest match is a binary search
over a branch's precomputed hash chain: the tree is prefix-closed (only tails are ever removed), so
"page i is cached" is monotone in i.

A node owns the pages of its key. A snapshot (every linear layer's recurrent + conv state) sits at
the END of a node; `published` says whether it is in the published set C_t. Pages and snapshots
registered during a round are `pending` until `publish()` runs after that round's execution.
Invariant (checked by `check_integrity`): a snapshot only sits on a node whose whole KV path exists.

Exact-depth checkpoints (`--checkpoints branch`, SPEC §14) may end inside a page: such a snapshot is
a *tail* on the node ending at the last whole page before its depth; it carries the tail's tokens
and owns one KV page holding their K/V (a copy, so the resume is exact). A consumer copies that page
into a private one and resumes at the exact token. Tails go with their node and are evicted like
every snapshot.
"""

from __future__ import annotations

from typing import NamedTuple

from radixflow.cache.eviction import EvictionPolicy, get_eviction
from radixflow.cache.ghosts import Ghosts
from radixflow.cache.node import Node, Snapshot
from radixflow.cache.pool import IdPool

__all__ = ["Boundary", "Match", "Node", "RadixIndex", "Snapshot", "chain_hashes"]


class Match(NamedTuple):
    """Result of a lookup: identity length and the node holding its last page."""

    depth: int  # ĥ, in tokens (a multiple of block_size)
    node: Node | None  # node containing page depth/bs - 1 (None when depth == 0)


class Boundary(NamedTuple):
    """Deepest state boundary usable for a match (hybrid models)."""

    ready: int  # h: deepest published boundary <= ĥ (0 = cold start)
    ready_snapshot: Snapshot | None
    blocking: Snapshot | None  # deepest boundary is pending: written this round by `blocking.producer`


def chain_hashes(namespace: str, tokens, block_size: int, prev: list[int] | None = None) -> list[int]:
    """Chain hashes for every full page of `tokens`, extending `prev` (the hashes already known)."""
    out = list(prev) if prev else []
    h = out[-1] if out else hash(("radixflow", namespace, block_size))
    for i in range(len(out) * block_size, len(tokens) - block_size + 1, block_size):
        h = hash((h, tuple(tokens[i : i + block_size])))
        out.append(h)
    return out


class RadixIndex:
    """Radix tree with paged KV and snapshot slots; the scheduler's single entry into cache memory."""

    def __init__(self, block_size: int, pages: IdPool, slots: IdPool,
                 eviction: str | EvictionPolicy = "lru") -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.eviction = get_eviction(eviction) if isinstance(eviction, str) else eviction
        self._observes = getattr(self.eviction, "observes", False)  # `adaptive`: fed the requests
        self.block_size = block_size
        self.pages = pages
        self.slots = slots
        self._roots: dict[str, Node] = {}
        self._by_hash: dict[int, Node] = {}
        # Every node without children, in insertion order (a dict: eviction policies that iterate it
        # break ties the same way in every process, never by memory address).
        self._leaves: dict[Node, None] = {}
        self._snap_nodes: dict[Node, None] = {}  # in least-recently-used order (oldest first)
        self._pending_nodes: list[Node] = []
        self._pending_snaps: list[Snapshot] = []
        self._tails: dict[Snapshot, None] = {}  # tail snapshots in least-recently-used order
        self.ghosts = Ghosts()  # what eviction took, so a later miss can be blamed on it
        self.evicted_pages = 0
        self.evicted_snapshots = 0
        self.num_locked_pages = 0  # pages in nodes with lock_ref > 0 (kept on lock/unlock)

    # ------------------------------------------------------------------ public API
    def match(self, hashes: list[int], max_pages: int | None = None, known: int = 0) -> Match:
        """Longest cached prefix (pending pages included) among the first `max_pages` pages.
        `known`: pages the caller expects in the tree (checked by one probe; the search starts there)."""
        n = len(hashes) if max_pages is None else min(max_pages, len(hashes))
        by_hash = self._by_hash
        lo, hi = 0, n  # answer in [lo, hi]: number of matched pages
        if 0 < known <= n and hashes[known - 1] in by_hash:  # prefix-closed: pages [0, known) are in
            lo = known
        if lo < hi:  # the two common answers in one probe each: nothing more, or everything
            if hashes[lo] not in by_hash:
                hi = lo
            elif hashes[hi - 1] in by_hash:
                lo = hi
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if hashes[mid - 1] in by_hash:
                lo = mid
            else:
                hi = mid - 1
        if lo == 0:
            return Match(0, None)
        return Match(lo * self.block_size, by_hash[hashes[lo - 1]])

    def match_tokens(self, namespace: str, tokens, max_pages: int) -> tuple[Match, list[int]]:
        """Longest cached prefix (pending pages included) found by walking the tree with the tokens
        themselves, with the chain hashes of the matched pages read from the nodes: a shared prefix is
        compared once, never re-hashed. The match is token-exact (no collision can fool it)."""
        bs = self.block_size
        node = self._roots.get(namespace)
        hashes: list[int] = []
        depth, last, limit = 0, None, max_pages * bs
        while node is not None and depth < limit:
            child = node.children.get(tuple(tokens[depth : depth + bs]))
            if child is None:
                break
            end = min(child.depth, limit)
            key = child.key
            if tuple(tokens[depth:end]) == (key if end == child.depth else key[: end - depth]):
                hashes.extend(child.hashes[: (end - depth) // bs])
                depth, last, node = end, child, child
                if end == child.depth:
                    continue
                break
            lo, hi = 1, (end - depth) // bs - 1  # pages matched in this node: the first one is known
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if tuple(tokens[depth : depth + mid * bs]) == key[: mid * bs]:
                    lo = mid
                else:
                    hi = mid - 1
            hashes.extend(child.hashes[:lo])
            depth, last = depth + lo * bs, child
            break
        return Match(depth, last), hashes

    def has_page(self, chain_hash: int) -> bool:
        """True when a page with this chain hash is in the tree (pending pages included)."""
        return chain_hash in self._by_hash

    @property
    def page_hashes(self):
        """Read-only view of the chain hashes in the tree, for `in` tests in the scheduler's hot loop."""
        return self._by_hash.keys()

    @property
    def num_evictable_pages(self) -> int:
        """Tree pages no branch holds (what eviction may reclaim; pending pages are held by their producer)."""
        return len(self._by_hash) - self.num_locked_pages

    @property
    def num_evictable_snapshots(self) -> int:
        """Published snapshots (eviction may drop them unless a row restoring from one locks it)."""
        return len(self._snap_nodes) - len(self._pending_snaps)

    @staticmethod
    def unlocked_pages_on_path(node: Node | None) -> int:
        """Pages on the path to `node` that no branch holds yet (a lock on `node` takes them out of
        the evictable set)."""
        return sum(len(n.pages) for n in node.path() if n.lock_ref == 0) if node is not None else 0

    def boundary(self, m: Match, limit: int | None = None) -> Boundary:
        """Deepest snapshot boundary on the matched path at or below min(ĥ, limit)."""
        depth = m.depth if limit is None else min(m.depth, limit)
        node = m.node
        while node is not None and node.parent is not None:
            snap = node.snapshot
            if snap is not None and node.depth <= depth:
                if snap.published:
                    return Boundary(snap.depth, snap, None)
                return Boundary(self._published_below(node.parent, depth), None, snap)
            node = node.parent
        return Boundary(0, None, None)

    def ready_boundary(self, m: Match, limit: int | None = None) -> tuple[int, Snapshot | None]:
        """Deepest PUBLISHED boundary (what a branch could resume from, ignoring pending ones)."""
        depth = m.depth if limit is None else min(m.depth, limit)
        node = m.node
        while node is not None and not node.is_root:
            snap = node.snapshot
            if snap is not None and snap.published and node.depth <= depth:
                return snap.depth, snap
            node = node.parent
        return 0, None

    def tokens_match(self, m: Match, tokens, start: int = 0, kin: tuple | None = None, kin_len: int = 0) -> bool:
        """True when the matched path's tokens in [start, ĥ) equal `tokens` there (guards against a
        chain-hash collision, which the hash lookup alone cannot see). A node whose key was cut from
        `tokens` itself, or from `kin` within its first `kin_len` tokens (the caller knows `tokens`
        equals `kin` there), is equal without a compare."""
        node = m.node
        while node is not None and node.parent is not None and node.depth > start:
            first = node.depth - len(node.key)
            lo, hi = max(first, start), min(node.depth, m.depth)
            origin = node.origin
            if hi > lo and (origin is None or not (origin is tokens or (origin is kin and hi <= kin_len))):
                key = node.key if lo == first and hi == node.depth else node.key[lo - first : hi - first]
                if tuple(tokens[lo:hi]) != key:
                    return False
            node = node.parent
        return True

    def pages_upto(self, m: Match, num_pages: int) -> list[int]:
        """Page ids of the first `num_pages` pages of the matched path."""
        assert num_pages * self.block_size <= m.depth
        if num_pages == 0:
            return []
        node = m.node
        while node.start >= num_pages * self.block_size:
            node = node.parent
        chunks = [node.pages[: num_pages - node.start // self.block_size]]
        node = node.parent
        while node is not None and node.parent is not None:  # up to the root (inlined `is_root`)
            chunks.append(node.pages)
            node = node.parent
        out: list[int] = []
        for chunk in reversed(chunks):
            out += chunk
        return out

    def insert(self, namespace: str, tokens, hashes: list[int], page_table: list[int], num_pages: int,
               now: float, cuts: range | None = None, origin: tuple | None = None,
               known: int = 0) -> tuple[Node, int]:
        """Registers the first `num_pages` pages of a branch (pending until `publish`).

        Returns the node holding page num_pages-1 and the index of the first page the tree adopted
        (pages before it already existed in the tree and stay the caller's private copies).
        `cuts`: page counts where the caller will split the new pages at once (its snapshot depths);
        the new pages are laid down as a chain of nodes ending there, the tree `node_at` would leave.
        `origin`: a token tuple equal to `tokens` over its length (the branch's prompt); nodes within it
        remember it (`Node.origin`, read by `tokens_match`). `known`: `match`'s hint.
        """
        assert num_pages >= 1 and len(page_table) >= num_pages and len(hashes) >= num_pages
        m = self.match(hashes, num_pages, known)
        have = m.depth // self.block_size
        if have == num_pages:
            return m.node, num_pages
        bs = self.block_size
        parent = self._node_ending_at(m) if have else self._root(namespace)
        self._leaves.pop(parent, None)
        lo = have
        for hi in (*(c for c in cuts if have < c < num_pages), num_pages) if cuts else (num_pages,):
            key = tuple(tokens[lo * bs : hi * bs])
            node = Node(parent, namespace, key, page_table[lo:hi], hashes[lo:hi], hi * bs,
                        lock_ref=0, last_access=now, pending=True,
                        origin=origin if origin is not None and hi * bs <= len(origin) else None)
            parent.children[key[:bs]] = node
            self._by_hash.update(dict.fromkeys(node.hashes, node))
            self._pending_nodes.append(node)
            parent, lo = node, hi
        self._leaves[node] = None
        return node, have

    def node_at(self, m: Match) -> Node:
        """The node ending exactly at m.depth (splitting one if needed)."""
        return self._node_ending_at(m)

    def node_after(self, hashes: list[int], num_pages: int) -> Node:
        """`node_at` for a path whose first `num_pages` pages are known to be in the tree (the caller
        registered them): no lookup of the match, one hash probe."""
        return self._node_ending_at(Match(num_pages * self.block_size, self._by_hash[hashes[num_pages - 1]]))

    def attach_snapshot(self, node: Node, slot: int, producer: int | None, now: float) -> Snapshot | None:
        """Puts a snapshot at the end of `node`; None if one is already there (caller keeps its slot)."""
        if node.snapshot is not None:
            return None
        snap = Snapshot(slot, node.depth, published=producer is None, producer=producer, last_access=now)
        snap.node = node
        node.snapshot = snap
        self._snap_nodes[node] = None
        if producer is not None:
            self._pending_snaps.append(snap)
        return snap

    def attach_tail(self, node: Node, tail: tuple[int, ...], slot: int, page: int, producer: int | None,
                    now: float) -> Snapshot | None:
        """An exact-depth snapshot `len(tail)` tokens past the end of `node` (inside its next page),
        owning `page` (the K/V of `tail`); None if the same tail is already there (caller keeps both)."""
        assert 0 < len(tail) < self.block_size, "a tail lies inside one page"
        if self.find_tail(node, tail) is not None:
            return None
        snap = Snapshot(slot, node.depth + len(tail), published=producer is None, producer=producer,
                        last_access=now, tail=tuple(tail), tail_page=page)
        snap.node = node
        node.tails.append(snap)
        self._tails[snap] = None
        if producer is not None:
            self._pending_snaps.append(snap)
        return snap

    def find_tail(self, node: Node, tail: tuple[int, ...]) -> Snapshot | None:
        for s in node.tails:
            if s.tail == tail:
                return s
        return None

    def root(self, namespace: str) -> Node:
        """The (page-less) root of a namespace; tails shorter than one page hang on it."""
        return self._root(namespace)

    def exact_boundary(self, namespace: str, m: Match, tokens, limit: int) -> Boundary:
        """Deepest snapshot a branch with `tokens` can resume from, tails included, at depth <= limit.

        Like `boundary`: when the deepest one is pending, `blocking` names it and `ready` is the deepest
        published one below it."""
        node = m.node if m.node is not None else self._roots.get(namespace)
        blocking = None
        while node is not None:
            if node.depth <= min(m.depth, limit):
                found = self._deepest_tail(node, tokens, limit)
                for snap in (*found, node.snapshot):
                    if snap is None or snap.depth > limit or (snap is node.snapshot and node.is_root):
                        continue
                    if snap.published:
                        return Boundary(snap.depth, snap, blocking)
                    if blocking is None:
                        blocking = snap
            node = node.parent
        return Boundary(0, None, blocking)

    def exact_identity(self, namespace: str, m: Match, tokens, limit: int) -> int:
        """ĥ in tokens: the page match extended into the next page (a cached page or a tail), <= limit."""
        depth = m.depth
        if depth >= limit:
            return limit
        node = m.node if m.node is not None else self._roots.get(namespace)
        if node is None:
            return 0
        want = tuple(tokens[depth : min(limit, depth + self.block_size)])
        best = 0
        if node.depth > depth:  # the match ends inside `node`: its next page is the candidate
            keys = [node.key[depth - node.start : depth - node.start + self.block_size]]
        else:
            keys = [c.key[: self.block_size] for c in node.children.values()] + [t.tail for t in node.tails]
        for key in keys:
            best = max(best, _common(key, want))
        return depth + best

    def drop_tail(self, snap: Snapshot) -> None:
        """Frees a tail snapshot's slot and page (eviction, or its node going)."""
        node = snap.node
        node.tails.remove(snap)
        self._tails.pop(snap, None)
        self.ghosts.add_snapshot(_anchor(node), snap.depth, snap.tail)
        self.slots.free([snap.slot])
        self.pages.free([snap.tail_page])

    def touch_tail(self, snap: Snapshot, now: float) -> None:
        snap.last_access = now
        if snap in self._tails:
            del self._tails[snap]
            self._tails[snap] = None

    def evict_tails(self, need: int, pages: bool = False) -> int:
        """Drops up to `need` unlocked published tails, least recently used first (counts slots, or
        pages with `pages=True`; a tail holds one of each)."""
        victims = [s for s in self._tails if s.published and s.lock == 0][:need]
        for s in victims:
            self.drop_tail(s)
        self.evicted_snapshots += len(victims)
        return len(victims)

    def hold(self, snap: Snapshot, producer: int) -> None:
        """A published snapshot goes back to pending for this round: `producer` rewrites it (vLLM's
        copy-on-write of a partial tail its producer runs past, core/partial_hits.py)."""
        assert snap.published, "only a published snapshot can be held"
        snap.published, snap.producer = False, producer
        self._pending_snaps.append(snap)

    def move_pending(self, snap: Snapshot, node: Node) -> None:
        """A snapshot its producer has not written yet moves to the end of `node` (same slot, same
        producer): a row short of slots keeps its deeper boundaries (core/captures.py)."""
        assert snap.producer is not None and snap.tail == () and node.snapshot is None, "a pending boundary"
        old = snap.node
        old.snapshot = None
        del self._snap_nodes[old]
        snap.node, snap.depth = node, node.depth
        node.snapshot = snap
        self._snap_nodes[node] = None

    def publish(self) -> None:
        """End of round: what this round produced joins the published set C_{t+1}."""
        for node in self._pending_nodes:
            node.pending = False
        for snap in self._pending_snaps:
            snap.published = True
            snap.producer = None
        self._pending_nodes.clear()
        self._pending_snaps.clear()

    def lock(self, node: Node | None, now: float | None = None) -> None:
        """Holds the path to `node`; with `now`, also refreshes it (`touch`) in the same walk."""
        while node is not None and node.parent is not None:
            if node.lock_ref == 0:
                self.num_locked_pages += len(node.pages)
            node.lock_ref += 1
            if now is not None:
                node.last_access = now
            node = node.parent

    def relock(self, old: Node | None, new: Node) -> None:
        """`lock(new)` then `unlock(old)`, walking only the part of new's path below old when old is on it."""
        node = new
        while node is not None and node.parent is not None:
            if node is old:
                return  # old and the nodes above it keep their counts (+1 - 1)
            if node.lock_ref == 0:
                self.num_locked_pages += len(node.pages)
            node.lock_ref += 1
            node = node.parent
        self.unlock(old)

    def unlock(self, node: Node | None) -> None:
        while node is not None and node.parent is not None:
            node.lock_ref -= 1
            assert node.lock_ref >= 0, "lock_ref below zero"
            if node.lock_ref == 0:
                self.num_locked_pages -= len(node.pages)
            node = node.parent

    def request_begins(self, namespace: str, tokens, m: Match) -> None:
        """A request takes its hit (its tokens matched `m`): told to a policy that `observes`."""
        if self._observes:
            self.eviction.begin(self, namespace, tokens, m.depth, m.node)

    def request_ends(self, node: Node | None, hit: int) -> None:
        """A request ended, its sequence registered down to `node`, `hit` tokens found cached: told to
        a policy that `observes`."""
        if self._observes:
            self.eviction.end(self, node, hit)

    def touch(self, node: Node | None, now: float) -> None:
        """A hit refreshes the whole matched path (node-level LRU)."""
        while node is not None and node.parent is not None:
            node.last_access = now
            node = node.parent

    def touch_snapshot(self, snap: Snapshot, now: float) -> None:
        """A restore refreshes the snapshot's recency (the snapshot LRU order is kept incrementally)."""
        if snap.tail:
            self.touch_tail(snap, now)
            return
        snap.last_access = now
        if snap.node is not None and snap.node in self._snap_nodes:
            del self._snap_nodes[snap.node]
            self._snap_nodes[snap.node] = None

    def evict_pages(self, need: int) -> int:
        """Frees at least `need` pages from unlocked tails, as the eviction policy chooses."""
        mixed = self._tails and not getattr(self.eviction, "handles_tails", False)
        freed = self._evict_stale_tails(need, self._oldest_leaf()) if mixed else 0
        got = self.eviction.evict_pages(self, need - freed) if freed < need else 0
        self.evicted_pages += got
        freed += got
        if freed < need and mixed:
            freed += self.evict_tails(need - freed, pages=True)
        return freed

    def evict_snapshots(self, need: int) -> int:
        """Drops at least `need` unlocked published snapshots, as the eviction policy chooses."""
        mixed = self._tails and not getattr(self.eviction, "handles_tails", False)
        freed = self._evict_stale_tails(need, self._oldest_snapshot()) if mixed else 0
        got = self.eviction.evict_snapshots(self, need - freed) if freed < need else 0
        self.evicted_snapshots += got
        freed += got
        if freed < need and mixed:
            freed += self.evict_tails(need - freed)
        return freed

    def reset(self) -> None:
        """Drops everything that is not locked or pending (used to clear the cache between runs)."""
        self.evict_pages(self.pages.capacity)
        self.evict_snapshots(self.slots.capacity)

    # ------------------------------------------------------------------ accounting
    @property
    def num_cached_pages(self) -> int:
        return sum(len(n.pages) for n in self._iter_nodes()) + len(self._tails)

    @property
    def num_snapshots(self) -> int:
        return len(self._snap_nodes) + len(self._tails)

    @property
    def num_tails(self) -> int:
        return len(self._tails)

    def check_integrity(self) -> tuple[set[int], set[int]]:
        """Raises AssertionError on a broken invariant; returns (tree pages, snapshot slots)."""
        pages: set[int] = set()
        slots: set[int] = set()
        nodes = list(self._iter_nodes())
        bs = self.block_size
        for n in nodes:
            assert len(n.key) == len(n.pages) * bs == len(n.hashes) * bs, "node key/pages/hashes disagree"
            assert len(n.key) > 0, "empty non-root node"
            assert n.depth == n.parent.depth + len(n.key) if not n.parent.is_root else n.depth == len(n.key)
            assert n.lock_ref >= 0, "negative lock_ref"
            child_locks = sum(c.lock_ref for c in n.children.values())
            assert n.lock_ref >= child_locks, "a node is locked less than its children"
            for p in n.pages:
                assert p not in pages, f"page {p} owned twice in the tree"
                pages.add(p)
            for h in n.hashes:
                assert self._by_hash.get(h) is n, "hash index out of date"
            assert (not n.children) == (n in self._leaves), "leaf set out of date"
            if n.snapshot is not None:
                s = n.snapshot
                assert s.depth == n.depth, "snapshot not at its node's end"
                assert s.slot not in slots, f"slot {s.slot} used by two snapshots"
                assert s.lock >= 0, "negative snapshot lock"
                assert s.published == (s.producer is None), "snapshot producer/published disagree"
                slots.add(s.slot)
                assert n in self._snap_nodes
        tail_pages = self._check_tails(nodes, pages, slots)
        assert len(self._by_hash) == sum(len(n.hashes) for n in nodes), "stale hashes in the index"
        assert self.num_locked_pages == sum(len(n.pages) for n in nodes if n.lock_ref), "locked-page count drift"
        assert len(self._snap_nodes) + len(self._tails) == len(slots), "stale snapshot set"
        pages |= tail_pages
        assert not (pages & self.pages.free_ids()), "a tree page is also free"
        assert not (slots & self.slots.free_ids()), "a snapshot slot is also free"
        return pages, slots

    def _check_tails(self, nodes: list[Node], pages: set[int], slots: set[int]) -> set[int]:
        """Tail snapshots: on a live node (or a root), inside one page, own slot and page."""
        tail_pages: set[int] = set()
        count = 0
        for n in [*self._roots.values(), *nodes]:
            for s in n.tails:
                count += 1
                assert s.node is n and s in self._tails, "tail snapshot out of the tail set"
                assert s.depth == n.depth + len(s.tail) and 0 < len(s.tail) < self.block_size, "bad tail depth"
                assert s.slot not in slots, f"slot {s.slot} used by two snapshots"
                assert s.tail_page not in pages and s.tail_page not in tail_pages, (
                    f"tail page {s.tail_page} owned twice")
                assert s.lock >= 0 and s.published == (s.producer is None), "tail lock/producer drift"
                slots.add(s.slot)
                tail_pages.add(s.tail_page)
        assert count == len(self._tails), "a tail snapshot outlived its node"
        return tail_pages

    # ------------------------------------------------------------------ helpers
    def _root(self, namespace: str) -> Node:
        root = self._roots.get(namespace)
        if root is None:
            root = Node(None, namespace, (), [], [], 0)
            self._roots[namespace] = root
        return root

    def _iter_nodes(self):
        stack = [c for r in self._roots.values() for c in r.children.values()]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    @staticmethod
    def _deepest_tail(node: Node, tokens, limit: int) -> list[Snapshot]:
        """The tails of `node` that `tokens` continue into, deepest first, none past `limit`."""
        if not node.tails:
            return []
        d = node.depth
        nxt = tokens[d] if d < len(tokens) else None
        found = [s for s in node.tails
                 if s.depth <= limit and s.tail[0] == nxt and tuple(tokens[d : s.depth]) == s.tail]
        found.sort(key=lambda s: -s.depth)
        return found

    def _evict_stale_tails(self, need: int, before: float) -> int:
        """Tails are not in the policy's view (lru, rr-tail): drop those older than what the policy
        would take first, so one recency order spans both kinds."""
        victims = []
        for snap in self._tails:  # least recently used first
            if snap.last_access > before or len(victims) >= need:
                break
            if snap.published and snap.lock == 0:
                victims.append(snap)
        for snap in victims:
            self.drop_tail(snap)
        self.evicted_snapshots += len(victims)
        return len(victims)

    def _oldest_leaf(self) -> float:
        best = float("inf")
        for n in self._leaves:  # the evictability test only for a leaf older than the best so far
            if n.last_access < best and self._evictable(n):
                best = n.last_access
        return best

    def _oldest_snapshot(self) -> float:
        for n in self._snap_nodes:
            if n.snapshot.published and n.snapshot.lock == 0:
                return n.snapshot.last_access
        return float("inf")

    def _published_below(self, node: Node | None, depth: int) -> int:
        while node is not None and node.parent is not None:
            if node.snapshot is not None and node.snapshot.published and node.depth <= depth:
                return node.depth
            node = node.parent
        return 0

    def _node_ending_at(self, m: Match) -> Node:
        node = m.node
        if node.depth == m.depth:
            return node
        return self._split(node, (m.depth - node.start) // self.block_size)

    def _split(self, node: Node, k: int) -> Node:
        """Splits `node` after its first k pages; returns the new upper node (the original keeps the tail)."""
        bs = self.block_size
        top = Node(node.parent, node.namespace, node.key[: k * bs], node.pages[:k], node.hashes[:k],
                   node.start + k * bs, lock_ref=node.lock_ref, last_access=node.last_access,
                   pending=node.pending, origin=node.origin)
        node.parent.children[node.key[:bs]] = top
        node.key = node.key[k * bs :]
        node.pages = node.pages[k:]
        node.hashes = node.hashes[k:]
        node.parent = top
        top.children[node.key[:bs]] = node
        self._by_hash.update(dict.fromkeys(top.hashes, top))
        if top.pending:
            self._pending_nodes.append(top)
        return top

    def _evictable(self, node: Node) -> bool:
        if node.lock_ref or node.pending or (node.snapshot is not None and node.snapshot.lock):
            return False
        for t in node.tails:  # a loop, not all(): this runs for every leaf at every eviction
            if t.lock or not t.published:
                return False
        return True

    def _remove_leaf(self, node: Node) -> int:
        assert not node.children and node.lock_ref == 0
        if node.snapshot is not None:
            self._drop_snapshot(node)
            self.evicted_snapshots += 1
        for snap in list(node.tails):  # exact-depth checkpoints go with their node
            self.drop_tail(snap)
            self.evicted_snapshots += 1
        self.ghosts.add_pages(node.hashes)
        parent = node.parent
        del parent.children[node.key[: self.block_size]]
        self._leaves.pop(node, None)
        if not parent.children and not parent.is_root:
            self._leaves[parent] = None
        for h in node.hashes:
            del self._by_hash[h]
        self.pages.free(node.pages)
        return len(node.pages)

    def _drop_snapshot(self, node: Node) -> None:
        self.ghosts.add_snapshot(_anchor(node), node.depth, ())
        self.slots.free([node.snapshot.slot])
        node.snapshot = None
        self._snap_nodes.pop(node, None)


def _common(a, b) -> int:
    """Length of the common prefix of two token sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _anchor(node: Node):
    """A key for the path ending at `node` that survives the node: its last chain hash (or the root)."""
    return node.hashes[-1] if node.hashes else ("root", node.namespace)
