"""Activation functions by the names Hugging Face configs use (`hidden_act`, `mlp_hidden_act`, ...).

The table covers every activation transformers 5.23 accepts for these fields, each written out
here with the same formula. `prelu` has one learned slope: an MLP's `act_fn` holds it as a
parameter (`mlp.act_fn.weight` in the checkpoint), while a conv activation named by the config is
a fresh default (slope 0.25), as transformers instantiates it per call. `xielu` is refused: its
learned parameters are kept in bfloat16 whatever the model dtype, so no fp32 load could match.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

Activation = Callable[[torch.Tensor], torch.Tensor]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu_tanh_python(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * torch.pow(x, 3.0))))


def _gelu_fast(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def _laplace(x: torch.Tensor, mu: float = 0.707107, sigma: float = 0.282095) -> torch.Tensor:
    return 0.5 * (1.0 + torch.erf((x - mu).div(sigma * math.sqrt(2.0))))


def _relu2(x: torch.Tensor) -> torch.Tensor:
    return torch.square(F.relu(x))


ACTIVATIONS: dict[str, Activation] = {
    "gelu": F.gelu,
    "gelu_10": lambda x: torch.clip(F.gelu(x), -10.0, 10.0),
    "gelu_fast": _gelu_fast,
    "gelu_new": _gelu_tanh_python,
    "gelu_python": lambda x: x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0))),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_python_tanh": _gelu_tanh_python,
    "gelu_accurate": _gelu_tanh_python,
    "hardswish": F.hardswish,
    "laplace": _laplace,
    "leaky_relu": F.leaky_relu,       # torch's default slope 0.01, as nn.LeakyReLU()
    "linear": lambda x: x,
    "mish": F.mish,
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "relu": F.relu,
    "relu2": _relu2,
    "relu6": F.relu6,
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
    "sqrtsoftplus": lambda x: F.softplus(x).sqrt(),
    "swish": F.silu,
    "tanh": torch.tanh,
}
# The same formulas overwriting their input, for a caller whose input is its own (an MLP's fresh
# projection, no autograd): no new tensor, one pass fewer each; the same bits as the functions above.
INPLACE: dict[Activation, Activation] = {
    F.silu: lambda x: F.silu(x, inplace=True),
    _relu2: lambda x: F.relu_(x).square_(),
    F.relu: F.relu_,
}

_PRELU_INIT = 0.25
# a fresh nn.PReLU(): what transformers' conv applies when the config names prelu
ACTIVATIONS["prelu"] = lambda x: F.prelu(x, torch.full((1,), _PRELU_INIT, dtype=x.dtype, device=x.device))
_REFUSED = {"xielu": "keeps its learned parameters in bfloat16 whatever the model dtype (not supported)"}


def get_activation(name: object, field: str) -> Activation:
    """The activation called `name`; ValueError naming the config field when it is not supported."""
    if isinstance(name, str) and name in ACTIVATIONS:
        return ACTIVATIONS[name]
    why = _REFUSED.get(name, "is not a known activation") if isinstance(name, str) else "is not a known activation"
    raise ValueError(f"config.json: {field}={name!r} {why}; supported: {', '.join(sorted(ACTIVATIONS))}")


class PReLU(nn.Module):
    """PReLU with one learned slope, stored as `weight` like nn.PReLU()."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((1,), _PRELU_INIT))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.prelu(x, self.weight)


class Fn(nn.Module):
    """A parameter-free activation as a module (an MLP's `act_fn`)."""

    def __init__(self, fn: Activation) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)

    def inplace(self, x: torch.Tensor) -> torch.Tensor:
        """The activation written over x where an in-place form exists and no gradient is wanted;
        otherwise a new tensor, as forward."""
        fn = INPLACE.get(self.fn)
        return fn(x) if fn is not None and not torch.is_grad_enabled() else self.fn(x)


def activation_module(name: object, field: str) -> nn.Module:
    """An MLP's `act_fn` for `name` (checked like get_activation); prelu's slope is a parameter."""
    fn = get_activation(name, field)
    return PReLU() if name == "prelu" else Fn(fn)
