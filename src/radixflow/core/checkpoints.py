"""Branch-point checkpoints (`--checkpoints branch`, SPEC §14): where a hybrid row captures state
beyond the boundary grid.

A row computing positions [start, end) of a branch also captures its recurrent and conv state, in
the same forward, at every depth in that range where another known branch diverges from it:

- a sibling (same logical request) or any held/waiting/running branch of the same namespace,
  at their longest common prefix;
- a cached path the index already holds, at the branch's own exact identity hit ĥ;
- the exact end of the prompt (when more than one token is generated: the end of the finished
  branch, which the scheduler snapshots at finish, covers a one-token answer).

The scheduler turns each depth into a snapshot (on a page boundary) or, through `capture_exact`,
a tail snapshot (inside a page, with a copy of that page's K/V); at finish `attach_exact_end` makes
the branch's working state a snapshot at its exact length. These two are the scheduler's friends:
they allocate from its pools, as its own `_capture_at` does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from radixflow.cache.pool import IdPool
from radixflow.cache.radix import Node, RadixIndex, Snapshot, chain_hashes
from radixflow.config import SchedulerConfig
from radixflow.core.branch import Branch


class SchedulerPools(Protocol):
    """What the capture helpers use: the Scheduler passes itself in (this module sits below it)."""

    config: SchedulerConfig
    index: RadixIndex
    pages: IdPool
    slots: IdPool
    block_size: int
    exact_checkpoints: int

    def ensure(self, pages: int, slots: int) -> bool: ...


MAX_PER_ROW = 8  # a row is one forward; a handful of captures is cheap, hundreds would not be


class BranchPoints:
    def __init__(self, block_size: int, interval: int, min_wait: int = 64, always_wait: int | None = None) -> None:
        self.block_size = block_size
        self.interval = interval
        self.min_wait = min_wait if always_wait is None else min(min_wait, always_wait)
        self.always_wait = always_wait  # `--checkpoint-wait N`; None: 'grid'

    def worth_waiting(self, ready: int, pending: int, next_round_sure: bool) -> bool:
        """Whether a branch whose deepest checkpoint (at `pending`) is being written this round waits
        for it (Blocked) rather than recomputing the tokens above the published state (at `ready`) now.

        Hybrid state written in round t is usable only in t+1 (SPEC §2), so a wait costs a round
        exactly when t+1 would not run without it. A branch waits when it saves at least `min_wait`
        tokens and
        - round t+1 runs anyway (`next_round_sure`: a row of round t continues, something is already
          deferred to t+1, or arrivals are held): the wait is free; or
        - a state boundary lies in (ready, pending]: boundary mode would be Blocked on the producer's
          snapshot there too, so the checkpoint adds no round to what boundary mode takes; or
        - (`--checkpoint-wait N`) the wait saves at least N tokens, a round or not.
        Anything else is recomputed now: the siblings of a question shorter than one block run in the
        producer's round, as they do in boundary mode (docs/checkpoints.md has the measured trade-off)."""
        gain = pending - ready
        if gain < self.min_wait:
            return False
        if next_round_sure or pending // self.interval * self.interval > ready:
            return True
        return self.always_wait is not None and gain >= self.always_wait

    def depths(self, b: Branch, start: int, end: int, others: Iterable[Branch], cached: int) -> list[int]:
        """Depths in (start, end] to capture at for `b`'s row, deepest last; `cached` is b's exact ĥ."""
        found: set[int] = set()
        if start < cached <= end:
            found.add(cached)
        if b.max_new_tokens > 1 and start < b.prompt_len <= end:
            found.add(b.prompt_len)
        for o in others:
            if o is b or o.namespace != b.namespace:
                continue
            d = min(self.common_prefix(b, o), o.num_tokens - 1, b.num_tokens)
            if start < d <= end:
                found.add(d)
        return sorted(found)[-MAX_PER_ROW:]

    def common_prefix(self, a: Branch, b: Branch) -> int:
        """Longest common token prefix: a binary search over both chain hashes, then one page of tokens."""
        ha, hb = _hashes(a, self.block_size), _hashes(b, self.block_size)
        lo, hi = 0, min(len(ha), len(hb))
        while lo < hi:  # chain hashes: page i agrees iff every page before it agrees
            mid = (lo + hi + 1) // 2
            if ha[mid - 1] == hb[mid - 1]:
                lo = mid
            else:
                hi = mid - 1
        i = lo * self.block_size
        ta, tb = a.tokens, b.tokens
        n = min(len(ta), len(tb), i + self.block_size)
        while i < n and ta[i] == tb[i]:
            i += 1
        return i


def capture_exact(s: SchedulerPools, b: Branch, depth: int, start: int, now: float, out: list[tuple[int, int]],
                  copies: list[tuple[int, int]], count: bool = True) -> Snapshot | None:
    """A tail snapshot at `depth` (inside a page) written by `b`'s row: a state capture at that point
    and a copy of the partial page's K/V after the forward that writes it (`count`: a branch-point
    checkpoint, counted in `exact_checkpoints`)."""
    node = anchor(s, b, depth)
    if node is None:
        return None
    tail = tuple(b.tokens[node.depth : depth])
    if s.index.find_tail(node, tail) is not None or not s.ensure(1, 1):
        return None
    slot, page = s.slots.allocate_one(), s.pages.allocate_one()
    snap = s.index.attach_tail(node, tail, slot, page, b.uid, now)
    snap.level = b.sched.level
    out.append((depth - start, slot))
    copies.append((b.sched.page_table[depth // s.block_size], page))
    s.exact_checkpoints += count
    return snap


def attach_exact_end(s: SchedulerPools, b: Branch) -> bool:
    """At finish: the working state becomes a snapshot at the exact computed length; a partial last
    page is handed over to it (no copy: the branch is done writing it). False: the caller frees it."""
    tr = b.sched
    depth = b.num_computed_tokens
    if depth == 0 or tr.no_cache or not s.config.enable_prefix_caching:
        return False
    bs = s.block_size
    if len(tr.hashes) < depth // bs:
        tr.hashes = chain_hashes(b.namespace, b.tokens, bs, tr.hashes)
    node = anchor(s, b, depth)
    if node is None:
        return False
    if depth % bs == 0:
        snap = s.index.attach_snapshot(node, tr.working, None, 0.0) if not node.is_root else None
    else:
        page = tr.page_table[depth // bs]
        if page not in tr.private:
            return False
        snap = s.index.attach_tail(node, tuple(b.tokens[node.depth : depth]), tr.working, page, None, 0.0)
        if snap is not None:
            tr.private.discard(page)
    if snap is None:
        return False
    snap.level = tr.level
    s.exact_checkpoints += 1
    return True


def anchor(s: SchedulerPools, b: Branch, depth: int) -> Node | None:
    """The tree node ending at the last whole page at or above `depth` (a root below one page)."""
    full = depth // s.block_size
    if full == 0:
        return s.index.root(b.namespace)
    m = s.index.match(b.sched.hashes, full)
    return s.index.node_at(m) if m.depth == full * s.block_size else None


def _hashes(b: Branch, block_size: int) -> list[int]:
    tr = b.sched
    if len(tr.hashes) < b.num_tokens // block_size:
        tr.hashes = chain_hashes(b.namespace, b.tokens, block_size, tr.hashes)
    return tr.hashes
