"""Partial prefix hits in `--snapshot-mode vllm-align` (vLLM's `--prefix-match-unit` below the block).

With a hash block U < B vLLM 0.33 turns on `mamba_partial_cache_hit` (v1/core/sched/scheduler.py;
`partial_hash_hits_enabled`, v1/core/kv_cache_utils.py). What changes, and where it is modelled:
- the split stops at the prompt's last hash boundary ⌊(N−1)/U⌋·U unless the final chunk exports the
  checkpoint internally, and that checkpoint sits at U granularity (`core/vllm_split.py`);
- the state there is cached as a partial entry: `MambaManager._cache_partial_tail_block` keys it when
  a chunk ends exactly at that boundary, or re-keys the prefill-checkpoint block at the exported
  position when it is the prompt's checkpoint; the attention group keeps the partial block's K/V
  (`FullAttentionManager._cache_partial_tail_block`). Only that boundary, no other depth inside a
  block, is ever a partial entry. Here: a tail snapshot (`capture_partial`: a slot, and the partial
  page shared with the branch that wrote it), found by the exact-depth lookup
  (`RadixIndex.exact_boundary`), as `MambaManager.find_longest_cache_hit` probes the fine hashes right
  to left; a hit copies that page (vLLM's copy-on-write of the partial block);
- the producer of a tail-stop state keeps it in the block it runs on (the snapshot takes its working
  slot); when it runs on, vLLM copies the entry out in that step and defers hits on it for the step
  (`continue_partial`: a new working slot, the snapshot pending again);
- `mamba_shared_prefix_checkpoint` stays off: it also needs `enable_mamba_shared_prefix_checkpoint`
  (opt-in, default False), so junctions stay block-floored.
"""

from __future__ import annotations

from typing import Protocol

from radixflow.core.branch import Branch
from radixflow.core.checkpoints import SchedulerPools, anchor
from radixflow.core.vllm_split import tail_boundary


class PartialPools(SchedulerPools, Protocol):
    unit: int  # vLLM's hash block (prefix-match unit)


def capture_partial(s: PartialPools, b: Branch, start: int, end: int, ckpt: int | None, now: float,
                    out: list[tuple[int, int]], copies: list[tuple[int, int]]) -> int | None:
    """The row [start, end) of `b` caches the prompt's partial tail state when it ends there (a
    tail-boundary stop) or exports it from inside (`ckpt`); a boundary on a block is an ordinary
    snapshot, made by the caller.

    The partial entry's K/V is the branch's own last page, shared as vLLM shares the block (the branch
    keeps appending past the boundary): the snapshot owns that page and the branch holds a lock on the
    snapshot until it leaves (a branch long enough to fill that page gives the snapshot a copy, in
    `copies`). An exported checkpoint goes to a block of its own (vLLM reserves one): a
    new slot. A tail-boundary stop leaves the state in the block the branch runs on, so the branch's
    working slot becomes the snapshot's until it runs on (`continue_partial`): that slot is returned
    (the row's end state goes there; the caller appends it last) and the branch has no working slot."""
    tail = tail_boundary(b.prompt_len, s.block_size, s.unit)
    depth = ckpt if ckpt is not None else end
    tr = b.sched
    if depth != tail or depth <= start or depth % s.block_size == 0 or tr.working is None or tr.partial_tail:
        return None
    node = anchor(s, b, depth)
    if node is None:
        return None
    key = tuple(b.tokens[node.depth : depth])
    own = tr.page_table[depth // s.block_size]
    if s.index.find_tail(node, key) is not None or own not in tr.private:
        return None
    # A branch that will fill the page registers it in the tree: the snapshot gets a copy instead.
    share = (b.prompt_len + b.max_new_tokens - 1) // s.block_size == depth // s.block_size
    stop = ckpt is None
    if not s.ensure(int(not share), int(not stop)):
        return None
    slot = tr.working if stop else s.slots.allocate_one()
    page = own if share else s.pages.allocate_one()
    snap = s.index.attach_tail(node, key, slot, page, b.uid, now)
    if share:
        tr.private.discard(page)
    else:
        copies.append((own, page))
    snap.level = tr.level
    snap.lock += 1
    tr.partial_tail = snap
    if not stop:
        out.append((depth - start, slot))
        return None
    tr.working = None
    return slot


def continue_partial(s: PartialPools, b: Branch, start: int) -> int:
    """`b` runs on from the tail-boundary state its working slot became: vLLM's copy-on-write of that
    state (`MambaManager.allocate_new_blocks` with the producer in `_partial_hit_reqs`) moves the cache
    entry to a new block and defers same-step hits on it (`cached_blocks_this_step`). Here the branch
    gets a new working slot (the caller made room) and reads its state from the snapshot, which is
    pending again for this round. Returns the slot to read the state from."""
    snap = b.sched.partial_tail
    b.sched.working = s.slots.allocate_one()
    if snap.depth == start and snap.published:
        s.index.hold(snap, b.uid)
    return snap.slot


def release_partial(b: Branch) -> None:
    """`b` leaves (finished or preempted): its partial tail stays cached, unlocked, owning the page."""
    tr = b.sched
    if tr.partial_tail is not None:
        tr.partial_tail.lock -= 1
        tr.partial_tail = None
