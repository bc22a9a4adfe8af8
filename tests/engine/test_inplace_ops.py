"""The forward's in-place and fast-path forms against the plain formulas they replace: the scans' decay
exponentials (floored so torch's vectorised exp stays on its fast path), the activations written over
their input, the Mamba-2 gated group norm in place, and attention's head-major q/k."""

from __future__ import annotations

import pytest
import torch

from radixflow.engine.models.activations import ACTIVATIONS, INPLACE, Fn
from radixflow.engine.models.chunk_plan import EXP_FLOOR, decay_exp, decay_mask
from radixflow.engine.models.layers import GateThenGroupNorm, Rotary

TINY = float(torch.tensor(EXP_FLOOR).exp())   # what an exponent below the floor gives: 1.6e-38


def _cum(shape, scale: float, seed: int = 0) -> torch.Tensor:
    """Cumulative log-decays (nonincreasing along the last dim), reaching -scale * C in a chunk."""
    g = torch.Generator().manual_seed(seed)
    return (-torch.rand(*shape, generator=g) * scale).cumsum(-1)


@pytest.mark.parametrize("scale", [0.01, 1.0, 20.0])
def test_decay_mask_is_the_masked_exponential(scale):
    """The formula it replaces, exp(cum_i - cum_j) masked with -inf above the diagonal, in the same
    fp32: the same bits wherever the exponent is >= EXP_FLOOR, exp(EXP_FLOOR) below it (where the
    old one gave a denormal or 0), exactly 0 above the diagonal; at decays from tiny to far past
    float32's range (cum down to -1,280 in a chunk of 64)."""
    cum = _cum((3, 4, 64), scale)
    got = decay_mask(cum)
    lower = torch.ones(64, 64, dtype=torch.bool).tril()
    expo = cum[..., :, None] - cum[..., None, :]
    old = expo.masked_fill(~lower, float("-inf")).exp()
    kept = lower & (expo >= EXP_FLOOR)
    floored = lower & (expo < EXP_FLOOR)
    assert torch.equal(got[kept], old[kept])
    assert torch.equal(got[floored], torch.full_like(got[floored], TINY))
    assert bool((old[floored] < TINY).all())
    assert torch.equal(got.masked_select(~lower), torch.zeros_like(got.masked_select(~lower)))
    assert float(got.diagonal(dim1=-2, dim2=-1).min()) == 1.0
    if scale >= 20.0:
        assert floored.any()   # the case the floor exists for is exercised


def test_decay_exp_floors_only_below_float32s_normal_range():
    x = torch.tensor([0.0, -1.0, -80.0, -86.9, -87.0, -87.5, -100.0, -1e4, float("-inf")])
    got = decay_exp(x)
    assert torch.equal(got[:5], x[:5].exp())
    assert torch.equal(got[5:], torch.full((4,), TINY))
    assert torch.equal(x[2], torch.tensor(-80.0))   # not written in place


@pytest.mark.parametrize("name", sorted({n for n, f in ACTIVATIONS.items() if f in INPLACE}))
def test_inplace_activations_give_the_same_bits(name):
    fn = ACTIVATIONS[name]
    x = torch.randn(64, 96, generator=torch.Generator().manual_seed(1)) * 3
    ref = fn(x)
    y = x.clone()
    with torch.no_grad():
        out = Fn(fn).inplace(y)
    assert out.data_ptr() == y.data_ptr()   # written over its input
    assert torch.equal(out, ref)


def test_inplace_activation_falls_back_with_autograd():
    x = torch.randn(8, 4, requires_grad=True)
    h = x * 2
    out = Fn(ACTIVATIONS["relu2"]).inplace(h)
    assert out.data_ptr() != h.data_ptr()
    out.sum().backward()
    assert x.grad is not None


def test_gated_group_norm_in_place_matches_forward_bit_for_bit():
    g = torch.Generator().manual_seed(2)
    norm = GateThenGroupNorm(96, 24, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(96, generator=g))
    x = torch.randn(50, 96, generator=g)
    proj = torch.randn(50, 96 + 40, generator=g)
    gate = proj[:, :96]                           # a slice of a projection, as the mixer passes it
    with torch.no_grad():
        ref = norm(x, gate.clone())
        xo = x.clone()
        out = norm.forward_(xo, gate)
    assert out.data_ptr() == xo.data_ptr()
    assert torch.equal(out, ref)


def test_head_major_rotary_is_the_same_values_in_attentions_layout():
    rot = Rotary(64, 10000.0, partial_factor=0.5)
    x = torch.randn(37, 6, 64, generator=torch.Generator().manual_seed(3))
    cos, sin = rot.cos_sin(torch.arange(5, 42))
    ref = rot.apply(x, cos, sin)
    hm = rot.apply(x, cos, sin, head_major=True)
    assert torch.equal(hm, ref)
    assert hm.transpose(0, 1).is_contiguous() and not hm.is_contiguous()
