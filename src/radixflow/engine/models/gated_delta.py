"""The gated delta rule (Gated DeltaNet's recurrence) for packed rows: chunked prefill, recurrent decode.

Per head, with state S [dk, dv], log-decay g_t <= 0 and write strength beta_t:
    S_t = exp(g_t) S_{t-1} + k_t u_t^T,   u_t = beta_t (v_t - (exp(g_t) S_{t-1})^T k_t),   o_t = S_t^T q_t

Chunked form (chunk of C tokens, G = cumulative g inside the chunk, Gamma_ij = exp(G_i - G_j)):
    (I + A) U = beta V,  (I + A) W = beta exp(G) K,   A_ij = beta_i Gamma_ij k_i.k_j  for j < i
    U' = U - W S;   O = (Q exp(G)) S + (Q K^T * Gamma, j <= i) U';   S <- exp(G_C) S + (K exp(G_C - G))^T U'
The intra-chunk part is batched over the chunks of all rows (in cache-sized blocks on CPU); only the
short state update loops, one step per chunk position. With dependent rows (SPEC §15) the scan runs
once per recurrent level of the call (batch.py `row_levels`): a dependent of a multi-token producer is
folded into its producer's scan (chunk_plan.py: further rows of the same plan, starting from the
producer's state at their depth), so a call whose producers are all multi-token rows runs it once;
only a 1-token (decode) producer's dependents form a level of their own, to which the level before
hands its rows' states at the dependents' depths.
"""

from __future__ import annotations

import torch

from .batch import BatchContext, Level
from .cache import ModelCache
from .chunk_plan import ChunkPlan, blocked_scan, decay_exp, decay_mask
from .states import initial_states, save_states
from .threads import run_scan, shape_class, split_heads


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     batch: BatchContext, cache: ModelCache, layer: int, chunk: int = 64) -> torch.Tensor:
    """q, k [N, H, dk] (normalised, q pre-scaled), v [N, H, dv], g, beta [N, H] -> o [N, H, dv] fp32."""
    pool = cache.rec[layer]
    out = v.new_empty(v.shape, dtype=torch.float32)
    args = [t.float() for t in (q, k, v, g, beta)]
    in_place = batch.states_in_place if not q.is_cuda else None
    if in_place is not None:   # a decode round: every row steps its own slot (batch.py)
        def step() -> None:
            with batch.levels[0].timed():
                _decode_in_place(args, in_place, pool, out)
        run_scan(shape_class("gdn", q.shape[0], len(batch.rows)), step, q.is_cuda)
        return out
    init = initial_states(pool, batch)          # every row's state read before any is written

    def scan() -> None:
        for level in batch.levels:
            with level.timed():
                if level.decode_rows:
                    _decode(args, init, level, pool, out)
                if level.prefill_rows:
                    plan = level.scan_plan(chunk)
                    if plan.timer is not None or q.is_cuda:   # the fold's own calls timed: one thread
                        _prefill(args, init, plan, pool, out)
                        continue
                    plan.prepare()   # its lazily built parts made before the threads share it

                    def part(lo: int, hi: int, plan: ChunkPlan = plan) -> None:
                        _prefill([t[:, lo:hi] for t in args], init[:, lo:hi], plan, pool[:, lo:hi], out[:, lo:hi])
                    split_heads(v.shape[1], part)   # heads in parallel ranges (threads.py)

    run_scan(shape_class("gdn", q.shape[0], len(batch.rows)), scan, q.is_cuda)
    return out


def _decode(args: list[torch.Tensor], init: torch.Tensor, level: Level, pool: torch.Tensor,
            out: torch.Tensor) -> None:
    """One token per row: the recurrence itself, batched over the decode rows, in place on the rows' own
    copies of their states (`init`'s rows): decay, the rank-1 write and the read with no state-sized
    temporary."""
    idx = level.decode_token_index
    q, k, v, g, beta = (t[idx] for t in args)
    s = level.decode_states(init)                                  # [R, H, dk, dv], this call's own copy
    s.mul_(decay_exp(g)[..., None, None])
    r, h, dk, dv = s.shape
    flat = s.view(r * h, dk, dv)
    sk = torch.bmm(k.reshape(r * h, 1, dk), flat)                  # k^T S  [R*H, 1, dv]
    u = (v.reshape(r * h, 1, dv) - sk).mul_(beta.reshape(r * h, 1, 1))
    flat.baddbmm_(k.reshape(r * h, dk, 1), u)                      # S += k u^T
    out[idx] = torch.bmm(q.reshape(r * h, 1, dk), flat).view(r, h, dv)
    save_states(pool, level.decode_captures[1], level.decode_saved(s))
    if level.decode_hands is not None:  # a dependent's initial state: read when its level runs
        local, deps = level.decode_hands
        init.index_copy_(0, deps, s[local])


def _decode_in_place(args: list[torch.Tensor], slots: list[tuple[int, list[int]]], pool: torch.Tensor,
                     out: torch.Tensor) -> None:
    """`_decode` on each row's state where it lies in the pool (`BatchContext.states_in_place`): the same
    operations on each row's heads, no gather of the states into a batch and no write back, then the
    stepped state copied into the row's other capture slots, if any."""
    q, k, v, g, beta = args                                        # [R, H, d]: one token a row
    decay = decay_exp(g)[..., None, None]
    for i, (slot, extra) in enumerate(slots):
        s = pool[slot]                                             # [H, dk, dv], a view
        s.mul_(decay[i])
        sk = torch.bmm(k[i, :, None], s)                           # k^T S  [H, 1, dv]
        u = (v[i, :, None] - sk).mul_(beta[i, :, None, None])
        s.baddbmm_(k[i, :, :, None], u)                            # S += k u^T
        torch.bmm(q[i, :, None], s, out=out[i, :, None])
        for e in extra:
            pool[e].copy_(s)


