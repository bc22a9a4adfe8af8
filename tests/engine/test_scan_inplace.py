"""The chunked scans' steps write outputs and states in place (gated_delta.py, ssd.py): the same bits as
the allocating steps they replaced (kept here as the reference), on rows of several lengths with captures."""

from __future__ import annotations

import torch

from radixflow.engine.models import gated_delta, ssd
from radixflow.engine.models.chunk_plan import blocked_scan, build_chunk_plan


def _gdn_step_allocating(s, u, w, qk, q_dec, k_dec, decay):
    r, h, dk, dv = s.shape
    s3 = s.reshape(r * h, dk, dv)
    u = torch.baddbmm(u.flatten(0, 1), w.flatten(0, 1), s3, alpha=-1.0)
    o = torch.baddbmm(torch.bmm(qk.flatten(0, 1), u), q_dec.flatten(0, 1), s3)
    s_new = torch.baddbmm(s3 * decay.reshape(-1, 1, 1), k_dec.flatten(0, 1).transpose(1, 2), u)
    return o.view(r, h, -1, dv), s_new.view(r, h, dk, dv)


def _ssd_step_allocating(s, y_intra, d_state, decay_in, decay_chunk, c):
    r, g, hg, p, n = s.shape
    cs = (c @ s.reshape(r, g, hg * p, n).transpose(-1, -2)).view(r, g, -1, hg, p).transpose(2, 3)
    y = torch.addcmul(y_intra, cs, decay_in[..., None])
    return y, torch.addcmul(d_state, s, decay_chunk[..., None, None])


def _plan(chunk: int):
    lengths = (300, 129, 64, 17)
    rows, off, slot = [], 0, 0
    for i, n in enumerate(lengths):
        cuts = [(k, slot + j) for j, k in enumerate(sorted({x for x in (128, n) if x <= n}))]
        slot += len(cuts)
        rows.append((i, off, n, cuts))
        off += n
    return build_chunk_plan(rows, chunk, off, torch.device("cpu")), off, slot


def _run_both(plan, inputs, state0, intra, step_inplace, step_ref, out_like, slots):
    results = []
    for inplace in (True, False):
        state = state0.clone()
        out = torch.empty_like(out_like)
        saved = torch.zeros(slots, *state.shape[1:])

        def save(local, at, state=state, saved=saved):
            saved.index_copy_(0, at, state[local])

        if inplace:
            blocked_scan(plan, (*inputs, out), state, intra, step_inplace, out, save)
        else:
            blocked_scan(plan, inputs, state, lambda *a: intra(*a, None)[:-1], step_ref, out, save)
        results.append((out, state, saved))
    (o1, s1, c1), (o2, s2, c2) = results
    assert torch.equal(o1, o2) and torch.equal(s1, s2) and torch.equal(c1, c2)
    assert o1.abs().sum() > 0 and c1.abs().sum() > 0   # something was computed and captured


def test_gated_delta_step_in_place_is_bit_identical():
    import functools

    g = torch.Generator().manual_seed(0)
    plan, n_tok, slots = _plan(64)
    h, dk, dv = 3, 16, 24
    q = torch.nn.functional.normalize(torch.randn(n_tok, h, dk, generator=g), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(n_tok, h, dk, generator=g), dim=-1)
    v = torch.randn(n_tok, h, dv, generator=g)
    gg, beta = -0.3 * torch.rand(n_tok, h, generator=g), torch.rand(n_tok, h, generator=g)
    q, k, v, gg, beta = plan.to_chunks([q, k, v, gg, beta]).split([dk, dk, dv, 1, 1], dim=-1)
    inputs = (q, k, v, gg[..., 0], beta[..., 0])
    state0 = torch.randn(len(plan.rows), h, dk, dv, generator=g)
    u_buf = torch.empty(len(plan.rows) * h, 64, dv)
    _run_both(plan, inputs, state0, gated_delta._intra_chunk,
              functools.partial(gated_delta._scan_chunk, u_buf=u_buf), _gdn_step_allocating,
              torch.empty_like(v), slots)


def test_ssd_step_in_place_is_bit_identical():
    import functools

    g = torch.Generator().manual_seed(1)
    plan, n_tok, slots = _plan(32)
    groups, hg, p, n = 2, 3, 8, 12
    xdt = torch.randn(n_tok, groups * hg, p, generator=g)
    decay = -0.5 * torch.rand(n_tok, groups * hg, generator=g)
    b, c = torch.randn(n_tok, groups, n, generator=g), torch.randn(n_tok, groups, n, generator=g)
    heads_in = plan.to_chunks([xdt, decay])
    m, _, clen, _ = heads_in.shape
    xdt = heads_in[..., :-1].reshape(m, groups, hg, clen, p)
    decay = heads_in[..., -1].reshape(m, groups, hg, clen)
    b, c = plan.to_chunks([b, c]).chunk(2, dim=-1)
    state0 = torch.randn(len(plan.rows), groups, hg, p, n, generator=g)
    cs_buf = torch.empty(len(plan.rows), groups, clen, hg * p)
    _run_both(plan, (xdt, decay, b, c), state0, ssd._intra_chunk,
              functools.partial(ssd._scan_chunk, cs_buf=cs_buf), _ssd_step_allocating,
              torch.empty_like(xdt), slots)
