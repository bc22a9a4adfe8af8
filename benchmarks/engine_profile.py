"""Where one real-size forward of ours spends its time, by component (docs/engine_speed.md).

Components: every `nn.Linear` (projections, MLP, head), the causal conv, the linear scans (gated delta
rule / SSD), paged attention (K/V write, page gather, SDPA), the norms, and the rest (activations,
gates, reshapes, embedding, Python), which is the call's time minus the others. Times are host clocks
around each call (CPU ops are synchronous), summed over --repeat runs after one warm-up; the share
is what matters, the absolute figures are not comparable across runs.

    python benchmarks/engine_profile.py --real qwen3.5-0.8b --layers 4 [--cases abc] [--repeat 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import engine_real  # noqa: E402
from radixflow.engine.models import attention, layers, nemotron_h, qwen3_5  # noqa: E402

TOTALS: dict[str, float] = defaultdict(float)


def _timed(name: str, fn):
    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            TOTALS[name] += time.perf_counter() - t
    return wrapper


def instrument(model: nn.Module) -> None:
    """Time the components: module-level functions patched where the model code looks them up, and
    forward hooks on the Linear / norm modules."""
    for mod, attr, name in ((qwen3_5, "causal_conv", "conv"), (nemotron_h, "causal_conv", "conv"),
                            (qwen3_5, "gated_delta_rule", "scan"), (nemotron_h, "ssd_scan", "scan"),
                            (attention, "paged_attention", "attention")):
        if hasattr(mod, attr) and not hasattr(getattr(mod, attr), "__wrapped_by_profile__"):
            w = _timed(name, getattr(mod, attr))
            w.__wrapped_by_profile__ = True
            setattr(mod, attr, w)
    starts: dict[int, float] = {}

    def pre(m, _args):
        starts[id(m)] = time.perf_counter()

    def post(name):
        def hook(m, _args, _out):
            TOTALS[name] += time.perf_counter() - starts.pop(id(m))
        return hook

    norms = (layers.RMSNorm, layers.NormThenGate, layers.GateThenGroupNorm)
    for m in model.modules():
        kind = "linear" if isinstance(m, nn.Linear) else "norm" if isinstance(m, norms) else None
        if kind:
            m.register_forward_pre_hook(pre)
            m.register_forward_hook(post(kind))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", nargs="+", choices=engine_real.REAL_MODELS, required=True)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--cases", default="abc")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name in args.real:
        cfg = engine_real.real_config(name, args.layers)
        ours, hf = engine_real.build_pair(cfg)
        cases = engine_real.make_cases(ours, hf, cfg["vocab_size"], args.cases)
        del hf
        instrument(ours)
        for case in cases:
            case.run_ours(ours)
            TOTALS.clear()
            t = time.perf_counter()
            for _ in range(args.repeat):
                case.run_ours(ours)
            total = time.perf_counter() - t
            parts = dict(TOTALS)
            parts["rest"] = total - sum(parts.values())
            shares = "  ".join(f"{k} {100 * v / total:4.1f}%" for k, v in
                               sorted(parts.items(), key=lambda kv: -kv[1]))
            print(f"{name:14s} {case.label:26s} {total / args.repeat * 1000:8.1f} ms/call  {shares}", flush=True)
        del ours, cases


if __name__ == "__main__":
    main()