def _prefill(args: list[torch.Tensor], init: torch.Tensor, plan: ChunkPlan, pool: torch.Tensor,
             out: torch.Tensor) -> None:
    # one packing pass for all five inputs: [N, H, dk + dk + dv + 2] -> [M, H, C, ...]
    dk, dv = args[0].shape[-1], args[2].shape[-1]
    packed = plan.to_chunks(args)
    q, k, v, g, beta = packed.split([dk, dk, dv, 1, 1], dim=-1)
    g, beta = g[..., 0], beta[..., 0]
    rows = plan.row_index
    state = init[rows]
    m, h, c = q.shape[:3]
    # per chunk [U'; O] (2C x dv): the step writes both in one product, its states into `state` in place;
    # `res` rides along as an input, so the step receives its own chunks of it (blocked_scan's copy-back
    # is then a no-op)
    res = v.new_empty(m, h, 2 * c, dv)
    blocked_scan(plan, (q, k, v, g, beta, res), state, _intra_chunk, _scan_chunk, res,
                 lambda local, slots: save_states(pool, slots, state[local]),
                 lambda local, deps: init.index_copy_(0, deps, state[local]))
    plan.from_chunks(res[:, :, c:], out)


def _intra_chunk(q, k, v, g, beta, res):
    """Everything that does not depend on the incoming state, for all chunks at once (`res`, the
    step's output chunks, passes through to it).

    U and W by one triangular solve, and per chunk `z` = [[U, W], [0, -Q_dec]] (2C x (dv + dk)), so that
    the step's first product [U; 0] - [W; -Q_dec] S gives U' = U - W S and Q_dec S together.
    (An explicit (I + A)^-1 times [beta V, beta exp(G) K] is ~3x cheaper than the solve on CPU and as
    close to float64 on real widths, but it moves the tiny test models' logits differently at each
    chunk size, past test_handoff_calibration's 1.5x bound between chunk sizes: not used.)"""
    c, dv = q.shape[2], v.shape[-1]
    cum = g.cumsum(-1)                                                    # [M, H, C]
    gamma = decay_mask(cum)
    k_beta = k * beta[..., None]
    a = torch.matmul(k_beta, k.transpose(-1, -2)).mul_(gamma)
    decay_in = decay_exp(cum)[..., None]
    z = q.new_empty(*q.shape[:2], 2 * c, dv + k.shape[-1])
    rhs = z[:, :, c:]                     # beta [V, exp(G) K], then overwritten by [0, -Q_dec]
    torch.mul(v, beta[..., None], out=rhs[..., :dv])
    torch.mul(k_beta, decay_in, out=rhs[..., dv:])
    z[:, :, :c] = _solve_unit_lower(a, rhs)                               # [U, W]
    rhs[..., :dv].zero_()
    torch.mul(q, decay_in.neg(), out=rhs[..., dv:])
    qk = torch.matmul(q, k.transpose(-1, -2)).mul_(gamma)
    k_dec = k * decay_exp(cum[..., -1:] - cum)[..., None]
    return z, qk, k_dec, decay_exp(cum[..., -1]), res


def _solve_unit_lower(a: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """(I + A) X = rhs for the strictly lower A of `a` (upper=False ignores what is above the diagonal,
    unitriangular=True takes the diagonal as 1), batched over the chunks. On CPU with one thread: torch
    runs the batch as one LAPACK trsm per C x C matrix, and a multi-threaded MKL starts its threads for
    each of these tiny calls (docs/engine_speed.md: ~40x slower on 2 cores than on one). (Solving into
    a slice of z with `out=` was tried: torch then solves in a column-major copy and copies it back,
    x0.7 on one layer.)"""
    threads = torch.get_num_threads()
    if a.is_cuda or threads == 1:
        return torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)
    torch.set_num_threads(1)
    try:
        return torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)
    finally:
        torch.set_num_threads(threads)


def _scan_chunk(s, z, qk, k_dec, decay, res):
    """Apply one chunk to states s [R, H, dk, dv] IN PLACE and write [U'; O] into res [R, H, 2C, dv].

    Four batched kernels over the R * H heads (each is a parallel region the sequential scan waits on):
    [U'; Q_dec S] = [U; 0] - [W; -Q_dec] S in one product, O = Q_dec S + QK U' in place, then
    S <- exp(G_C) S + K_dec^T U'. No allocation: the outputs go to the caller's chunks."""
    r, h, dk, dv = s.shape
    s3 = s.view(r * h, dk, dv)
    z3 = z.flatten(0, 1)
    r3 = res.view(r * h, -1, dv)
    c = r3.shape[1] // 2
    torch.baddbmm(z3[..., :dv], z3[..., dv:], s3, alpha=-1.0, out=r3)
    u = r3[:, :c]
    r3[:, c:].baddbmm_(qk.flatten(0, 1), u)
    s3.mul_(decay.reshape(-1, 1, 1)).baddbmm_(k_dec.flatten(0, 1).transpose(1, 2), u)
    return res, s
