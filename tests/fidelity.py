"""How close a result of our engine must be to the truth, on any CPU (docs/models.md, "How fidelity
is bounded").

The truth is transformers' forward of the same weights in float64: every float dtype its code (or
ours) names - `.float()`, `.to(torch.float32)`, `softmax(dtype=torch.float32)`, `.bfloat16()` - is
turned into float64 by `float64_mode()`, so nothing rounds to fp32 on the way (our engine run the
same way agrees with it to ~1e-14). The same forward at the dtype under test (fp32, bf16) measures
the reference implementation's own rounding error on the same input; ours may be at most

    bound = FACTOR * max|theirs - truth| + FLOOR_ULPS * eps(fp32) * max|truth|

(FACTOR 8 for fp32, FACTOR_LOW 4 for bf16/fp16; FLOOR_ULPS 4)

away from the truth. Both terms scale with the arithmetic (the CPU's kernels, the thread count, the
model's logit size), not with one machine; a fixed 1e-4 did not, and failed on other CPUs.

`Reference.check` asserts the bound and returns the ratio error / bound (1 = at the bound); set
RADIXFLOW_FIDELITY_LOG to a file path to append one JSON line per check (the ratios recorded in
the docs come from it).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import os
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode

# Our kernels are other algorithms than transformers' (chunked scans cut elsewhere, fused sums in
# another order), so their fp32 error is another sample of the same size: across ATEN_CPU_CAPABILITY
# default/avx2/avx512 and 1-2 threads the worst measured was 4.3x theirs (docs/models.md); twice that.
FACTOR = 8.0
# bf16/fp16: the error is mostly the rounded weights and activations, which both share, so ours stays
# nearer theirs (worst measured 1.8x, though we keep the recurrent state in fp32); twice that.
FACTOR_LOW = 4.0
# an absolute floor of a few fp32 units in the last place of the largest logit (at any dtype under
# test): the final matmul's own rounding, for the rare input where the reference rounds almost exactly
FLOOR_ULPS = 4
EPS32 = torch.finfo(torch.float32).eps

def set_threads() -> None:
    """The engine tests' torch threads: OMP_NUM_THREADS when set (scripts/test_numerics.sh runs them
    at 1 and 2), else 1 (tiny models run fastest on one thread of a shared machine)."""
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 1))


_CASTS = {torch.Tensor.float: torch.Tensor.double, torch.Tensor.half: torch.Tensor.double,
          torch.Tensor.bfloat16: torch.Tensor.double}


def _wide(x):
    return torch.float64 if isinstance(x, torch.dtype) and x.is_floating_point else x


class _Float64(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        func = _CASTS.get(func, func)
        return func(*map(_wide, args), **{k: _wide(v) for k, v in (kwargs or {}).items()})


@contextlib.contextmanager
def float64_mode():
    """Every floating dtype any torch call names becomes float64 (and the default dtype too)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with _Float64():
            yield
    finally:
        torch.set_default_dtype(old)


_WIDE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _float64_copy(hf):
    if hf not in _WIDE:
        _WIDE[hf] = copy.deepcopy(hf).double().eval()
    return _WIDE[hf]


def _logits(hf, ids: list[int]) -> torch.Tensor:
    # use_cache=False: an attention-free Nemotron-H has no layer to count the length with
    return hf(torch.tensor([ids]), use_cache=False).logits[0]


