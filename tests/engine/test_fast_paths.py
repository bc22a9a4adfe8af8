"""The engine's speed paths compute what the plain paths compute (docs/engine_speed.md).

Fused projections (`layers.FusedLinears`): the same outputs as the separate Linears, the state dict
unchanged, and a later `load_state_dict(assign=True)` honoured. Paged KV reads: a context on
consecutive pages (a view), in a few runs (slice copies) or scattered (a gather) gives the same logits.
"""

from __future__ import annotations

import copy

import torch

from radixflow.engine.models import RowInput, build_model
from radixflow.engine.models.layers import FusedLinears, fuse_projections
from radixflow.engine.tiny import TINY_CONFIGS, random_weights

BLOCK = 16


def _within_own_fp32_error(got: torch.Tensor, plain: torch.Tensor, ref64: torch.Tensor) -> None:
    """`got` within 4x the plain path's own fp32 error against a float64 run of the same weights (floor:
    16 fp32 ulps of the largest value), not a fixed tolerance one CPU's kernels happen to meet."""
    own = (plain.double() - ref64).abs().max().item()
    floor = 16 * torch.finfo(torch.float32).eps * ref64.abs().max().item()
    err = (got.double() - ref64).abs().max().item()
    assert err <= 4 * max(own, floor), f"error {err:.3g} against float64, the plain path's own {own:.3g}"


def _model(name: str):
    cfg = TINY_CONFIGS[name]
    model = build_model(cfg)
    model.load_state_dict(random_weights(cfg, 3))
    return model.eval()


def test_fused_projections_match_the_separate_linears_and_keep_the_state_dict():
    torch.set_num_threads(1)
    lins = [torch.nn.Linear(24, n, bias=True) for n in (40, 8, 8)]
    x = torch.randn(5, 24)
    with torch.no_grad():
        want = [lin(x) for lin in lins]
        before = [lin.weight.clone() for lin in lins]
        fused = FusedLinears(*lins)
        fused.fuse()
        got = fused(x)
        ref = [torch.nn.functional.linear(x.double(), lin.weight.double(), lin.bias.double()) for lin in lins]
    assert fused.weight is not None and fused.weight.shape == (56, 24)
    for a, b, r in zip(got, want, ref):
        _within_own_fp32_error(a, b, r)
    assert all(torch.equal(lin.weight, w) for lin, w in zip(lins, before))
    assert lins[1].weight.data_ptr() == fused.weight[40:].data_ptr()  # views, not copies
    # new weights assigned later: the stale fused weight is not used
    lins[1].weight = torch.nn.Parameter(torch.zeros(8, 24))
    with torch.no_grad():
        assert torch.equal(fused(x)[1], lins[1].bias.expand(5, 8))


def test_a_model_fuses_on_its_first_call_with_the_same_logits():
    torch.set_num_threads(1)
    model = _model("tiny-qwen3.5")
    plain = build_model(TINY_CONFIGS["tiny-qwen3.5"])
    plain.load_state_dict(model.state_dict())
    plain.__dict__["_fused"] = True  # never fused: every Linear runs alone
    model64 = copy.deepcopy(plain).double()
    ids = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    out = []
    for m in (model, plain, model64):
        cache = m.allocate_cache(4, BLOCK, 2)
        out.append(m([RowInput(ids, 0, [0, 1, 2], None, [(40, 0)], list(range(40)))], cache))
    assert sum(f.weight is not None for f in _fused(model)) > 0
    assert all(f.weight is None for f in _fused(plain)) and all(f.weight is None for f in _fused(model64))
    _within_own_fp32_error(out[0], out[1], out[2])
    fuse_projections(model)  # idempotent
    assert set(model.state_dict()) == set(plain.state_dict())


def _fused(model):
    return [m.__dict__["fused"] for m in model.modules() if isinstance(m.__dict__.get("fused"), FusedLinears)]


