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

from dataclasses import dataclass

from radixflow.cache.radix import RadixIndex, Snapshot, chain_hashes


def common_pages(a, b, block_size: int, limit: int, guess: int = 0) -> int:
    """Number of leading whole pages (at most `limit`) on which token sequences `a` and `b` agree.
    `guess` (e.g. the previous pair's answer: siblings share the same document) is tried first; else
    the pages are compared in doubling runs, then the first mismatching run is bisected."""
    bs = block_size
    n = min(limit, len(a) // bs, len(b) // bs)
    if 0 < guess <= n and a[: guess * bs] == b[: guess * bs] and (
            guess == n or a[guess * bs : (guess + 1) * bs] != b[guess * bs : (guess + 1) * bs]):
        return guess
    lo, step = 0, 1  # pages [0, lo) agree
    while lo < n:
        hi = min(n, lo + step)
        if a[lo * bs : hi * bs] == b[lo * bs : hi * bs]:
            lo, step = hi, step * 2
            continue
        while hi - lo > 1:  # the first mismatch is in pages [lo, hi)
            mid = (lo + hi) // 2
            if a[lo * bs : mid * bs] == b[lo * bs : mid * bs]:
                lo = mid
            else:
                hi = mid
        return lo
    return lo


@dataclass
class Arrival:
    """What a branch's arrival leaves for the next one's hash reuse."""

    namespace: str
    tokens: tuple
    hashes: list[int]
    shared: int = 0  # pages it shared with the arrival before it
    # `tokens[:kin_len] == kin[:kin_len]`, found by comparing with the arrivals before it: a tree node cut
    # from `kin` within that length needs no token check against this branch (`RadixIndex.tokens_match`).
    kin: tuple | None = None
    kin_len: int = 0


def arrival_hashes(index: RadixIndex, namespace: str, tokens, prev: Arrival | None) -> tuple[Arrival, int, bool]:
    """Chain hashes of every full page of `tokens`, reusing the tree's path and the previous arrival's.
    Returns (this arrival, depth verified against the tree's tokens, collision: the hash index holds
    another prefix under one of these hashes). `Arrival.shared` is the expected end of the branch's
    match (pages shared with its sibling, else with the tree): its first group key guess."""
    bs = index.block_size
    full = len(tokens) // bs
    m, known = index.match_tokens(namespace, tokens, full)
    shared = len(known)
    kin, kin_len = None, 0
    if prev is not None and prev.namespace == namespace and len(prev.hashes) > shared:
        k = common_pages(tokens, prev.tokens, bs, len(prev.hashes), prev.shared)
        if k > len(known):
            known = prev.hashes[:k]
            shared = k
        if k:  # equal to prev on k pages, so to prev's kin on as many of those as it covers
            kin, kin_len = (prev.kin, min(k * bs, prev.kin_len)) if prev.kin is not None else (prev.tokens, k * bs)
    hashes = chain_hashes(namespace, tokens, bs, known)
    walked = m.depth // bs
    collision = walked < full and index.has_page(hashes[walked])
    return Arrival(namespace, tokens, hashes, shared, kin, kin_len), m.depth, collision


class BlockedGroups:
    """This round's Blocked groups: group key -> the pending snapshot its first member was Blocked on."""

    MAX_DEPTHS = 4  # distinct ĥ probed for a branch with no key yet (most recent first)

    def __init__(self, index: RadixIndex) -> None:
        self.block_size = index.block_size
        self._in_tree = index.page_hashes
        self.by_key: dict[int, Snapshot] = {}  # read by the scan's inlined fast path
        self.ready: dict[int, int] = {}  # group key -> the members' ready depth (same path, same h)
        self._depths: list[int] = []  # pages, most recent last

    def add(self, key: int, pages: int, snapshot: Snapshot, ready: int = 0) -> None:
        """A branch with group key `key` (its match ended after `pages` pages, its ready state at
        depth `ready`) is Blocked on `snapshot`."""
        self.by_key[key] = snapshot
        self.ready[key] = ready
        if pages not in self._depths:
            self._depths.append(pages)
            if len(self._depths) > self.MAX_DEPTHS:
                del self._depths[0]

    def find(self, b) -> Snapshot | None:
        """The snapshot waiting branch `b` is Blocked on as a member of a group already Blocked this
        round, or None (then it needs a lookup of its own)."""
        tr = b.sched
        snap = self.by_key.get(tr.group_key)
        if snap is not None:
            nh = tr.next_hash
            return snap if nh is None or nh not in self._in_tree else None
        if tr.group_key is None and not tr.no_cache:
            return self._probe(tr, (b.num_tokens - 1) // self.block_size)
        return None

    def _probe(self, tr, max_pages: int) -> Snapshot | None:
        """A branch with no key yet: try its chain hash at each recent group depth."""
        hashes = tr.hashes
        for k in reversed(self._depths):
            # Page k's hash must be known (a preempted branch's outputs may not be hashed yet).
            if k <= max_pages and (k < len(hashes) or k == max_pages == len(hashes)):
                snap = self.by_key.get(hashes[k - 1])
                if snap is not None and (k == max_pages or hashes[k] not in self._in_tree):
                    tr.group_key = hashes[k - 1]
                    tr.next_hash = hashes[k] if k < max_pages else None
                    return snap
        return None
