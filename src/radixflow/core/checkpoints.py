"""Branch-point checkpoints (`--checkpoints branch`, SPEC §14): where a hybrid row captures state
beyond the boundary grid.

A row computing positions [start, end) of a branch also captures its recurrent and conv state, in
the same forward, at every depth in that range where another known branch diverges from it:

- a sibling (same logical request) or any held/waiting/running branch of the same namespace,
  at their longest common prefix;
- a cached path the index already holds, at the branch's own exact identity hit ĥ;
- the exact end of the prompt (when more than one token is generated: the end of the finished
  branch, which the scheduler snapshots at finish, covers a one-token answer).

The scheduler turns each depth into a snapshot (on a page boundary) or a tail snapshot (inside a
page, with a copy of that page's K/V). This module only says where; it holds no memory.
"""

from __future__ import annotations

from collections.abc import Iterable

from radixflow.cache.radix import chain_hashes
from radixflow.core.branch import Branch

MAX_PER_ROW = 8  # a row is one forward; a handful of captures is cheap, hundreds would not be


class BranchPoints:
    def __init__(self, block_size: int, min_wait: int = 64) -> None:
        self.block_size = block_size
        self.min_wait = min_wait

    def worth_waiting(self, gain: int) -> bool:
        """A branch whose deepest checkpoint is being written this round waits for it (Blocked) only
        when it saves at least `min_wait` tokens over the published one below; a shorter gap is
        recomputed in this round, which costs less than the extra round a deferral can add."""
        return gain >= self.min_wait

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


def _hashes(b: Branch, block_size: int) -> list[int]:
    tr = b.sched
    if len(tr.hashes) < b.num_tokens // block_size:
        tr.hashes = chain_hashes(b.namespace, b.tokens, block_size, tr.hashes)
    return tr.hashes
