"""vLLM 0.33's align-mode prefill split, as a pure function (`--snapshot-mode vllm-align`).

A transcription of `Scheduler._mamba_block_aligned_split` (v1/core/sched/scheduler.py) for the
configuration the simulator models: no EAGLE block drop, no hash look-ahead, no opt-in shared-prefix
checkpoint. `unit` is vLLM's prefix-match unit (`hash_block_size`, `--prefix-match-unit`): the block B
by default; below B, partial hits are on (`mamba_partial_cache_hit`). What it keeps:
- a non-final chunk ends on a block boundary (state is written only at chunk ends);
- the prompt's last chunk stops at the last cacheable boundary ⌊(N−1)/B⌋·B, unless every state layer
  can export the prompt's checkpoint from inside the chunk (`is_mamba_prefill_checkpoint_valid`,
  v1/kv_cache_interface.py), in which case the chunk runs whole and the state there is saved anyway;
  the checkpoint sits at ⌊(N−1)/unit⌋·unit (`get_mamba_prefill_checkpoint_position` at
  `hash_block_size` when partial hits are on, else at B);
- with partial hits and no internal checkpoint, the "tail boundary" stop: the chunk also stops at the
  prompt's last hash boundary ⌊(N−1)/unit⌋·unit, so the state there is cached for a partial hit;
- a chunk that starts mid-block stops at the next boundary;
- the junction: when the KV hit runs deeper than the state hit (`shared_prefix_boundary` =
  longest single-group hit, `KVCacheManager.get_computed_blocks`), the chunk stops at its
  block-floored depth so the state there is cached for the next sibling.
"""

from __future__ import annotations


def checkpoint_position(num_tokens: int, unit: int) -> int:
    """`get_mamba_prefill_checkpoint_position` without EAGLE or look-ahead: the last `unit` boundary
    that leaves at least one token to compute."""
    return max((num_tokens - 1) // unit * unit, 0)


def checkpoint_valid(start: int, end: int, checkpoint: int, block: int, unit: int | None = None) -> bool:
    """`is_mamba_prefill_checkpoint_valid` with hash block `unit` (default B) and alignment 1 (Mamba-2's
    `prefill_checkpoint_alignment`, `MambaMixer2.get_kv_cache_spec`)."""
    unit = unit or block
    initial_col = (start - 1) // block
    checkpoint_col = -(-end // block) - 2
    return (start % unit == 0 and checkpoint_col > initial_col and start + unit <= checkpoint
            and start < checkpoint < end)


def internal_checkpoint(start: int, end: int, prompt_len: int, num_tokens: int, block: int,
                        exports: bool, unit: int | None = None) -> int | None:
    """Depth of the state a final prefill chunk [start, end) exports from inside, or None."""
    unit = unit or block
    prefill_end = max(prompt_len, num_tokens - 1)
    if not exports or start >= prefill_end or end < prefill_end:
        return None
    ckpt = checkpoint_position(prefill_end, unit)
    return ckpt if checkpoint_valid(start, end, ckpt, block, unit) else None


def tail_boundary(prompt_len: int, block: int, unit: int | None) -> int:
    """The prompt's last hash boundary, where a partial hit can resume (0: partial hits are off)."""
    return checkpoint_position(prompt_len, unit) if unit and unit < block else 0


def aligned_split(start: int, n: int, prompt_len: int, num_tokens: int, block: int, max_tokens: int,
                  exports: bool, junction: int = 0, unit: int | None = None) -> int:
    """Tokens vLLM schedules for a row that could take `n` from `start` (0: the row waits)."""
    prefill_end = max(prompt_len, num_tokens - 1)
    if start >= prefill_end:
        return n
    end = start + n
    last_cache = checkpoint_position(num_tokens, block)
    inside = internal_checkpoint(start, end, prompt_len, num_tokens, block, exports, unit) is not None
    if inside:
        last_cache = 0
    if end < prefill_end:
        aligned = end // block * block
        if aligned > start or block <= max_tokens:
            end = aligned
    tail = 0 if inside else tail_boundary(prompt_len, block, unit)
    stops = (
        (start // block + 1) * block if start % block and not inside else 0,
        last_cache,
        tail if last_cache < tail < prompt_len else 0,
        start + (junction - start) // block * block if start < junction < end else 0,
    )
    end = min((s for s in stops if start < s < end), default=end)
    return max(end - start, 0)
