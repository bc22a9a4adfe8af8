"""Depthwise causal conv1d over packed rows, each continuing from its saved input window.

The rows are laid out flat as `[saved K-1 inputs, tokens]` per row and convolved in one pass
without padding: a token's window never reaches past its own row's saved inputs, and the outputs
that straddle two rows are simply never read. The window after n tokens (a state snapshot) is a
slice of the same flat tensor. A dependent row's saved inputs (SPEC §15) are copied from its
producer's part of the same flat tensor, so all levels share the one pass.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .activations import Activation
from .batch import BatchContext
from .cache import ModelCache
from .states import initial_states, save_states


def causal_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, batch: BatchContext,
                cache: ModelCache, layer: int, act: Activation = F.silu) -> torch.Tensor:
    """x [N, C] -> act(conv(x)) [N, C]; saves the windows listed in state_out to cache.conv[layer].

    weight: [C, 1, K] (depthwise). cache.conv[layer]: [slots, K-1, C], token-major like the flat layout,
    so a window goes in and out by plain row copies (it was [slots, C, K-1]: a transposed copy each way,
    148 against 40 us a layer at one decode row of qwen3.5-0.8b's 6,144 channels).
    """
    kernel = weight.shape[-1]
    pool = cache.conv[layer]
    in_place = batch.states_in_place
    if in_place is not None and kernel > 1:   # a decode round: each row one token on its own slot
        out = _decode_conv(x, weight[:, 0, :].float(), pool, batch.state_in_index[0], in_place)
        if bias is not None:
            out += bias.float()
        return (F.silu(out, inplace=True) if act is F.silu else act(out)).to(x.dtype)
    plan = batch.conv_plan(kernel)
    init = initial_states(pool, batch)                        # [R, K-1, C]
    # fp32 whatever the model dtype: a bf16 running sum over K taps loses the small taps
    flat = x.new_empty(plan.total, x.shape[1], dtype=torch.float32)
    flat[plan.state_pos] = init.reshape(-1, x.shape[1]).float()
    w = weight[:, 0, :].float()                                # [C, K]
    out = _flat_conv(x, w, flat, plan)
    if bias is not None:
        out += bias.float()
    save_states(pool, plan.capture_slots, flat[plan.capture_pos])
    if act is F.silu:
        return F.silu(out, inplace=True).to(x.dtype)
    return act(out).to(x.dtype)


# tokens a block of the K multiply-adds on CPU: ~1.5 MB a block at Qwen3.5's / Nemotron-H's 6k / 5k
# channels, so the K passes re-read it from cache (one conv over case (b)'s 7.9k tokens at 5,248
# channels: 101 ms at 64 tokens against 114 ms at 2,048 on 2 threads, 179 vs 227 ms on 1)
CONV_BLOCK = 64


def _decode_conv(x: torch.Tensor, w: torch.Tensor, pool: torch.Tensor, slots: torch.Tensor,
                 in_place: list[tuple[int, list[int]]]) -> torch.Tensor:
    """One token a row (`BatchContext.states_in_place`): each row's window [K-1, C] read from its slot, the K
    multiply-adds in `_flat_conv`'s order (the same bits), the window shifted by the token written back
    to the slot and copied to the row's other capture slots. No flat layout, no index plans."""
    kernel = w.shape[1]
    win = torch.cat([pool.index_select(0, slots).float(), x.float()[:, None, :]], 1)   # [R, K, C]
    acc = torch.mul(win[:, 0], w[:, 0])
    for j in range(1, kernel):
        acc.addcmul_(win[:, j], w[:, j])
    kept = win[:, 1:].to(pool.dtype)
    pool.index_copy_(0, slots, kept)
    for i, (_, extra) in enumerate(in_place):
        for e in extra:
            pool[e].copy_(kept[i])
    return acc


def _flat_conv(x: torch.Tensor, w: torch.Tensor, flat: torch.Tensor, plan) -> torch.Tensor:
    """All rows in one pass over the flat layout: the tokens in and the outputs out by one index copy each."""
    kernel = w.shape[1]
    flat.index_copy_(0, plan.token_pos, x.float())
    if plan.hand_dst is not None:  # dependents continue from their producer's inputs (SPEC §15)
        flat[plan.hand_dst] = flat[plan.hand_src]
    # K shifted multiply-adds on the token-major layout: no transposes, no strided gathers
    span = plan.total - plan.width
    y = flat.new_empty(span, flat.shape[1])
    step = span if x.is_cuda else CONV_BLOCK  # token blocks keep the K passes in cache on CPU
    for lo in range(0, span, step):
        hi = min(lo + step, span)
        acc = torch.mul(flat[lo:hi], w[:, 0], out=y[lo:hi])
        for j in range(1, kernel):
            acc.addcmul_(flat[lo + j:hi + j], w[:, j])
    # y[j] covers inputs [j, j + K - 1], i.e. ends at the token at flat position j + K - 1
    return y.index_select(0, plan.token_pos - plan.width)
