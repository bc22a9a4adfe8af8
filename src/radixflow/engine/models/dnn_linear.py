"""Linear layers through oneDNN on CPU, each weight reordered once (issue 45: decode at real size).

torch's CPU `F.linear` on float32 calls MKL's sgemm. On the AMD EPYC these projects are measured on, that
path reads a weight at 14-23 GB/s for one row and 5-10 GB/s for 16 (a 43 GB/s machine), and a 512-token
prefill block runs at ~40 % of oneDNN's speed: `torch.ops.mkldnn._linear_pointwise` over a weight
reordered once into oneDNN's blocked layout (`torch.ops.mkldnn._reorder_linear_weight`) reads the same
weights at 31-38 GB/s for one row and 29-37 GB/s for 16 (docs/engine_speed.md, "oneDNN linears").
oneDNN is the library torch itself uses for CPU linears under `torch.compile` freezing; both are part of
every CPU torch wheel, so nothing is added. The arithmetic is float32 multiply-adds in oneDNN's own order
(no reduced-precision math: `torch.backends.mkldnn`'s fp32 precision is left at its default, ieee).

`pack_linears(model)` reorders the weight of every `nn.Linear` the forward calls (and of every fused
projection group, `layers.FusedLinears`) and points the module's forward at the packed copy. The dense
weight stays what the state dict, the tied embedding and the tests read, so memory for those weights
doubles; a call checks the dense weight is still the one packed (same storage, same version counter) and
runs `F.linear` on it otherwise, so a reloaded or edited weight is never served from a stale copy.

Used only where it applies: a CPU float32/bfloat16 weight, oneDNN present, `RADIXFLOW_ONEDNN` not "0".
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

ENV = "RADIXFLOW_ONEDNN"
_DTYPES = (torch.float32, torch.bfloat16)
# Below this many weight elements F.linear stays: a oneDNN call costs ~13 us of fixed overhead against
# F.linear's ~4 us, more than such a weight takes to read (384 x 128 at 1 row: 13.4 vs 4.3 us; 1,024 x 1,024:
# 51 vs 66 us). The tiny test models' projections stay on F.linear; every real-size one is packed.
MIN_ELEMENTS = 1 << 16


def enabled() -> bool:
    """oneDNN linears are on: the build has them and `RADIXFLOW_ONEDNN` is not "0"."""
    flag = os.environ.get(ENV, "1").strip().lower()
    if flag not in ("0", "1", "off", "on", "false", "true"):
        raise ValueError(f"{ENV}={flag!r}: expected 0 or 1 (or off / on)")
    return (flag in ("1", "on", "true") and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


class PackedWeight:
    """A dense [out, in] weight reordered for oneDNN, valid while the dense one is unchanged."""

    __slots__ = ("dense", "ptr", "version", "packed")

    def __init__(self, dense: torch.Tensor) -> None:
        with torch.inference_mode(False), torch.no_grad():
            d = dense.detach()
            self.packed = torch.ops.mkldnn._reorder_linear_weight(d.contiguous(), None)
        self.dense, self.ptr, self.version = dense, dense.data_ptr(), _version(dense)

    def __reduce__(self):  # a copy (deepcopy, pickle) packs its own copy of the dense weight again
        return PackedWeight, (self.dense,)

    def current(self, dense: torch.Tensor) -> bool:
        # `.data =` (Module.to, .double()) swaps the storage under the same Parameter: the pointer shows it
        return dense is self.dense and dense.data_ptr() == self.ptr and _version(dense) == self.version

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")


def _version(t: torch.Tensor) -> int:
    """The tensor's in-place edit counter (an inference-mode tensor has none, nor can it be edited)."""
    try:
        return t._version
    except RuntimeError:
        return -1


def packable(weight: torch.Tensor | None) -> bool:
    return (weight is not None and weight.device.type == "cpu" and weight.dtype in _DTYPES
            and weight.dim() == 2 and weight.numel() >= MIN_ELEMENTS)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           packed: PackedWeight | None) -> torch.Tensor:
    """x @ weight.T + bias: through the packed copy when it is current and x fits it, else F.linear."""
    if (packed is not None and packed.current(weight) and x.dtype == weight.dtype
            and not torch.is_grad_enabled() and x.shape[-1] == weight.shape[1]):
        return packed(x if x.is_contiguous() else x.contiguous(), bias)
    return F.linear(x, weight, bias)


def _packed_forward(lin: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return linear(x, lin.weight, lin.bias, lin.__dict__.get("_packed"))


def pack_linear(lin: nn.Linear) -> bool:
    """Pack one Linear's weight and route its forward through it; False where it does not apply."""
    if not packable(lin.weight):
        return False
    lin.__dict__["_packed"] = PackedWeight(lin.weight)
    lin.__dict__["forward"] = _packed_forward.__get__(lin)
    return True


def pack_linears(model: nn.Module, skip: set[int] = frozenset()) -> int:
    """Pack every `nn.Linear` of model except those whose id is in `skip`; returns how many."""
    if not enabled():
        return 0
    n = 0
    for m in model.modules():
        if isinstance(m, nn.Linear) and id(m) not in skip:
            n += pack_linear(m)
    return n