def test_context_read_as_a_view_runs_or_a_gather_gives_the_same_logits():
    torch.set_num_threads(1)
    model = _model("tiny-qwen3")
    gen = torch.Generator().manual_seed(2)
    prefix = torch.randint(0, 256, (8 * BLOCK,), generator=gen).tolist()
    tail = torch.randint(0, 256, (20,), generator=gen).tolist()
    need = -(-(len(prefix) + len(tail)) // BLOCK)  # 10 pages
    layouts = {"consecutive": list(range(need)),                                  # one run: a view
               "two runs": list(range(20, 28)) + list(range(40, 42)),               # slice copies
               "scattered": [3 * p + 1 for p in range(need)]}                       # a per-token gather
    logits = {}
    for name, table in layouts.items():
        cache = model.allocate_cache(64, BLOCK, 0)
        model([RowInput(prefix, 0, table, None, [], [])], cache)
        batch_rows = [RowInput(tail, len(prefix), table, None, [], list(range(len(tail))))]
        logits[name] = model(batch_rows, cache)
    from radixflow.engine.models.batch import BatchContext

    runs = {name: len(BatchContext([RowInput(tail, len(prefix), t)], BLOCK, torch.device("cpu")).context_runs(0))
            for name, t in layouts.items()}
    assert runs == {"consecutive": 1, "two runs": 2, "scattered": need}
    assert torch.equal(logits["consecutive"], logits["two runs"])
    assert torch.equal(logits["consecutive"], logits["scattered"])


def _decode_group_rows(model):
    """A cache holding a 5-page prompt and another 2-page context, and the rows of the decode-group
    test on it (the generator reseeded: the same rows for every copy of the model)."""
    gen = torch.Generator().manual_seed(4)
    ctx = 5 * BLOCK + 7   # the prompt's last page partial: each row its own copy of it
    prompt = torch.randint(0, 256, (ctx,), generator=gen).tolist()
    other = torch.randint(0, 256, (2 * BLOCK,), generator=gen).tolist()
    cache = model.allocate_cache(64, BLOCK, 0)
    model([RowInput(prompt, 0, list(range(6)), None, [], []),
           RowInput(other, 0, [40, 41], None, [], [])], cache)
    rows = []
    for own in (6, 9, 30, 12):   # page 6 follows the prompt's pages: one longer first run
        cache.copy_page(5, own)
        rows.append(RowInput([int(torch.randint(0, 256, (1,), generator=gen))], ctx, list(range(5)) + [own],
                             None, [], [0]))
    cache.copy_page(4, 13)   # a shorter context from the same first page: the group's shared part is cut to it
    rows.append(RowInput([5], ctx - 20, list(range(4)) + [13], None, [], [0]))
    rows.append(RowInput([7], 2 * BLOCK, [40, 41, 42], None, [], [0]))   # a group of one, no rest but itself
    rows.append(RowInput([9, 10, 11], ctx, list(range(5)) + [50], None, [], [2]))   # multi-token: per row
    cache.copy_page(5, 50)
    return rows, cache


def test_decode_rows_sharing_a_prefix_read_it_once_with_the_per_row_logits():
    """1-token rows grouped by their context's first slot (`BatchContext.decode_groups`): the shared part
    read once for all of them, each row's rest apart, against each row through SDPA alone. The bound is
    the per-row path's own fp32 error against a float64 run of the same weights (x4, floor 16 fp32 ulps
    of the logits), not a fixed tolerance one CPU's kernels happen to meet."""
    from radixflow.engine.models import attention
    from radixflow.engine.models.batch import BatchContext

    torch.set_num_threads(1)
    model = _model("tiny-qwen3")
    rows, cache = _decode_group_rows(model)
    batch = BatchContext(rows, BLOCK, torch.device("cpu"))
    assert sorted(batch.decode_groups()) == [(0, 4 * BLOCK, [0, 1, 2, 3, 4]), (40 * BLOCK, 2 * BLOCK, [5])]
    assert batch.decode_group_rest(0, 4 * BLOCK, [0, 1, 2, 3, 4])[1] is not None   # rests of unequal length
    model64 = copy.deepcopy(model).double()
    rows64, cache64 = _decode_group_rows(model64)
    out = {}
    lone = []   # the group of one (row 5: its context one run of slots) goes through `_decode_run`
    run = attention._decode_run
    attention._decode_run = lambda q, k, v, t, r, o, s: (lone.append((t, r)), run(q, k, v, t, r, o, s))
    try:
        for grouped in (True, False):
            attention.DECODE_GROUPS = grouped
            try:
                out[grouped] = model(rows, cache)
                if not grouped:
                    ref = model64(rows64, cache64)
            finally:
                attention.DECODE_GROUPS = True
        attention.DECODE_RUN = False   # the lone row through `_decode_attention` too (shared part + rest)
        try:
            out["split"] = model(rows, cache)
        finally:
            attention.DECODE_RUN = True
    finally:
        attention._decode_run = run
    n_attn = sum(isinstance(m, attention.SelfAttention) for m in model.modules())
    assert lone == [(batch.offsets[5], (40 * BLOCK, 42 * BLOCK + 1))] * n_attn
    _within_own_fp32_error(out[True], out[False], ref)
    _within_own_fp32_error(out["split"], out[False], ref)
    assert torch.equal(out[True].argmax(-1), out[False].argmax(-1))
