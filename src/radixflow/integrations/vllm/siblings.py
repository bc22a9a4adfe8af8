"""Recognises the siblings of a Blocked request in O(1), without a new prefix lookup (SPEC §12).

When the first consumer of a producer is found Blocked in a step, its lookup is remembered under its
blocking key: the request's block hash at the depth of its hit (and, where vLLM reported a longer
single-group hit, at that depth too). vLLM's block hashes are chained (each includes its parent), so a
later request with the same hash at that depth shares the whole prefix, finds the same cached blocks
and is Blocked on the same same-step state. Its lookup result is the remembered one and its block
count differs from the first consumer's only by its own length, so neither a lookup nor vLLM's
per-block fit count is repeated.

A sibling that shares even more with some other cached request could in principle have found a deeper,
ready hit; it is deferred like the others, which never admits anything vLLM would not (vLLM's scan
stops at the first consumer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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

    def __init__(self, hash_block_size: int) -> None:
        self.hash_block_size = hash_block_size
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
        if group.num_hit_tokens <= 0:
            return
        keys = self._keys(request.block_hashes, group.num_hit_tokens, longest_single_group_hit)
        if keys is not None:
            depth, block_hash = keys[0]
            self._by_depth.setdefault(depth, {}).setdefault(block_hash, []).append((keys, group))

    def find(self, request) -> BlockedGroup | None:
        """The group whose blocking prefix `request` shares, or None (then look it up as usual).

        One dict look-up per distinct hit depth among this step's Blocked groups."""
        hashes = request.block_hashes
        for depth, by_hash in self._by_depth.items():
            if depth > len(hashes):
                continue
            for keys, group in by_hash.get(hashes[depth - 1], ()):
                # vLLM caps a hit at num_tokens - 1; a shorter sibling would get a shorter hit.
                if request.num_tokens - 1 < max(group.num_hit_tokens, keys[-1][0] * self.hash_block_size):
                    continue
                if all(d <= len(hashes) and hashes[d - 1] == h for d, h in keys[1:]):
                    return group
        return None
