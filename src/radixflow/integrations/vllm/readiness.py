"""Classifies a waiting request's failed admission in vLLM 0.33 as Blocked or Other (SPEC §3).

vLLM reports both the same way: `KVCacheManager.allocate_slots` returns None. The same-step case comes
from `MambaManager.get_num_blocks_to_allocate`, which answers "more blocks than the pool has" when the
last matched Mamba block was registered (`cached_blocks_this_step`) by a request scheduled earlier in
the same step: its state is only written when that step executes. These helpers read that same
condition, and check that nothing else (pages, the watermark) would refuse the request, so that only a
pure same-step dependency is called Blocked.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from typing import NamedTuple

from vllm.utils.math_utils import cdiv
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager, MambaManager
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.request import Request, RequestStatus


def blocking_state_groups(
    manager: KVCacheManager, hit_blocks: Sequence[Sequence], num_hit_tokens: int
) -> tuple[int, ...]:
    """KV-cache groups whose matched state is still being produced in this step (empty: not Blocked).

    `hit_blocks` is the per-group block lists of the request's prefix lookup, as vLLM passes them to
    `allocate_slots`; `num_hit_tokens` is the lookup's hit length.
    """
    blocked = []
    for group_id, group_manager in enumerate(manager.coordinator.single_type_managers):
        if not isinstance(group_manager, MambaManager):
            continue
        blocks = _blocks_offered(manager, group_id, hit_blocks[group_id], num_hit_tokens)
        if blocks and blocks[-1].block_hash in group_manager.cached_blocks_this_step:
            blocked.append(group_id)
    return tuple(blocked)


class PublishedNeed(NamedTuple):
    """Blocks a Blocked request would take once its matched state is published, counted as
    `allocate_slots` counts them: `gate` for vLLM's full-sequence check (0 when that check is off),
    `fragment` for this fragment, both including the watermark that applies to it."""

    gate: int
    fragment: int

    def fits(self, free_blocks: int) -> bool:
        return self.gate <= free_blocks and self.fragment <= free_blocks


def blocks_once_state_is_published(
    manager: KVCacheManager,
    request: Request,
    hit_blocks: Sequence[Sequence],
    num_hit_tokens: int,
    num_new_tokens: int,
    *,
    num_lookahead_tokens: int,
    max_model_len: int,
    has_scheduled_reqs: bool,
    full_sequence_must_fit: bool,
) -> PublishedNeed:
    """The blocks the pool must give the request if its matched state were already published.

    Counted as `allocate_slots` counts (every group, the watermark, the full-sequence gate), with the
    same-step hashes hidden from the Mamba managers for the duration of the count. Mamba is asked
    with `apply_admission_cap=True`, which in align mode changes nothing in the answer and skips the
    one side effect of the question (recording a prefill checkpoint for the request).
    """
    computed = request.num_computed_tokens + num_hit_tokens
    main_model_tokens = computed + num_new_tokens
    slot_tokens = min(main_model_tokens + num_lookahead_tokens, max_model_len)
    prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)
    if manager.coordinator.retention_interval != 0:
        prefill_end = 0  # as the coordinator does: sparse retention reserves no per-chunk checkpoint
    watermark = 0
    if has_scheduled_reqs and request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
        watermark = manager.watermark_blocks

    def needed(num_tokens: int, main_tokens: int, admission_cap: bool) -> int:
        total = 0
        for group_id, group_manager in enumerate(manager.coordinator.single_type_managers):
            is_state = isinstance(group_manager, MambaManager)
            total += group_manager.get_num_blocks_to_allocate(
                request.request_id,
                num_tokens,
                _blocks_offered(manager, group_id, hit_blocks[group_id], num_hit_tokens),
                computed,
                computed,
                main_tokens,
                apply_admission_cap=admission_cap or is_state,
                prefill_end=prefill_end,
            )
        return total

    with _same_step_state_hidden(manager, hit_blocks, num_hit_tokens):
        gate = 0
        if full_sequence_must_fit:
            full_tokens = min(request.num_tokens, max_model_len)
            gate = needed(full_tokens, full_tokens, True) + watermark
        return PublishedNeed(gate, needed(slot_tokens, main_model_tokens, False) + watermark)


def fits_once_state_is_published(manager: KVCacheManager, request: Request, *args, **kwargs) -> bool:
    """Whether the pool could take the request now if its matched state were already published
    (arguments as `blocks_once_state_is_published`)."""
    need = blocks_once_state_is_published(manager, request, *args, **kwargs)
    return need.fits(manager.block_pool.get_num_free_blocks())


def next_step_blocks(
    manager: KVCacheManager, request: Request, end: int, num_new_tokens: int, *, num_lookahead_tokens: int,
    max_model_len: int,
) -> int:
    """The blocks a running request's allocation of `num_new_tokens` more tokens past `end` will ask
    the pool for, counted by every group's own `get_num_blocks_to_allocate` against the blocks it
    holds now (its allocation for this step already made), as `allocate_slots` counts them for a
    running request (no new hit). Mamba is asked with `apply_admission_cap=True`, which skips its
    checkpoint bookkeeping. The blocks `allocate_slots` frees first (skipped sliding/Mamba blocks) are
    not subtracted, so this never undercounts."""
    slot_tokens = min(end + num_new_tokens + num_lookahead_tokens, max_model_len)
    prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)
    if manager.coordinator.retention_interval != 0:
        prefill_end = 0
    empty = manager.empty_kv_cache_blocks.blocks
    total = 0
    for group_id, group_manager in enumerate(manager.coordinator.single_type_managers):
        total += group_manager.get_num_blocks_to_allocate(
            request.request_id, slot_tokens, empty[group_id], end, end, end + num_new_tokens,
            apply_admission_cap=isinstance(group_manager, MambaManager), prefill_end=prefill_end,
        )
    return total


def token_blocks(manager: KVCacheManager, num_tokens: int) -> int:
    """Blocks `num_tokens` tokens take in the groups that grow with the sequence (not Mamba, whose
    count in align mode is a few blocks whatever the length): the difference between two siblings'
    needs."""
    return sum(
        cdiv(num_tokens, group_manager.block_size)
        for group_manager in manager.coordinator.single_type_managers
        if not isinstance(group_manager, MambaManager)
    )


def sibling_probe_unsupported_reason(manager: KVCacheManager) -> str | None:
    """Why `cached_past` cannot tell, for this cache layout, that a hit ends where another's did (None:
    it can). It can where every prefix-cached group is Mamba or plain full attention (whose hit is a
    run of cached blocks from the start), with no EAGLE block drop and no context-parallel sharding."""
    groups = getattr(manager.coordinator, "attention_groups", None)
    if groups is None:
        return "the KV-cache coordinator has no per-spec groups"
    for group in groups:
        group_manager = manager.coordinator.single_type_managers[group.group_ids[0]]
        if group.manager_cls is MambaManager:
            continue
        if group.manager_cls is not FullAttentionManager or not isinstance(group.spec, FullAttentionSpec):
            return f"a {group.manager_cls.__name__} group's hit is not a run of blocks from the start"
        if group.use_eagle:
            return "the EAGLE block drop moves a hit off its last cached block"
        if group_manager.dcp_world_size > 1 or group_manager.pcp_world_size > 1:
            return "context parallelism shards the blocks a hit is counted in"
    return None


def cached_past(manager: KVCacheManager, block_hashes: Sequence, num_tokens: int, max_hit_tokens: int) -> bool:
    """Whether a prefix-cache lookup of `block_hashes` could find full-attention blocks past
    `num_tokens` (with its hit capped at `max_hit_tokens`): one dict look-up per hash unit of the
    next block, whatever the depth.

    vLLM's full-attention finder takes cached blocks from the start while the next one is cached, then
    (partial hits) probes the hash units inside the first block that is not; hashes are chained, so a
    request none of whose hash units in that next block is cached cannot hit past `num_tokens`. A True
    may be a block the finder would not take (it then only costs the caller a full lookup).
    Valid where `sibling_probe_unsupported_reason` is None.
    """
    coordinator = manager.coordinator
    hash_block_size = coordinator.hash_block_size
    first = num_tokens // hash_block_size
    for group in coordinator.attention_groups:
        if group.manager_cls is MambaManager:
            continue
        group_manager = coordinator.single_type_managers[group.group_ids[0]]
        block_size = group_manager.block_size
        # The hash of the block containing position num_tokens is its last hash unit's.
        end = (num_tokens // block_size + 1) * (block_size // hash_block_size)
        stop = min(end, max_hit_tokens // hash_block_size, len(block_hashes))
        pool = group_manager.block_pool
        for index in range(first, stop):
            if pool.get_cached_block(block_hashes[index], group.group_ids):
                return True
    return False


@contextmanager
def _same_step_state_hidden(manager: KVCacheManager, hit_blocks: Sequence[Sequence], num_hit_tokens: int):
    # The scheduler is single-threaded and the hashes go back before anyone else can look.
    hidden = []
    for group_id in blocking_state_groups(manager, hit_blocks, num_hit_tokens):
        group_manager = manager.coordinator.single_type_managers[group_id]
        block_hash = _blocks_offered(manager, group_id, hit_blocks[group_id], num_hit_tokens)[-1].block_hash
        group_manager.cached_blocks_this_step.discard(block_hash)
        hidden.append((group_manager, block_hash))
    try:
        yield
    finally:
        for group_manager, block_hash in hidden:
            group_manager.cached_blocks_this_step.add(block_hash)


def _blocks_offered(
    manager: KVCacheManager, group_id: int, blocks: Sequence, num_hit_tokens: int
) -> Sequence:
    # allocate_slots keeps only the blocks that cover the hit for groups that retain longer hits.
    if group_id in manager.retained_hit_group_ids:
        block_size = manager.coordinator.single_type_managers[group_id].block_size
        return blocks[: cdiv(num_hit_tokens, block_size)]
    return blocks
