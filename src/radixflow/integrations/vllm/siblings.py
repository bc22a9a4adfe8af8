"""Recognises the siblings of a Blocked request in O(1), without a new prefix lookup (SPEC §12).

When the first consumer of a producer is found Blocked in a step, its lookup is remembered under its
blocking key: the request's block hash at the depth of its hit (and, where vLLM reported a longer
single-group hit, at that depth too). vLLM's block hashes are chained (each includes its parent), so a
later request with the same hash at that depth shares the whole prefix and finds at least the same
cached blocks.

"At least": a sibling may also share blocks past that depth with some other cached sequence (its own
blocks from before a preemption, a repeated prompt, a request admitted earlier in this step), and then
its real hit can end deeper, on a state published in an earlier step: not Blocked at all. So before a
sibling is given the remembered lookup, `cached_past` (one dict look-up per hash unit of the sibling's
next block past the group's deepest key) confirms that its full-attention hit cannot extend past that
depth; then every group's finder sees the same hashes up to the same length and returns the same hit,
Blocked on the same same-step state. A sibling that fails the check gets vLLM's full lookup. Its block
count differs from the first consumer's only by its own length, so neither a lookup nor vLLM's
per-block fit count is repeated for a confirmed sibling.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# (block hashes, depth in tokens, max hit tokens) -> whether a lookup could hit past that depth.
CachedPast = Callable[[Sequence, int, int], bool]


@dataclass(frozen=True)
class BlockedGroup:
    """The first Blocked consumer's lookup, and its block count once the state is published."""

    lookup: tuple[Any, ...]  # what `_get_local_prefix_cache_hit` returned for it
    num_hit_tokens: int
    gate: int  # vLLM's full-sequence gate count (0 when off), watermark included
    fragment: int  # this fragment's count, watermark included
    gate_length_blocks: int  # token_blocks() of the lengths those counts were made for
    fragment_length_blocks: int


class BlockedGroups:
    """Blocking keys of this step: depth in hash blocks -> block hash there -> `BlockedGroup`s."""

    def __init__(self, hash_block_size: int, cached_past: CachedPast | None) -> None:
        self.hash_block_size = hash_block_size
        self._cached_past = cached_past  # None: no exact check for this cache layout, no shortcut
        self._by_depth: dict[int, dict[Any, list[tuple[tuple, BlockedGroup]]]] = {}

    def clear(self) -> None:
        self._by_depth.clear()

    def __bool__(self) -> bool:
        return bool(self._by_depth)

    def _keys(self, block_hashes, num_hit_tokens: int, longest_single_group_hit: int):
        depths = [num_hit_tokens]
        if longest_single_group_hit > num_hit_tokens:
            depths.append(longest_single_group_hit)
        keys = []
        for depth in depths:
            if depth % self.hash_block_size or depth // self.hash_block_size > len(block_hashes):
                return None
            keys.append((depth // self.hash_block_size, block_hashes[depth // self.hash_block_size - 1]))
        return tuple(keys)

    def remember(self, request, group: BlockedGroup, longest_single_group_hit: int) -> None:
        if group.num_hit_tokens <= 0 or self._cached_past is None:
            return
        keys = self._keys(request.block_hashes, group.num_hit_tokens, longest_single_group_hit)
        if keys is not None:
            depth, block_hash = keys[0]
            self._by_depth.setdefault(depth, {}).setdefault(block_hash, []).append((keys, group))

    def find(self, request) -> BlockedGroup | None:
        """The group whose blocking prefix `request` shares, or None (then look it up as usual).

        One dict look-up per distinct hit depth among this step's Blocked groups, and for a match the
        check that the request's hit cannot go past the group's deepest key."""
        hashes = request.block_hashes
        for depth, by_hash in self._by_depth.items():
            if depth > len(hashes):
                continue
            for keys, group in by_hash.get(hashes[depth - 1], ()):
                # vLLM caps a hit at num_tokens - 1; a shorter sibling would get a shorter hit.
                deepest = max(group.num_hit_tokens, keys[-1][0] * self.hash_block_size)
                if request.num_tokens - 1 < deepest:
                    continue
                if not all(d <= len(hashes) and hashes[d - 1] == h for d, h in keys[1:]):
                    continue
                # Same prefix through the deepest key; Blocked too only if its hit cannot end deeper.
                if not self._cached_past(hashes, deepest, request.num_tokens - 1):
                    return group
        return None
