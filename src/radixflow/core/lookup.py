"""Cheap prefix lookups for the waiting scan: hash a prompt once, reusing a shared prefix's hashes, and
recognise the siblings of a Blocked group by one key instead of one prefix lookup each (issue 10).

Chain hashes (`cache.radix.chain_hashes`) are computed when a branch arrives, as vLLM's request block
hasher does; pages of a prefix already in the tree, or shared with the branch added just before (the
branches of one request arrive together), take their hashes from there, so a shared document is
compared once per branch but hashed once in all.

A Blocked group: branches whose last match ended at the same depth ĥ on the same path (equal chain
hash of page ĥ/bs - 1) and whose next page is not in the tree. They share ĥ and the matched path, so
`RadixIndex.boundary` gives all of them the same answer; once the first of them is found Blocked in
a round, the others are Blocked on the same pending snapshot. Within a round the answer cannot turn
Ready: published snapshots only appear between rounds, the producer holds the path to its pending
snapshot locked, and whatever a placement adds this round is pending too.
"""

from __future__ import annotations

from radixflow.cache.radix import RadixIndex, Snapshot, chain_hashes


def common_pages(a, b, block_size: int, limit: int) -> int:
    """Number of leading whole pages (at most `limit`) on which token sequences `a` and `b` agree."""
    n = min(limit, len(a) // block_size, len(b) // block_size)
    if n and tuple(a[: n * block_size]) == tuple(b[: n * block_size]):
        return n
    lo, hi = 0, max(0, n - 1)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tuple(a[: mid * block_size]) == tuple(b[: mid * block_size]):
            lo = mid
        else:
            hi = mid - 1
    return lo


def arrival_hashes(index: RadixIndex, namespace: str, tokens, prev: tuple[str, tuple, list[int]] | None
                   ) -> tuple[list[int], int, bool]:
    """Chain hashes of every full page of `tokens`, reusing the tree's path and the previous arrival's
    (`prev` = its namespace, tokens, hashes). Returns (hashes, depth verified against the tree's tokens,
    collision: the hash index holds another prefix under one of these hashes)."""
    bs = index.block_size
    full = len(tokens) // bs
    m, known = index.match_tokens(namespace, tokens, full)
    if prev is not None and prev[0] == namespace and len(prev[2]) > len(known):
        k = common_pages(tokens, prev[1], bs, len(prev[2]))
        if k > len(known):
            known = prev[2][:k]
    hashes = chain_hashes(namespace, tokens, bs, known)
    walked = m.depth // bs
    collision = walked < full and index.has_page(hashes[walked])
    return hashes, m.depth, collision


class BlockedGroups:
    """This round's Blocked groups: group key -> the pending snapshot its first member was Blocked on."""

    MAX_DEPTHS = 4  # distinct ĥ probed for a branch with no key yet (most recent first)

    def __init__(self, index: RadixIndex) -> None:
        self.block_size = index.block_size
        self._in_tree = index.page_hashes
        self._by_key: dict[int, Snapshot] = {}
        self._depths: list[int] = []  # pages, most recent last

    def __bool__(self) -> bool:
        return bool(self._by_key)

    def add(self, key: int, pages: int, snapshot: Snapshot) -> None:
        """A branch with group key `key` (its match ended after `pages` pages) is Blocked on `snapshot`."""
        self._by_key[key] = snapshot
        if pages not in self._depths:
            self._depths.append(pages)
            if len(self._depths) > self.MAX_DEPTHS:
                del self._depths[0]

    def find(self, b) -> Snapshot | None:
        """The snapshot waiting branch `b` is Blocked on as a member of a group already Blocked this
        round, or None (then it needs a lookup of its own)."""
        tr = b.sched
        key = tr.group_key
        if key is not None:
            snap = self._by_key.get(key)
            if snap is not None and (tr.next_hash is None or tr.next_hash not in self._in_tree):
                return snap
            return None
        if tr.no_cache:
            return None
        hashes = tr.hashes
        max_pages = (b.num_tokens - 1) // self.block_size
        for k in reversed(self._depths):  # never looked up: probe its hash at each group depth
            if k <= max_pages and k <= len(hashes):
                snap = self._by_key.get(hashes[k - 1])
                if snap is not None and (k == max_pages or hashes[k] not in self._in_tree):
                    tr.group_key = hashes[k - 1]
                    tr.next_hash = hashes[k] if k < max_pages else None
                    return snap
        return None
