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

import functools

import torch

from .batch import BatchContext, Level
from .cache import ModelCache
from .chunk_plan import ChunkPlan, blocked_scan
from .states import initial_states, save_states
from .threads import run_scan, shape_class


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     batch: BatchContext, cache: ModelCache, layer: int, chunk: int = 64) -> torch.Tensor:
    """q, k [N, H, dk] (normalised, q pre-scaled), v [N, H, dv], g, beta [N, H] -> o [N, H, dv] fp32."""
    pool = cache.rec[layer]
    init = initial_states(pool, batch)          # every row's state read before any is written
    out = v.new_empty(v.shape, dtype=torch.float32)
    args = [t.float() for t in (q, k, v, g, beta)]

    def scan() -> None:
        for level in batch.levels:
            with level.timed():
                if level.decode_rows:
                    _decode(args, init, level, pool, out)
                if level.prefill_rows:
                    _prefill(args, init, level.scan_plan(chunk), pool, out)

    run_scan(shape_class("gdn", q.shape[0], len(batch.rows)), scan, q.is_cuda)
    return out


def _decode(args: list[torch.Tensor], init: torch.Tensor, level: Level, pool: torch.Tensor,
            out: torch.Tensor) -> None:
    """One token per row: the recurrence itself, batched over the decode rows."""
    idx = level.decode_token_index
    q, k, v, g, beta = (t[idx] for t in args)
    rows = level.decode_row_index
    s = init[rows] * g.exp()[..., None, None]
    u = beta[..., None] * (v - torch.einsum("rhk,rhkv->rhv", k, s))
    s = s + k[..., :, None] * u[..., None, :]
    out[idx] = torch.einsum("rhk,rhkv->rhv", q, s)
    local, slots = level.decode_captures
    save_states(pool, slots, s[local])
    if level.decode_hands is not None:  # a dependent's initial state: read when its level runs
        local, deps = level.decode_hands
        init.index_copy_(0, deps, s[local])


def _prefill(args: list[torch.Tensor], init: torch.Tensor, plan: ChunkPlan, pool: torch.Tensor,
             out: torch.Tensor) -> None:
    # one packing pass for all five inputs: [N, H, dk + dk + dv + 2] -> [M, H, C, ...]
    dk, dv = args[0].shape[-1], args[2].shape[-1]
    packed = plan.to_chunks(args)
    q, k, v, g, beta = packed.split([dk, dk, dv, 1, 1], dim=-1)
    g, beta = g[..., 0], beta[..., 0]
    rows = plan.row_index
    state = init[rows]
    o = torch.empty_like(v)
    # the step writes its outputs into `o` and its states into `state` in place: `o` rides along as an
    # input, so the step receives its own chunks of it (blocked_scan's copy-back is then a no-op)
    u_buf = v.new_empty(len(plan.rows) * v.shape[1], v.shape[2], dv)
    step = functools.partial(_scan_chunk, u_buf=u_buf)
    blocked_scan(plan, (q, k, v, g, beta, o), state, _intra_chunk, step, o,
                 lambda local, slots: save_states(pool, slots, state[local]),
                 lambda local, deps: init.index_copy_(0, deps, state[local]))
    flat = o.transpose(1, 2).reshape(-1, o.shape[1], o.shape[-1])      # [M*C, H, dv]
    out.index_copy_(0, plan.token_index, flat.index_select(0, plan.flat_index))


def _intra_chunk(q, k, v, g, beta, o):
    """Everything that does not depend on the incoming state, for all chunks at once (`o`, the
    output chunks, passes through to the step)."""
    c = q.shape[2]
    cum = g.cumsum(-1)                                                    # [M, H, C]
    lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    gamma = (cum[..., :, None] - cum[..., None, :]).masked_fill(~lower, float("-inf")).exp()
    # only the strictly lower triangle of `a` is read: upper=False ignores what is above the
    # diagonal and unitriangular=True takes the diagonal as 1, which is exactly (I + A)
    k_beta = k * beta[..., None]
    a = (k_beta @ k.transpose(-1, -2)) * gamma
    decay_in = cum.exp()
    rhs = torch.cat((v * beta[..., None], k_beta * decay_in[..., None]), dim=-1)
    sol = _solve_unit_lower(a, rhs)
    u, w = sol[..., :v.shape[-1]], sol[..., v.shape[-1]:]
    qk = (q @ k.transpose(-1, -2)) * gamma
    q_dec = q * decay_in[..., None]
    k_dec = k * (cum[..., -1:] - cum).exp()[..., None]
    return u, w, qk, q_dec, k_dec, cum[..., -1].exp(), o


def _solve_unit_lower(a: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """(I + A) X = rhs for the strictly lower A of `a`, batched over the chunks. On CPU with one thread:
    torch runs the batch as one LAPACK trsm per 64 x 64 matrix, and a multi-threaded MKL starts its
    threads for each of these tiny calls (docs/engine_speed.md: ~40x slower on 2 cores than on one)."""
    threads = torch.get_num_threads()
    if a.is_cuda or threads == 1:
        return torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)
    torch.set_num_threads(1)
    try:
        return torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)
    finally:
        torch.set_num_threads(threads)


def _scan_chunk(s, u, w, qk, q_dec, k_dec, decay, o, u_buf):
    """Apply one chunk to states s [R, H, dk, dv] IN PLACE and write its outputs into o [R, H, C, dv].

    Five batched products over the R * H heads (baddbmm adds the product in the same pass), as few
    kernels as the arithmetic allows (each is a parallel region the scan waits on), and no allocation:
    U - W S goes to the scan's one `u_buf`, the outputs to the caller's chunks, the states stay put.
    The same operations in the same order as the allocating form, so the same bits."""
    r, h, dk, dv = s.shape
    s3 = s.view(r * h, dk, dv)
    u = torch.baddbmm(u.flatten(0, 1), w.flatten(0, 1), s3, alpha=-1.0,
                      out=u_buf[:r * h])                              # U - W S
    o3 = o.view(r * h, -1, dv)
    torch.bmm(qk.flatten(0, 1), u, out=o3).baddbmm_(q_dec.flatten(0, 1), s3)      # QK U + Q_dec S
    s3.mul_(decay.reshape(-1, 1, 1)).baddbmm_(k_dec.flatten(0, 1).transpose(1, 2), u)
    return o, s
