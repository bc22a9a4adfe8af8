"""Linears through oneDNN with packed weights (engine/models/dnn_linear.py): the same products as
`F.linear` within its own fp32 error, never a stale copy of an edited or reloaded weight, copies that
pack their own, and the switch honoured. Where the torch build has no oneDNN, nothing is packed and
every Linear runs `F.linear` (checked too: these tests run on every machine)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from radixflow.engine.models import RowInput, build_model, dnn_linear
from radixflow.engine.models.layers import FusedLinears
from radixflow.engine.tiny import TINY_CONFIGS, random_weights

ON = dnn_linear.enabled()


def _bound(plain: torch.Tensor, ref64: torch.Tensor) -> float:
    """4x F.linear's own error against float64 (floor: 16 fp32 ulps of the largest value)."""
    own = (plain.double() - ref64).abs().max().item()
    return 4 * max(own, 16 * torch.finfo(torch.float32).eps * ref64.abs().max().item())


@pytest.mark.parametrize("rows", [1, 3, 17, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_a_packed_linear_computes_what_f_linear_does(rows, bias):
    torch.manual_seed(rows)
    lin = nn.Linear(384, 200, bias=bias).requires_grad_(False)   # >= MIN_ELEMENTS: packed
    x = torch.randn(rows, 384)
    ref64 = F.linear(x.double(), lin.weight.double(), None if lin.bias is None else lin.bias.double())
    plain = lin(x)
    assert dnn_linear.pack_linears(lin) == (1 if ON else 0)
    assert ("_packed" in lin.__dict__) == ON
    with torch.inference_mode():
        got = lin(x)
    assert got.shape == plain.shape and got.dtype == plain.dtype
    assert (got.double() - ref64).abs().max().item() <= _bound(plain, ref64)
    # a non-contiguous input (a slice of a wider activation) is taken too
    wide = torch.randn(rows, 500)
    wide[:, 50:434] = x
    with torch.inference_mode():
        assert (lin(wide[:, 50:434]).double() - ref64).abs().max().item() <= _bound(plain, ref64)


def test_an_edited_or_replaced_weight_is_never_served_from_the_packed_copy():
    torch.manual_seed(0)
    lin = nn.Linear(320, 256).requires_grad_(False)
    dnn_linear.pack_linear(lin)
    x = torch.randn(5, 320)
    with torch.no_grad():
        lin.weight.mul_(2.0)                      # in place: the version counter moves
    assert torch.allclose(lin(x), F.linear(x, lin.weight, lin.bias), atol=1e-5)
    lin.weight.data = torch.randn(256, 320)         # new storage under the same Parameter (what .to() does)
    assert torch.allclose(lin(x), F.linear(x, lin.weight, lin.bias), atol=1e-5)
    lin.weight = nn.Parameter(torch.randn(256, 320), requires_grad=False)   # another Parameter
    assert torch.allclose(lin(x), F.linear(x, lin.weight, lin.bias), atol=1e-5)
    lin.double()                                  # a dtype the packed copy does not have
    assert lin(x.double()).dtype == torch.float64


def test_a_model_packs_every_projection_once_and_its_logits_stay_within_fp32_error():
    cfg = TINY_CONFIGS["tiny-qwen3.5"]
    model = build_model(cfg)
    model.load_state_dict(random_weights(cfg, 5))
    model.eval()
    ref = copy.deepcopy(model).double()
    ref.__dict__["_fused"] = True                 # float64 reference: nothing fused, nothing packed
    plain = copy.deepcopy(model)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(dnn_linear.ENV, "0")
        assert plain.prepare_weights() == 0       # fused, not packed
    n = model.prepare_weights()
    assert model.prepare_weights() == 0           # once
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    fused = [f for m in model.modules() if isinstance(f := m.__dict__.get("fused"), FusedLinears)]
    in_groups = {id(lin) for f in fused for lin in f.linears}
    alone = [lin for lin in linears if id(lin) not in in_groups]
    big = [lin for lin in alone if lin.weight.numel() >= dnn_linear.MIN_ELEMENTS]
    big_groups = [f for f in fused if f.weight.numel() >= dnn_linear.MIN_ELEMENTS]
    if ON:  # the large weights packed (the tied head at least), the small left to F.linear
        assert n == len(big_groups) + len(big) >= 1 and all("_packed" in lin.__dict__ for lin in big)
        assert all((f.packed is not None) == (f in big_groups) for f in fused)
        assert not any("_packed" in lin.__dict__ for lin in alone if lin not in big)
    else:
        assert n == 0
    prompt = list(range(3, 40))

    def logits(m):
        cache = m.allocate_cache(8, 16, 2)
        return m([RowInput(prompt, 0, [0, 1, 2], None, [], list(range(len(prompt))))], cache)

    got, base, ref64 = logits(model), logits(plain), logits(ref)
    assert (got.double() - ref64).abs().max().item() <= _bound(base, ref64)
    # a copy packs its own weights (the copy's, not the original's)
    twin = copy.deepcopy(model)
    # ... and stays fused: its Linears are views of its own fused weight, which it runs as one matmul
    twins = [f for m in twin.modules() if isinstance(f := m.__dict__.get("fused"), FusedLinears)]
    assert len(twins) == len(fused) and all(f._current() for f in twins)
    assert all(f.linears[0].weight.data_ptr() == f.weight.data_ptr() != g.weight.data_ptr()
               for f, g in zip(twins, fused))
    if ON:
        head = next(m for m in twin.modules() if "_packed" in m.__dict__)
        assert head.__dict__["_packed"].dense is head.weight
    assert torch.equal(logits(twin), got)


def test_the_switch_is_read_and_a_bad_value_named(monkeypatch):
    monkeypatch.setenv(dnn_linear.ENV, "0")
    assert not dnn_linear.enabled()
    assert dnn_linear.pack_linears(nn.Linear(512, 512)) == 0
    monkeypatch.setenv(dnn_linear.ENV, "maybe")
    with pytest.raises(ValueError, match="RADIXFLOW_ONEDNN='maybe': expected 0 or 1"):
        dnn_linear.enabled()