@dataclass
class Reference:
    """transformers' logits of one prompt: in float64 (the truth) and at the dtype under test."""

    truth: torch.Tensor       # [n, V] float64
    theirs: torch.Tensor      # [n, V] float64 holding the reference's fp32 (or bf16) result
    own_error: float          # max|theirs - truth| over the WHOLE prompt (slicing keeps it)
    scale: float              # max|truth| over the whole prompt
    factor: float = FACTOR    # FACTOR_LOW for a bf16/fp16 reference

    @property
    def bound(self) -> float:
        return self.factor * self.own_error + FLOOR_ULPS * EPS32 * self.scale

    def __getitem__(self, index) -> Reference:
        """The same reference at some positions (rows) only; its bound stays the whole prompt's."""
        return dataclasses.replace(self, truth=self.truth[index], theirs=self.theirs[index])

    def tokens(self, token_ids: list[int]) -> Reference:
        """The same reference at some vocabulary entries only (a top-k list)."""
        return dataclasses.replace(self, truth=self.truth[..., token_ids], theirs=self.theirs[..., token_ids])

    def top(self) -> Reference:
        """The largest entry of each row (a greedy token's logprob, whichever token ties win):
        |max a - max b| <= max|a - b|, so the bound carries over."""
        return dataclasses.replace(self, truth=self.truth.amax(-1, keepdim=True),
                                   theirs=self.theirs.amax(-1, keepdim=True))

    def log_softmax(self) -> Reference:
        """Log-probabilities instead of logits; the own error is measured again, the floor's scale kept."""
        truth, theirs = self.truth.log_softmax(-1), self.theirs.float().log_softmax(-1).double()
        return dataclasses.replace(self, truth=truth, theirs=theirs, own_error=float((theirs - truth).abs().max()))

    def error(self, ours: torch.Tensor) -> float:
        assert ours.shape == self.truth.shape, (tuple(ours.shape), tuple(self.truth.shape))
        return float((ours.double() - self.truth).abs().max())

    def ratio(self, ours: torch.Tensor) -> float:
        """error / bound: at most 1 passes."""
        return self.error(ours) / self.bound

    def check(self, ours: torch.Tensor, what: str = "") -> float:
        err, bound = self.error(ours), self.bound
        _log({"what": what, "error": err, "own_error": self.own_error, "bound": bound, "ratio": err / bound,
              "over_own": err / self.own_error if self.own_error else None})
        assert err <= bound, (f"{what}: max|ours - float64| = {err:.3g} > bound {bound:.3g} = {self.factor:g} x the "
                              f"reference's own error {self.own_error:.3g} + {FLOOR_ULPS} ulp x {self.scale:.3g} "
                              f"(ratio {err / bound:.2f})")
        return err / bound


def concat(refs: list[Reference]) -> Reference:
    """Several prompts' references stacked (one batch's rows): the largest own error and scale."""
    return Reference(torch.cat([r.truth for r in refs]), torch.cat([r.theirs for r in refs]),
                     max(r.own_error for r in refs), max(r.scale for r in refs), min(r.factor for r in refs))


def reference(hf, ids: list[int], dtype: torch.dtype = torch.float32) -> Reference:
    """The float64 truth of `hf`'s weights on `ids`, and `hf` run at `dtype` (its own error)."""
    with torch.no_grad():
        with float64_mode():
            truth = _logits(_float64_copy(hf), ids).double()
        model = hf if next(hf.parameters()).dtype == dtype else _converted(hf, dtype)
        with low_precision_attention() if dtype != torch.float32 else contextlib.nullcontext():
            theirs = _logits(model, ids).double()
    return Reference(truth, theirs, float((theirs - truth).abs().max()), float(truth.abs().max()),
                     FACTOR if dtype == torch.float32 else FACTOR_LOW)


@functools.cache
def _flash_refuses_bf16() -> bool:
    q = torch.zeros(1, 1, 256, 32, dtype=torch.bfloat16)
    try:
        F.scaled_dot_product_attention(q, q, q)
    except RuntimeError as e:
        if "pack_vnni" not in str(e):
            raise
        return True
    return False


def low_precision_attention():
    """For bf16/fp16 forwards: torch 2.13's CPU flash attention packs them for AMX whenever the CPU has
    AMX, then refuses ("pack_vnni2 is only supported when avx512 is supported") under
    ATEN_CPU_CAPABILITY=default or avx2 on such a CPU; there, and only there, the math kernel runs
    (what a CPU without AMX gets is the flash kernel's non-AMX path: the same sums, another order)."""
    return sdpa_kernel([SDPBackend.MATH]) if _flash_refuses_bf16() else contextlib.nullcontext()


_LOW: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _converted(hf, dtype):
    per = _LOW.setdefault(hf, {})
    if dtype not in per:
        per[dtype] = copy.deepcopy(hf).to(dtype).eval()
    return per[dtype]


def log_ratio(what: str, ratio: float) -> None:
    """Records a ratio error / bound that a test measured without asserting it is <= 1 (a guard)."""
    _log({"what": what, "ratio": ratio, "guard": True})


def _log(rec: dict) -> None:
    path = os.environ.get("RADIXFLOW_FIDELITY_LOG")
    if not path:
        return
    rec = {"test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0], **rec,
           "capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads()}
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")
