"""Mamba-2's selective state-space scan (SSD) for packed rows: chunked prefill, recurrent decode.

Per head, with state S [P, N], scalar decay a_t = dt_t * A <= 0 and B_t, C_t shared by a group:
    S_t = exp(a_t) S_{t-1} + (dt_t x_t) B_t^T,     y_t = S_t C_t  (+ D x_t, added by the caller)

Chunked form (cum = cumulative a inside a chunk, L_ij = exp(cum_i - cum_j) for j <= i):
    Y = ((C B^T) * L) (dt X)  +  exp(cum) * (C S^T);   S <- exp(cum_C) S + (dt X * exp(cum_C - cum))^T B
Heads are kept as [groups, heads per group] so B and C are never copied per head. With dependent
rows (SPEC §15) the scan runs once per recurrent level of the call: dependents of multi-token producers
are folded into their producers' scan, only a 1-token producer's dependents open a level (gated_delta.py).
"""

from __future__ import annotations

import functools

import torch

from .batch import BatchContext, Level
from .cache import ModelCache
from .chunk_plan import ChunkPlan, blocked_scan, decay_exp, decay_mask
from .states import initial_states, save_states
from .threads import run_scan, shape_class, split_heads


def ssd_scan(x: torch.Tensor, dt: torch.Tensor, a_log_neg: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
             batch: BatchContext, cache: ModelCache, layer: int, chunk: int) -> torch.Tensor:
    """x [N, H, P], dt [N, H] (after softplus), A [H] (< 0), B, C [N, G, S] -> y [N, H, P] fp32 (no D)."""
    pool = cache.rec[layer]
    groups = b.shape[1]
    xdt = x.float() * dt.float()[..., None]
    decay = dt.float() * a_log_neg.float()
    args = [xdt, decay, b.float(), c.float()]
    out = x.new_empty(x.shape, dtype=torch.float32)
    in_place = batch.states_in_place if not x.is_cuda else None
    if in_place is not None:   # a decode round: every row steps its own slot (batch.py)
        def step() -> None:
            with batch.levels[0].timed():
                _decode_in_place(args, in_place, pool, out, groups)
        run_scan(shape_class("ssd", x.shape[0], len(batch.rows)), step, x.is_cuda)
        return out
    init = initial_states(pool, batch)             # every row's state read before any is written

    per_group = x.shape[1] // groups

    def scan() -> None:
        for level in batch.levels:
            with level.timed():
                if level.decode_rows:
                    _decode(args, init, level, pool, out, groups)
                if level.prefill_rows:
                    plan = level.scan_plan(chunk)
                    if plan.timer is not None or x.is_cuda:   # the fold's own calls timed: one thread
                        _prefill(args, init, plan, pool, out, groups)
                        continue
                    plan.prepare()   # its lazily built parts made before the threads share it

                    def part(lo: int, hi: int, plan: ChunkPlan = plan) -> None:   # groups lo..hi-1
                        h0, h1 = lo * per_group, hi * per_group
                        sub = [args[0][:, h0:h1], args[1][:, h0:h1], args[2][:, lo:hi], args[3][:, lo:hi]]
                        _prefill(sub, init[:, h0:h1], plan, pool[:, h0:h1], out[:, h0:h1], hi - lo)
                    split_heads(groups, part)   # groups of heads in parallel ranges (threads.py)

    run_scan(shape_class("ssd", x.shape[0], len(batch.rows)), scan, x.is_cuda)
    return out


