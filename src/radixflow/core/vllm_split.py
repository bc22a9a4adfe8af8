"""vLLM 0.33's align-mode prefill split, as a pure function (`--snapshot-mode vllm-align`).

A transcription of `Scheduler._mamba_block_aligned_split` (v1/core/sched/scheduler.py) for the
configuration the simulator models: the prefix-match unit equals the block B (vLLM's default, so no
partial-hash tail stop), no EAGLE block drop, no hash look-ahead, no opt-in shared-prefix checkpoint.
What it keeps:
- a non-final chunk ends on a block boundary (state is written only at chunk ends);
- the prompt's last chunk stops at the last cacheable boundary ⌊(N−1)/B⌋·B, unless every state layer
  can export that checkpoint from inside the chunk (`is_mamba_prefill_checkpoint_valid`,
  v1/kv_cache_interface.py), in which case the chunk runs whole and the state there is saved anyway;
- a chunk that starts mid-block stops at the next boundary;
- the junction: when the KV hit runs deeper than the state hit (`shared_prefix_boundary` =
  longest single-group hit, `KVCacheManager.get_computed_blocks`), the chunk stops at its
  block-floored depth so the state there is cached for the next sibling.
"""

from __future__ import annotations


def checkpoint_valid(start: int, end: int, checkpoint: int, block: int) -> bool:
    """`is_mamba_prefill_checkpoint_valid` with hash block = Mamba block = B and alignment 1."""
    initial_col = (start - 1) // block
    checkpoint_col = -(-end // block) - 2
    return (start % block == 0 and checkpoint_col > initial_col and start + block <= checkpoint
            and start < checkpoint < end)


def internal_checkpoint(start: int, end: int, prompt_len: int, num_tokens: int, block: int,
                        exports: bool) -> int | None:
    """Depth of the state a final prefill chunk [start, end) exports from inside, or None."""
    prefill_end = max(prompt_len, num_tokens - 1)
    if not exports or start >= prefill_end or end < prefill_end:
        return None
    ckpt = (prefill_end - 1) // block * block
    return ckpt if checkpoint_valid(start, end, ckpt, block) else None


def aligned_split(start: int, n: int, prompt_len: int, num_tokens: int, block: int, max_tokens: int,
                  exports: bool, junction: int = 0) -> int:
    """Tokens vLLM schedules for a row that could take `n` from `start` (0: the row waits)."""
    prefill_end = max(prompt_len, num_tokens - 1)
    if start >= prefill_end:
        return n
    end = start + n
    last_cache = (num_tokens - 1) // block * block
    inside = internal_checkpoint(start, end, prompt_len, num_tokens, block, exports) is not None
    if inside:
        last_cache = 0
    if end < prefill_end:
        aligned = end // block * block
        if aligned > start or block <= max_tokens:
            end = aligned
    stops = (
        (start // block + 1) * block if start % block and not inside else 0,
        last_cache,
        start + (junction - start) // block * block if start < junction < end else 0,
    )
    end = min((s for s in stops if start < s < end), default=end)
    return max(end - start, 0)
