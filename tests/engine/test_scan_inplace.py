"""The chunked scans on rows of several lengths with captures: GDN's chunked form against the recurrence in
float64; SSD's in-place step bit-identical to the allocating step it replaced (kept here as the reference);
the chunk layout's packing and unpacking."""

from __future__ import annotations

import torch

from radixflow.engine.models import gated_delta, ssd
from radixflow.engine.models.chunk_plan import blocked_scan, build_chunk_plan

EPS32 = torch.finfo(torch.float32).eps


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


def _gdn_reference(q, k, v, g, beta, state0, rows, cuts_of, slots, dtype=torch.float64):
    """Token-by-token gated delta rule in `dtype` (float64: the reference; float32: the plain recurrence
    whose own rounding error sets the bound): outputs [N, H, dv], states after each cut."""
    out = torch.zeros(v.shape, dtype=dtype)
    saved = torch.zeros(slots, *state0.shape[1:], dtype=dtype)
    for local, (off, n) in enumerate(rows):
        s = state0[local].to(dtype)
        for t in range(off, off + n):
            s = s * g[t].to(dtype).exp()[:, None, None]
            u = beta[t].to(dtype)[:, None] * (v[t].to(dtype) - torch.einsum("hk,hkv->hv", k[t].to(dtype), s))
            s = s + k[t].to(dtype)[:, :, None] * u[:, None, :]
            out[t] = torch.einsum("hk,hkv->hv", q[t].to(dtype), s)
            for at, slot in cuts_of[local]:
                if t - off + 1 == at:
                    saved[slot] = s
    return out, saved


def test_gated_delta_chunked_scan_matches_the_recurrence_in_float64():
    """The chunked form (one stacked product per chunk step, [U'; O] = [U; QK U] - [W; QK W - Q_dec] S)
    against the token-by-token recurrence in float64: outputs and captured states, rows of several
    lengths (padding, captures mid-row and at the end), a nonzero initial state."""
    g = torch.Generator().manual_seed(0)
    plan, n_tok, slots = _plan(64)
    h, dk, dv = 3, 16, 24
    q = torch.nn.functional.normalize(torch.randn(n_tok, h, dk, generator=g), dim=-1) * dk ** -0.5
    k = torch.nn.functional.normalize(torch.randn(n_tok, h, dk, generator=g), dim=-1)
    v = torch.randn(n_tok, h, dv, generator=g)
    gg, beta = -0.3 * torch.rand(n_tok, h, generator=g), torch.rand(n_tok, h, generator=g)
    packed = plan.to_chunks([q, k, v, gg, beta])
    cq, ck, cv, cg, cb = packed.split([dk, dk, dv, 1, 1], dim=-1)
    state0 = torch.randn(len(plan.rows), h, dk, dv, generator=g)
    state = state0.clone()
    res = torch.empty(packed.shape[0], h, 2 * plan.chunk, dv)
    saved = torch.zeros(slots, h, dk, dv)

    def save(local, at):
        saved.index_copy_(0, at, state[local])

    blocked_scan(plan, (cq, ck, cv, cg[..., 0], cb[..., 0], res), state, gated_delta._intra_chunk,
                 gated_delta._scan_chunk, res, save)
    out = torch.full((n_tok, h, dv), float("nan"))
    plan.from_chunks(res[:, :, plan.chunk:], out)
    lengths = (300, 129, 64, 17)
    offsets = [sum(lengths[:i]) for i in range(len(lengths))]
    rows = [(offsets[r], lengths[r]) for r in plan.rows]
    cuts_of, slot = {}, 0
    for i, n in enumerate(lengths):
        cuts = [(x, slot + j) for j, x in enumerate(sorted({x for x in (128, n) if x <= n}))]
        slot += len(cuts)
        cuts_of[plan.rows.index(i)] = cuts
    ref_out, ref_saved = _gdn_reference(q, k, v, gg, beta, state0, rows, cuts_of, slots)
    # the bound: a few times the plain fp32 recurrence's own error against float64 (on this CPU's kernels),
    # never under a few fp32 ulps of the tensor
    rec_out, rec_saved = _gdn_reference(q, k, v, gg, beta, state0, rows, cuts_of, slots, torch.float32)
    for got, ref, rec in ((out, ref_out, rec_out), (saved, ref_saved, rec_saved)):
        err = float((got.double() - ref).abs().max())
        bound = max(4 * float((rec.double() - ref).abs().max()), 16 * EPS32 * float(ref.abs().max()))
        assert err <= bound, (err, bound)
    assert float(ref_out.abs().max()) > 0.1 and float(ref_saved.abs().max()) > 0.1


def test_to_chunks_and_from_chunks_are_inverse_and_zero_the_padding():
    g = torch.Generator().manual_seed(2)
    plan, n_tok, _ = _plan(32)
    x = torch.randn(n_tok, 3, 5, generator=g)
    y = torch.randn(n_tok, 3, generator=g)
    chunks = plan.to_chunks([x, y])
    assert chunks.shape == (plan.num_slots // 32, 3, 32, 6)
    assert int((chunks != 0).sum()) == int((x != 0).sum() + (y != 0).sum())   # padding is zero
    back = torch.empty_like(x)
    plan.from_chunks(chunks[..., :5], back)
    assert torch.equal(back, x)
    flat = chunks.transpose(1, 2).reshape(-1, 3, 6)
    assert torch.equal(flat[plan.flat_index], torch.cat([x, y[..., None]], -1)[plan.token_index])


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
