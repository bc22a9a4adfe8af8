"""Causal attention over a paged KV cache for a packed batch of rows.

Every row's new K/V is written into its pages BEFORE any row reads, so a row may read pages that
another row of the same call writes (same-round sharing of a common prefix). A row that starts at
position 0 reads its own fresh K/V directly, skipping the gather from the cache. A dependent row
(SPEC §15) gets the part of the page its start cuts forked from its producer's page after the writes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .batch import BatchContext
from .cache import ModelCache
from .chunk_plan import EXP_FLOOR
from .layers import FusedLinears, RMSNorm, Rotary


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: BatchContext,
                    cache: ModelCache, layer: int, scale: float) -> torch.Tensor:
    """q [N, H, D], k/v [N, Hkv, D] (already normed/rotated) -> attention output [N, H, D]."""
    k_pool = cache.k[layer].view(-1, k.shape[1], k.shape[2])
    v_pool = cache.v[layer].view(-1, v.shape[1], v.shape[2])
    k_pool.index_copy_(0, batch.kv_write_index, k.to(k_pool.dtype))
    v_pool.index_copy_(0, batch.kv_write_index, v.to(v_pool.dtype))
    forks = batch.kv_forks
    if forks is not None:
        dst, src = forks
        k_pool.index_copy_(0, dst, k_pool.index_select(0, src))
        v_pool.index_copy_(0, dst, v_pool.index_select(0, src))
    if len(batch.rows) == 1 and batch.rows[0].start == 0:
        # one fresh row (a prompt's prefill): its attention output is the call's, not copied into one
        return _attend(q, k, v, batch.causal_mask(0), True, scale)
    out = torch.empty_like(q)
    decoded: set[int] = set()
    for a, m, rows in (batch.decode_groups() if DECODE_GROUPS else ()):
        if DECODE_RUN and len(rows) == 1 and len(runs := batch.context_runs(rows[0])) == 1:
            _decode_run(q, k_pool, v_pool, batch.offsets[rows[0]], runs[0], out, scale)
        else:
            _decode_attention(q, k_pool, v_pool, batch, a, m, rows, out, scale)
        decoded.update(rows)
    for i, row in enumerate(batch.rows):
        if i in decoded:
            continue
        lo, hi = batch.offsets[i], batch.offsets[i + 1]
        if row.start == 0:
            keys, values = k[lo:hi], v[lo:hi]
        else:
            keys, values = _context(k_pool, batch, i).to(q.dtype), _context(v_pool, batch, i).to(q.dtype)
        out[lo:hi] = _attend(q[lo:hi], keys, values, batch.causal_mask(i), row.start == 0, scale)
    return out


def _context(pool: torch.Tensor, batch: BatchContext, i: int) -> torch.Tensor:
    """Row i's context K or V [S, Hkv, D]: a view of the pool when its pages are consecutive, the few
    runs of consecutive pages copied by slices (bulk copies), or a gather per token when scattered."""
    runs = batch.context_runs(i)
    if len(runs) == 1:
        return pool[runs[0][0]:runs[0][1]]
    if len(runs) <= _MAX_RUNS:
        return torch.cat([pool[a:b] for a, b in runs])
    return pool[batch.context_index(i)]


_MAX_RUNS = 8
DECODE_GROUPS = True   # 1-token rows by `_decode_attention` (False: each row by SDPA, as multi-token rows)
DECODE_RUN = True      # a lone 1-token row whose context is one run by `_decode_run` (False: `_decode_attention`)


def _decode_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: BatchContext,
                      a: int, m: int, rows: list[int], out: torch.Tensor, scale: float) -> None:
    """1-token rows whose contexts begin with the same `m` cache slots [a, a + m): that shared part is
    read once, as a view of the pool, for all the rows' queries (one product per KV head), and each
    row's rest of its context (its own page: a few slots, gathered) apart; the two softmax parts are
    joined by their log-sum-exps. No copy of the shared context, and it is read once, not once a row."""
    g, hkv, d = len(rows), k_pool.shape[1], k_pool.shape[2]
    tok = batch.decode_group_tokens(rows)
    qg = q.index_select(0, tok).view(g, hkv, -1, d)                       # [G, Hkv, heads per KV, D]
    rep = qg.shape[2]
    # shared part: [Hkv, G * rep, D] against [Hkv, m, D]
    qs = qg.permute(1, 0, 2, 3).reshape(hkv, g * rep, d)
    o1, lse1 = _attend_slots(qs, k_pool, v_pool, a, a + m, scale)        # [Hkv, G*rep, D], [Hkv, G*rep, 1]
    o1 = o1.view(hkv, g, rep, d).permute(1, 0, 2, 3)
    lse1 = lse1.view(hkv, g, rep, 1).permute(1, 0, 2, 3)
    # each row's rest: [G, R] slots (padded), valid where < the row's rest length
    rest, valid = batch.decode_group_rest(a, m, rows)
    kr = k_pool[rest].to(q.dtype).permute(0, 2, 3, 1)                     # [G, Hkv, D, R]
    vr = v_pool[rest].to(q.dtype).transpose(1, 2)                         # [G, Hkv, R, D]
    s2 = torch.matmul(qg, kr).mul_(scale)                                 # [G, Hkv, rep, R]
    pad = None if valid is None else ~valid[:, None, None, :]
    if pad is not None:
        s2.masked_fill_(pad, float("-inf"))
    o2, lse2 = _softmax_av(s2, vr, pad)
    lse = torch.logaddexp(lse1, lse2)
    o = o1 * (lse1 - lse).exp_() + o2 * (lse2 - lse).exp_()
    out.index_copy_(0, tok, o.reshape(g, hkv * rep, d).to(out.dtype))


def _decode_run(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, t: int, run: tuple[int, int],
                out: torch.Tensor, scale: float) -> None:
    """One 1-token row (packed token t) whose whole context, its new token included, is one run of cache
    slots [a, b): one product per KV head against a view of the pool and one softmax, no split into a
    shared part and a rest joined by log-sum-exps (a lone row's rest is only its new token, and the query,
    at the context's last position, needs no mask). The common case of one stream decoding: its pages
    come in one ascending run (cache/pool.py)."""
    hkv, d = k_pool.shape[1], k_pool.shape[2]
    o, _ = _attend_slots(q[t].view(hkv, -1, d), k_pool, v_pool, *run, scale)   # queries [Hkv, heads per KV, D]
    out[t] = o.reshape(-1, d).to(out.dtype)


def _attend_slots(qs: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, a: int, b: int, scale: float
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries qs [Hkv, n, D] against cache slots [a, b), read as a view of the pool (one product per KV
    head, no mask): the softmax-weighted values [Hkv, n, D] and the scores' log-sum-exps [Hkv, n, 1]."""
    ks = k_pool[a:b].transpose(0, 1).to(qs.dtype)
    vs = v_pool[a:b].transpose(0, 1).to(qs.dtype)
    return _softmax_av(torch.bmm(qs, ks.transpose(1, 2)).mul_(scale), vs)


def _softmax_av(s: torch.Tensor, v: torch.Tensor, pad: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(s) @ v and the log-sum-exp of s over its last dim (s is overwritten; `pad`: entries that
    are not part of it, exactly 0 in the softmax).

    The exponents are floored at EXP_FLOOR before the exp, as the scans' are (chunk_plan.py): a score
    more than 87 below the row's max (random-weight models reach -200 and beyond) or -inf takes torch's
    scalar exp path (12k such values: 57-78 us against 13 us floored; over a whole decode step the
    difference was within noise); its weight exp(-87) = 1.6e-38 is lost in rounding beside the max's 1,
    as the true one was."""
    mx = s.amax(-1, keepdim=True)
    p = s.sub_(mx).clamp_(min=EXP_FLOOR).exp_()
    if pad is not None:
        p.masked_fill_(pad, 0.0)
    total = p.sum(-1, keepdim=True)
    o = torch.matmul(p, v).div_(total)
    return o, total.log_().add_(mx)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
            fresh: bool, scale: float) -> torch.Tensor:
    """One row: q [L, H, D] against k/v [S, Hkv, D]; grouped-query heads share KV heads."""
    causal = fresh and q.shape[0] > 1
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return o[0].transpose(0, 1)


class SelfAttention(nn.Module):
    """Full attention layer over the paged cache, configurable for the three families.

    `qk_norm`: None, "plain" (Qwen3) or "zero_centered" (Qwen3.5) per-head RMSNorm on q and k.
    `output_gate`: q_proj also yields a per-channel gate, output *= sigmoid(gate) (Qwen3.5).
    `rotary`: None for Nemotron-H, whose attention layers carry no positional encoding.
    """

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, kv_index: int, *,
                 eps: float = 1e-6, qk_norm: str | None = None, output_gate: bool = False,
                 rotary: Rotary | None = None, bias: bool = False) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.kv_index, self.output_gate, self.rotary = kv_index, output_gate, rotary
        self.q_proj = nn.Linear(hidden, heads * head_dim * (2 if output_gate else 1), bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=bias)
        self.__dict__["fused"] = FusedLinears(self.q_proj, self.k_proj, self.v_proj)
        if qk_norm is not None:
            self.q_norm = RMSNorm(head_dim, eps, zero_centered=qk_norm == "zero_centered")
            self.k_norm = RMSNorm(head_dim, eps, zero_centered=qk_norm == "zero_centered")
        self.qk_norm = qk_norm

    def forward(self, x: torch.Tensor, batch: BatchContext, cache: ModelCache) -> torch.Tensor:
        n, d = x.shape[0], self.head_dim
        q, k, v = self.fused(x)
        q = q.view(n, self.heads, -1)
        gate = None
        if self.output_gate:
            q, gate = q[..., :d], q[..., d:]
        k = k.view(n, self.kv_heads, d)
        v = v.view(n, self.kv_heads, d)
        if self.qk_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary is not None:
            cos, sin = batch.extras["rope"]  # type: ignore[misc]
            q, k = self.rotary.apply(q, cos, sin, head_major=True), self.rotary.apply(k, cos, sin, head_major=True)
        o = paged_attention(q, k, v, batch, cache, self.kv_index, d ** -0.5).reshape(n, -1)
        if gate is not None:
            o = o * torch.sigmoid(gate.reshape(n, -1))
        return self.o_proj(o)
