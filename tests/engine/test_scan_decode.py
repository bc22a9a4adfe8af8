"""The 1-token (decode) steps of both scans, updating the rows' state copies in place, against the
allocating steps they replaced (kept here as the reference): logits and saved states, on a batch of
decode rows only (the states updated in `init` itself), on one mixed with a prefill row and a
decode row that captures nothing (the rows' copies and the capturing rows selected), and on a decode
round whose rows each step their own slot in the pool (`BatchContext.states_in_place`: no copy out and
back; one row also captures into a second slot), the conv windows too (its decode path `_decode_conv`)."""

from __future__ import annotations

import copy

import pytest
import torch

from radixflow.engine.models import RowInput, build_model, gated_delta, ssd
from radixflow.engine.models.batch import BatchContext
from radixflow.engine.models.states import save_states
from radixflow.engine.tiny import TINY_CONFIGS, random_weights

BLOCK = 16


def _gdn_decode_allocating(args, init, level, pool, out):
    idx = level.decode_token_index
    q, k, v, g, beta = (t[idx] for t in args)
    s = init[level.decode_row_index] * g.exp()[..., None, None]
    u = beta[..., None] * (v - torch.einsum("rhk,rhkv->rhv", k, s))
    s = s + k[..., :, None] * u[..., None, :]
    out[idx] = torch.einsum("rhk,rhkv->rhv", q, s)
    local, slots = level.decode_captures
    save_states(pool, slots, s[local])


def _ssd_decode_allocating(args, init, level, pool, out, groups):
    idx = level.decode_token_index
    xdt, decay, b, c = (t[idx] for t in args)
    heads = xdt.shape[1]
    group_of_head = torch.arange(heads) // (heads // groups)
    bh, ch = b[:, group_of_head], c[:, group_of_head]
    s = init[level.decode_row_index] * decay.exp()[..., None, None] + xdt[..., :, None] * bh[:, :, None, :]
    out[idx] = (s @ ch[..., None])[..., 0]
    local, slots = level.decode_captures
    save_states(pool, slots, s[local])


@pytest.mark.parametrize("name", ["tiny-qwen3.5", "tiny-nemotron-h"])
def test_decode_steps_in_place_match_the_allocating_steps(name, monkeypatch):
    torch.set_num_threads(1)
    cfg = TINY_CONFIGS[name]
    model = build_model(cfg)
    model.load_state_dict(random_weights(cfg, 5))
    model.eval()
    gen = torch.Generator().manual_seed(6)
    prompt = torch.randint(0, 256, (40,), generator=gen).tolist()
    toks = torch.randint(0, 256, (6,), generator=gen).tolist()
    decode_only = [RowInput([t], 40, [0, 1, 2, 10 + i], 0, [(1, 1 + i)], [0]) for i, t in enumerate(toks[:4])]
    mixed = [RowInput(prompt[:20], 0, [20, 21], None, [(20, 8)], [19]),
             RowInput([toks[4]], 40, [0, 1, 2, 30], 0, [], [0]),            # captures nothing
             RowInput([toks[5]], 40, [0, 1, 2, 31], 0, [(1, 9)], [0])]
    # the decode rows' next token, each from the slot it captured into and back into it (row 0 also into 10)
    in_place = [RowInput([t], 41, [0, 1, 2, 10 + i], 1 + i, [(1, 1 + i)] + ([(1, 10)] if i == 0 else []), [0])
                for i, t in enumerate(toks[2:6])]
    assert BatchContext(in_place, BLOCK, torch.device("cpu")).states_in_place == [(1, [10]), (2, []), (3, []),
                                                                                 (4, [])]
    assert BatchContext(decode_only, BLOCK, torch.device("cpu")).states_in_place is None   # all read slot 0
    results = {}
    model64 = copy.deepcopy(model).double()
    for ref, m in ((False, model), (True, model), (True, model64)):
        if ref:
            monkeypatch.setattr(gated_delta, "_decode", _gdn_decode_allocating)
            monkeypatch.setattr(ssd, "_decode", _ssd_decode_allocating)
            monkeypatch.setattr(BatchContext, "states_in_place", property(lambda self: None))
        cache = m.allocate_cache(40, BLOCK, 12)
        m([RowInput(prompt, 0, [0, 1, 2], None, [(40, 0)], [])], cache)
        got = [m(rows, cache) for rows in (decode_only, mixed, in_place)]
        results[ref, m is model64] = [*got, *(t.clone() for t in cache.rec), *(t.clone() for t in cache.conv)]
    # each tensor of the in-place steps within 4x the allocating steps' own fp32 error against a float64
    # run (floor: 16 fp32 ulps of the tensor), not a fixed tolerance one CPU's kernels happen to meet
    new, old, ref64 = results[False, False], results[True, False], results[True, True]
    eps = torch.finfo(torch.float32).eps
    for i, (a, b, r) in enumerate(zip(new, old, ref64)):
        assert a.abs().sum() > 0
        if i >= 3:
            assert b[1:5].abs().sum() > 0 and b[9].abs().sum() > 0      # the captures were written
            assert torch.equal(a[10], a[1])                               # the in-place row's second capture
        own = (b.double() - r).abs().max().item()
        assert (a.double() - r).abs().max().item() <= 4 * max(own, 16 * eps * r.abs().max().item()), i