def _decode(args, init, level: Level, pool, out, groups: int) -> None:
    """One token per row, the recurrence in place on the rows' own copies of their states (`init`'s
    rows): decay, the rank-1 write (B shared by a group's heads, broadcast, never copied per head)
    and the read by C, with no state-sized temporary."""
    idx = level.decode_token_index
    xdt, decay, b, c = (t[idx] for t in args)
    r, heads, p = xdt.shape
    s = level.decode_states(init)                                  # [R, H, P, S], this call's own copy
    s.mul_(decay_exp(decay)[..., None, None])
    sg = s.view(r, groups, heads // groups, p, -1)
    sg.addcmul_(xdt.view(r, groups, heads // groups, p)[..., None], b[:, :, None, None, :])
    out[idx] = _read(sg, c[:, :, None, None, :]).view(r, heads, p)
    save_states(pool, level.decode_captures[1], level.decode_saved(s))
    if level.decode_hands is not None:  # a dependent's initial state: read when its level runs
        local, deps = level.decode_hands
        init.index_copy_(0, deps, s[local])


def _read(s: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """y = S C per head, as a product and a sum over the state dim: each head's [P, S] times an S-vector is
    a GEMV that torch's batched matmul runs at a quarter of this speed (40 heads of 80 x 128 at one row:
    155 against 39 us, and closer to float64)."""
    return torch.sum(s * c, -1)


def _decode_in_place(args, slots: list[tuple[int, list[int]]], pool, out, groups: int) -> None:
    """`_decode` on each row's state where it lies in the pool (`BatchContext.states_in_place`): the same
    operations on each row's heads, no gather into a batch and no write back; the stepped state is then
    copied into the row's other capture slots, if any."""
    xdt, decay, b, c = args                                        # one token a row
    r, heads, p = xdt.shape
    dec = decay_exp(decay)[..., None, None]
    xg = xdt.view(r, groups, heads // groups, p)[..., None]
    for i, (slot, extra) in enumerate(slots):
        s = pool[slot]                                             # [H, P, S], a view
        s.mul_(dec[i])
        sg = s.view(groups, heads // groups, p, -1)
        sg.addcmul_(xg[i], b[i, :, None, None, :])
        out[i] = _read(sg, c[i, :, None, None, :]).view(heads, p)
        for e in extra:
            pool[e].copy_(s)


def _prefill(args, init, plan: ChunkPlan, pool, out, groups: int) -> None:
    xdt, decay, b, c = args
    # two packing passes instead of four: per-head inputs together, per-group inputs together
    heads_in = plan.to_chunks([xdt, decay])                  # [M, H, C, P + 1]
    xdt, decay = heads_in[..., :-1], heads_in[..., -1]
    b, c = plan.to_chunks([b, c]).chunk(2, dim=-1)          # [M, G, C, S] each
    m, heads, clen, p = xdt.shape
    xdt = xdt.reshape(m, groups, heads // groups, clen, p)
    decay = decay.reshape(m, groups, heads // groups, clen)
    rows = plan.row_index
    state = init[rows].view(len(plan.rows), groups, heads // groups, p, -1)
    y = torch.empty_like(xdt)
    # outputs and states written in place (y rides along as an input: gated_delta.py); C S^T of every
    # step into one buffer
    cs_buf = xdt.new_empty(len(plan.rows), groups, clen, heads // groups * p)
    step = functools.partial(_scan_chunk, cs_buf=cs_buf)
    blocked_scan(plan, (xdt, decay, b, c, y), state, _intra_chunk, step, y,
                 lambda local, slots: save_states(pool, slots, state[local].flatten(1, 2)),
                 lambda local, deps: init.index_copy_(0, deps, state[local].flatten(1, 2)))
    plan.from_chunks(y.view(m, heads, clen, p), out)


def _intra_chunk(xdt, decay, b, c, y):
    """State-independent parts for all chunks: xdt [M,G,Hg,C,P], decay [M,G,Hg,C], b, c [M,G,C,S]
    (`y`, the output chunks, passes through to the step)."""
    clen = xdt.shape[3]
    cum = decay.cumsum(-1)
    # the [M, G, Hg, C, C] decay mask is the scan's largest tensor: made once, then updated in place
    seg = decay_mask(cum)
    cb = (c @ b.transpose(-1, -2))[:, :, None]                          # [M, G, 1, C, C]
    y_intra = seg.mul_(cb) @ xdt
    # the state's increment per chunk: one product per group over all its heads ([Hg * P, C] x [C, S]),
    # the decayed inputs written head-inner so that no copy of B per head is made
    m, g, hg, _, p = xdt.shape
    xw = xdt.new_empty(m, g, clen, hg, p)
    torch.mul(xdt, decay_exp(cum[..., -1:] - cum)[..., None], out=xw.permute(0, 1, 3, 2, 4))
    d_state = (xw.view(m, g, clen, hg * p).transpose(-1, -2) @ b).view(m, g, hg, p, -1)   # [M, G, Hg, P, S]
    return y_intra, d_state, decay_exp(cum), decay_exp(cum[..., -1]), c, y


def _scan_chunk(s, y_intra, d_state, decay_in, decay_chunk, c, y, cs_buf):
    """Apply one chunk to states s [R, G, Hg, P, S] IN PLACE and write its outputs into y.

    C S^T for all heads of a group in one product ([C, S] x [S, Hg * P]), no copy of C per head, into
    the scan's one buffer; the same operations as the allocating form, so the same bits."""
    r, g, hg, p, n = s.shape
    cs = torch.matmul(c, s.view(r, g, hg * p, n).transpose(-1, -2), out=cs_buf[:r])
    cs = cs.view(r, g, -1, hg, p).transpose(2, 3)
    torch.addcmul(y_intra, cs, decay_in[..., None], out=y)
    torch.addcmul(d_state, s, decay_chunk[..., None, None], out=s)
    return y, s
