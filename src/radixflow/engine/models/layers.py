"""Building blocks shared by the model families: RMSNorm variants, rotary embedding, MLPs.

Parameter names follow the Hugging Face checkpoint layout (`weight`, `gate_proj`, ...) so that a
checkpoint's state dict loads into our modules without renaming.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import dnn_linear
from .activations import ACTIVATIONS, Fn


def rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) over the last dim, computed in fp32."""
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    """RMSNorm. `zero_centered`: the stored weight is an offset from 1 (Qwen3.5's convention)."""

    def __init__(self, dim: int, eps: float, zero_centered: bool = False) -> None:
        super().__init__()
        self.eps, self.zero_centered = eps, zero_centered
        self.weight = nn.Parameter(torch.zeros(dim) if zero_centered else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.float() + 1.0 if self.zero_centered else self.weight.float()
        return (rms(x, self.eps) * w).to(x.dtype)


class NormThenGate(nn.Module):
    """Qwen3.5 GDN output norm: per-head RMSNorm, scaled, then multiplied by silu(gate)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        y = self.weight * rms(x, self.eps).to(x.dtype)
        return (y * F.silu(gate.float())).to(x.dtype)


class GateThenGroupNorm(nn.Module):
    """Mamba-2 output norm: x * silu(gate), then RMSNorm within groups of `group_size` channels."""

    def __init__(self, dim: int, group_size: int, eps: float) -> None:
        super().__init__()
        self.eps, self.group_size = eps, group_size
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        y = x.float() * F.silu(gate.float())
        shape = y.shape
        y = rms(y.view(*shape[:-1], -1, self.group_size), self.eps).view(shape)
        return self.weight * y.to(x.dtype)

    def forward_(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """forward, overwriting x (fp32, contiguous) and gate: for a caller that owns both (the
        mixer's scan output and its projection's gate slice; no autograd). The same operations in
        the same order, so the same bits in fp32, without forward's four new tensors."""
        if x.dtype != torch.float32 or gate.dtype != torch.float32 or torch.is_grad_enabled() \
                or not x.is_contiguous():
            return self.forward(x, gate)
        y = x.mul_(F.silu(gate, inplace=True))
        yg = y.view(*y.shape[:-1], -1, self.group_size)
        yg.mul_(torch.rsqrt(yg.pow(2).mean(-1, keepdim=True) + self.eps))
        return y.mul_(self.weight)


class Rotary:
    """Rotary position embedding on the first `rot_dim` channels of each head (partial rotary)."""

    def __init__(self, head_dim: int, theta: float, partial_factor: float = 1.0) -> None:
        dim = int(head_dim * partial_factor)
        # explicit cpu: models are built under a meta-device context when loading checkpoints
        exps = torch.arange(0, dim, 2, dtype=torch.float, device="cpu") / max(dim, 1)
        # an odd `dim` still gets ceil(dim / 2) frequencies over 2 * ceil(dim / 2) channels, with
        # exponents over `dim`, exactly as transformers computes it (head_dim 20 x 0.25: 6 channels)
        self.rot_dim = 2 * exps.numel()
        if self.rot_dim > head_dim:
            raise ValueError(f"config.json: head_dim={head_dim} x partial_rotary_factor={partial_factor} "
                             f"gives {dim} rotary channels, rounded up to {self.rot_dim} > head_dim")
        self.inv_freq = 1.0 / (theta ** exps)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape [N, 1, rot_dim // 2] (broadcast over heads), fp32: one angle per channel
        pair (the pairs are the channel halves, so the full-width table would repeat itself)."""
        freqs = positions.float()[:, None] * self.inv_freq.to(positions.device)[None, :]
        freqs = freqs[:, None, :]
        return freqs.cos(), freqs.sin()

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              head_major: bool = False) -> torch.Tensor:
        """Rotate x [N, heads, head_dim] by its token's angle (channel halves paired, not interleaved):
        (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), written straight into the output (two
        products a half, no concatenated copies); channels past rot_dim are copied unchanged.
        head_major: the output [N, heads, head_dim] is a view of [heads, N, head_dim] storage, the
        layout attention kernels read fastest (SDPA's CPU flash kernel: ~4 % faster on q and k so laid
        out than on the projection's token-major views), at no extra pass."""
        d = self.rot_dim
        if d == 0:
            return x
        half = d // 2
        xf = x.float()
        if head_major:
            out = xf.new_empty(xf.shape[1], xf.shape[0], *xf.shape[2:]).transpose(0, 1)
        else:
            out = torch.empty_like(xf)
        x1, x2 = xf[..., :half], xf[..., half:d]
        o1, o2 = out[..., :half], out[..., half:d]
        torch.mul(x1, cos, out=o1).addcmul_(x2, sin, value=-1.0)
        torch.mul(x2, cos, out=o2).addcmul_(x1, sin)
        if d < x.shape[-1]:
            out[..., d:] = xf[..., d:]
        return out.to(x.dtype)   # keeps the layout (a dense permutation's strides are preserved)


class FusedLinears:
    """Linears reading the same input, run as ONE matmul over their concatenated weight.

    `fuse()` concatenates the weights once and re-points each Linear's parameters to views of the
    result, so memory, the state dict and the checkpoint names stay as they were. A call checks that
    every Linear still holds its view (a later `load_state_dict(assign=True)` replaces them) and runs
    the Linears one by one otherwise. Returns one output per Linear (views of the fused output).
    """

    def __init__(self, *linears: nn.Linear) -> None:
        self.linears = linears
        self.sizes = [lin.out_features for lin in linears]
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None
        self.packed: dnn_linear.PackedWeight | None = None
        self._ptrs: list[int] = []

    def _current(self) -> bool:
        return self.weight is not None and [lin.weight.data_ptr() for lin in self.linears] == self._ptrs

    def fuse(self) -> None:
        if self._current():
            return
        lins = self.linears
        has_bias = [lin.bias is not None for lin in lins]
        if any(has_bias) and not all(has_bias):
            return  # mixed bias: left unfused
        with torch.inference_mode(False), torch.no_grad():
            weight = torch.cat([lin.weight for lin in lins])
            bias = torch.cat([lin.bias for lin in lins]) if all(has_bias) else None
            off = 0
            for lin, n in zip(lins, self.sizes):
                lin.weight = nn.Parameter(weight[off:off + n], requires_grad=False)
                if bias is not None:
                    lin.bias = nn.Parameter(bias[off:off + n], requires_grad=False)
                off += n
        self.weight, self.bias = weight, bias
        self.packed = None
        self._ptrs = [lin.weight.data_ptr() for lin in lins]

    def __deepcopy__(self, memo: dict) -> FusedLinears:
        """A copy (a deep-copied model's) over the copied Linears, fused (and packed) anew from THEIR
        weights when the original was: torch copies each Parameter apart, so copying the fused weight too
        would leave the copy's Linears and its fused weight two unrelated tensors (and the original's
        pointers, copied as they were, made the copy run its projections one by one)."""
        from copy import deepcopy

        new = FusedLinears(*deepcopy(self.linears, memo))
        memo[id(self)] = new
        if self._current():
            new.fuse()
            if self.packed is not None:
                new.pack()
        return new

    def pack(self) -> None:
        """Reorder the fused weight for oneDNN (engine/models/dnn_linear.py); the dense one is kept."""
        if self._current() and dnn_linear.packable(self.weight):
            self.packed = dnn_linear.PackedWeight(self.weight)

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        if not self._current():
            return [lin(x) for lin in self.linears]
        return list(dnn_linear.linear(x, self.weight, self.bias, self.packed).split(self.sizes, dim=-1))


def fuse_projections(model: nn.Module) -> None:
    """Fuse every module's same-input projections (modules with a `fused` FusedLinears); idempotent."""
    for m in model.modules():
        fused = m.__dict__.get("fused")
        if isinstance(fused, FusedLinears):
            fused.fuse()


def pack_projections(model: nn.Module) -> int:
    """Fuse, then reorder every projection the forward calls for oneDNN (dnn_linear.py): each fused
    group's weight once, and every other Linear's. Returns how many weights were packed (0 where
    oneDNN is off or absent)."""
    fuse_projections(model)
    if not dnn_linear.enabled():
        return 0
    n, members = 0, set()
    for m in model.modules():
        fused = m.__dict__.get("fused")
        if isinstance(fused, FusedLinears) and fused._current():
            fused.pack()
            n += fused.packed is not None
            members.update(id(lin) for lin in fused.linears)
    return n + dnn_linear.pack_linears(model, skip=members)


TOKEN_BLOCK = 2048


def by_token_blocks(fn, x: torch.Tensor, block: int = TOKEN_BLOCK) -> torch.Tensor:
    """fn over row blocks of x [N, D]. On CPU this keeps an MLP's wide intermediates in cache
    when many rows are packed together; on GPU one big launch is better, so it is one call."""
    if x.shape[0] <= block or x.is_cuda:
        return fn(x)
    return torch.cat([fn(x[i:i + block]) for i in range(0, x.shape[0], block)])


class GatedMLP(nn.Module):
    """Gated MLP: down(act(gate(x)) * up(x)); SwiGLU with the default silu."""

    def __init__(self, hidden: int, inter: int, bias: bool = False, act: nn.Module | None = None) -> None:
        super().__init__()
        self.act_fn = act if act is not None else Fn(F.silu)
        self.gate_proj = nn.Linear(hidden, inter, bias=bias)
        self.up_proj = nn.Linear(hidden, inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)
        self.__dict__["fused"] = FusedLinears(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return by_token_blocks(self._mlp, x)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.fused(x)
        if isinstance(self.act_fn, Fn) and not torch.is_grad_enabled():
            # the fused output is this call's own: activation and product in place, no new tensors
            return self.down_proj(self.act_fn.inplace(gate).mul_(up))
        return self.down_proj(self.act_fn(gate) * up)


class PlainMLP(nn.Module):
    """Ungated MLP: down(act(up(x))); Nemotron-H's, relu^2 by default."""

    def __init__(self, hidden: int, inter: int, bias: bool = False, act: nn.Module | None = None) -> None:
        super().__init__()
        self.act_fn = act if act is not None else Fn(ACTIVATIONS["relu2"])
        self.up_proj = nn.Linear(hidden, inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return by_token_blocks(self._mlp, x)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up_proj(x)   # this call's own: the activation overwrites it where it can
        return self.down_proj(self.act_fn.inplace(h) if isinstance(self.act_fn, Fn) else self.act_fn(h))
