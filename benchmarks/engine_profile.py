"""Where one real-size forward of ours spends its time, by component (docs/engine_speed.md).

Components: every `nn.Linear` (projections, MLP, head), the causal conv, the linear scans (gated delta
rule / SSD), paged attention (K/V write, page gather, SDPA), the norms, and the rest (activations,
gates, reshapes, embedding, Python), which is the call's time minus the others. Times are host clocks
around each call (CPU ops are synchronous), summed over --repeat runs after one warm-up; the share
is what matters, the absolute figures are not comparable across runs.

    python benchmarks/engine_profile.py --real qwen3.5-0.8b --layers 4 [--cases abc] [--repeat 2]

`--random random:<name> --layers N`: the random-weight model of engine_peers.py at its full widths cut to N
layers (written once to the model cache as `random-<name>-L<N>`; Nemotron-H takes N blocks of its pattern
from block 7, "M-M-M-M*..."), and engine_peers.py's cases as its Scheduler makes them (case (b): 16 rows,
~8k tokens, half resuming after a cached parent). Prints the component shares, torch.profiler's top ops
by self time, and with `--compare` transformers on the same rows beside ours (medians of --repeat,
interleaved). `--scan-threads` as in engine_prefill.py.

    python benchmarks/engine_profile.py --random random:qwen3.5-0.8b --layers 8 --cases b --compare
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

try:   # absent from trees before it (this script also times those, for before/after figures)
    from radixflow.engine.models import threads  # noqa: E402
except ImportError:
    threads = None

NEMOTRON_CUT = 7   # a cut of Nemotron-H's pattern starts here: "M-M-M-M*-M-M-M*..." (Mamba, MLP, attention)

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


def cut_random_model(name: str, n_layers: int | None) -> Path:
    """Directory of `name` (random:<model>) at full width with `n_layers` layers (None: the model itself)."""
    from radixflow.engine.random_models import (
        PREFIX,
        RANDOM_CONFIGS,
        ensure_random_model,
        random_config,
        write_random_model,
    )
    from radixflow.engine.seeded import build_once, default_cache_dir

    if n_layers is None:
        return ensure_random_model(name)
    key = name.removeprefix(PREFIX)
    base = RANDOM_CONFIGS[key]
    if "layers_block_type" in base:
        pattern = base["layers_block_type"]
        kinds = (pattern[NEMOTRON_CUT:] + pattern)[:n_layers]
        cfg = random_config(name, layers_block_type=kinds)
    else:
        cfg = random_config(name, num_hidden_layers=n_layers)
    target = default_cache_dir() / f"random-{key}-L{n_layers}"
    return build_once(target, "model.safetensors.index.json", lambda tmp: write_random_model(cfg, tmp, 0))


def profile_random(name: str, args) -> None:
    """engine_peers.py's cases on a layer cut of `name`: component shares, top ops, ratio to transformers."""
    import statistics
    from types import SimpleNamespace

    import engine_peers
    from radixflow.engine.loader import load_model

    path = cut_random_model(name, args.layers)
    lm = load_model(path)
    hf = engine_peers.Transformers(path) if args.compare else None
    gen = torch.Generator().manual_seed(0)
    sizes = SimpleNamespace(scale=1.0, prefill_len=2048, round_tokens=8192, parent_len=1024, context=2048,
                            rows=16)
    n_layers = len(lm.model.model.layers)
    if not args.no_components:
        instrument(lm.model)   # host clocks around components: microseconds per call, in every timing below
    for cname in args.cases:
        case = engine_peers.make_case(cname, lm, gen, sizes)
        ours = engine_peers.Ours(lm)
        ours.run(case)   # warm-up (also fuses the projections)
        if hf is not None:
            hf.prepare(case)
            hf.run(case)
            t_ours, t_hf = [], []
            for _ in range(args.repeat):
                t_ours.append(ours.run(case)[0])
                t_hf.append(hf.run(case)[0])
            a, b = statistics.median(t_ours), statistics.median(t_hf)
            print(f"{name} {n_layers} layers ({cname}) {case.label}: ours {case.tokens / a:7.1f} tok/s  "
                  f"transformers {case.tokens / b:7.1f} tok/s  x{b / a:.2f}   "
                  f"(ours {', '.join(f'{t:.2f}' for t in t_ours)} s)", flush=True)
            hf.release()
        if args.modes:   # our forward under each scan-threads mode, interleaved, medians side by side
            times: dict[str, list[float]] = {m: [] for m in args.modes}
            policies = {m: threads.configure(m) for m in args.modes}   # auto keeps its measurements
            for _ in range(args.repeat):
                for m in args.modes:
                    threads.SCAN_THREADS = policies[m]
                    times[m].append(ours.run(case)[0])
            threads.configure(args.scan_threads)
            med = {m: statistics.median(v) for m, v in times.items()}
            base = med[args.modes[0]]
            print(f"{name} {n_layers} layers ({cname}) scan threads: " + "  ".join(
                f"{m}: {case.tokens / t:7.1f} tok/s (x{base / t:.2f})" for m, t in med.items())
                + f"   [runs: {times}]", flush=True)
        if args.ops:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                wall, _ = ours.run(case)
            ops = sorted(((e.key, e.self_cpu_time_total / 1e6, e.count) for e in prof.key_averages()),
                         key=lambda x: -x[1])
            print(f"    torch.profiler, one call {wall:.2f} s: " + ", ".join(
                f"{k} {t / wall:.1%} ({n})" for k, t, n in ops[:args.ops]), flush=True)
        if args.no_components:
            continue
        TOTALS.clear()
        t = time.perf_counter()
        for _ in range(args.repeat):
            ours.run(case)
        total = time.perf_counter() - t
        parts = dict(TOTALS)
        parts["rest"] = total - sum(parts.values())
        print(f"    components, {total / args.repeat:.2f} s/call: " + "  ".join(
            f"{k} {100 * v / total:4.1f}%" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])), flush=True)
        del case


def round_rows(tokens: int = 8192, n_rows: int = 16, prefix: int = 1024, seed: int = 0):
    """Case (b)'s row shapes without a model: n_rows rows of ~tokens / n_rows tokens, every other one
    resuming after a `prefix`-token cached prefix (a state slot in), captures every 512 and at the end."""
    from radixflow.engine.models import RowInput

    gen = torch.Generator().manual_seed(seed)
    per = tokens / n_rows
    lengths = [int(per * (0.5 + torch.rand((), generator=gen).item())) for _ in range(n_rows)]
    lengths[-1] += tokens - sum(lengths)
    rows, slot = [], 1
    for i, n in enumerate(lengths):
        start = prefix if i % 2 == 0 else 0
        points = sorted({k - start for k in range(start + 1, start + n + 1) if k % 512 == 0} | {n})
        cuts = [(k, slot + j) for j, k in enumerate(points)]
        slot += len(cuts)
        rows.append(RowInput([0] * n, start, list(range(-(-(start + n) // 16))), 0 if start else None, cuts,
                             [n - 1]))
    return rows, slot


def _allocating_gdn_step(s, u, w, qk, q_dec, k_dec, decay, o, u_buf):
    """gated_delta._scan_chunk as it was before the in-place buffers (allocates U, O and the state)."""
    r, h, dk, dv = s.shape
    s3 = s.reshape(r * h, dk, dv)
    u = torch.baddbmm(u.flatten(0, 1), w.flatten(0, 1), s3, alpha=-1.0)
    o_new = torch.baddbmm(torch.bmm(qk.flatten(0, 1), u), q_dec.flatten(0, 1), s3)
    s_new = torch.baddbmm(s3 * decay.reshape(-1, 1, 1), k_dec.flatten(0, 1).transpose(1, 2), u)
    return o_new.view(r, h, -1, dv), s_new.view(r, h, dk, dv)


def _allocating_ssd_step(s, y_intra, d_state, decay_in, decay_chunk, c, y, cs_buf):
    r, g, hg, p, n = s.shape
    cs = (c @ s.reshape(r, g, hg * p, n).transpose(-1, -2)).view(r, g, -1, hg, p).transpose(2, 3)
    return torch.addcmul(y_intra, cs, decay_in[..., None]), torch.addcmul(d_state, s, decay_chunk[..., None, None])


def scan_only(args) -> None:
    """One recurrent layer's scan on case (b)'s rows at real widths: GDN (Qwen3.5-0.8B: 16 heads x 128,
    chunk 64) and SSD (random:nemotron-h-1b: 40 heads x 80, 8 groups, state 128, chunk 128); our current
    in-place steps vs the allocating ones, under each --modes thread mode; interleaved, medians."""
    import statistics
    from types import SimpleNamespace

    from radixflow.engine.models import gated_delta, ssd
    from radixflow.engine.models.batch import BatchContext

    rows, slots = round_rows()
    n = sum(len(r.token_ids) for r in rows)
    g = torch.Generator().manual_seed(0)
    nrm = torch.nn.functional.normalize
    gdn_in = (nrm(torch.randn(n, 16, 128, generator=g), dim=-1) * 128 ** -0.5,
              nrm(torch.randn(n, 16, 128, generator=g), dim=-1), torch.randn(n, 16, 128, generator=g),
              -0.3 * torch.rand(n, 16, generator=g), torch.rand(n, 16, generator=g))
    ssd_in = (torch.randn(n, 40, 80, generator=g), 0.5 * torch.rand(n, 40, generator=g),
              -1.0 - torch.rand(40, generator=g), torch.randn(n, 8, 128, generator=g),
              torch.randn(n, 8, 128, generator=g))
    kinds = {"gdn": (gated_delta, "_scan_chunk", _allocating_gdn_step, torch.zeros(slots, 16, 128, 128),
                     lambda b, c: gated_delta.gated_delta_rule(*gdn_in, b, c, 0, 64)),
             "ssd": (ssd, "_scan_chunk", _allocating_ssd_step, torch.zeros(slots, 40, 80, 128),
                     lambda b, c: ssd.ssd_scan(*ssd_in, b, c, 0, 128))}
    modes = args.modes or ["auto"]
    for kind, (mod, attr, old_step, pool, call) in kinds.items():
        cache = SimpleNamespace(rec=[pool])
        new_step = getattr(mod, attr)
        arms = [(f"{m} threads {v}", m, step) for m in modes for v, step in (("allocating", old_step),
                                                                            ("in-place", new_step))]
        policies = {m: threads.configure(m) for m in modes}   # one per mode: auto keeps its measurements
        times: dict[str, list[float]] = {a: [] for a, _, _ in arms}
        outs = {}
        for rep in range(args.repeat + 2):   # two warm-up rounds (and the auto modes' first trials)
            for label, m, step in arms:
                threads.SCAN_THREADS = policies[m]
                setattr(mod, attr, step)
                try:
                    t = time.perf_counter()
                    outs[label] = call(BatchContext(rows, 16, torch.device("cpu")), cache)
                    if rep >= 2:
                        times[label].append(time.perf_counter() - t)
                finally:
                    setattr(mod, attr, new_step)
        threads.configure(args.scan_threads)
        same = all(torch.equal(o, next(iter(outs.values()))) for o in outs.values())
        base = statistics.median(times[arms[0][0]])
        print(f"{kind} scan, {len(rows)} rows, {n} tokens (outputs identical across arms: {same}): " + "  ".join(
            f"{a} {statistics.median(v) * 1e3:.0f} ms (x{base / statistics.median(v):.2f})"
            for a, v in times.items()), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", nargs="+", choices=engine_real.REAL_MODELS)
    ap.add_argument("--random", nargs="+", help="random:<name> models at full width (engine_peers.py's)")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--cases", default="abc")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--compare", action="store_true", help="--random: transformers beside ours")
    ap.add_argument("--no-components", action="store_true", help="--random: skip the component shares")
    ap.add_argument("--ops", type=int, default=12, help="--random: torch.profiler's top N ops (0: none)")
    ap.add_argument("--scan-threads", default="auto", help="the scans' threads: auto, or a count")
    ap.add_argument("--scan-only", action="store_true",
                    help="one GDN and one SSD layer's scan on case (b)'s rows: in-place vs allocating steps "
                         "under each --modes")
    ap.add_argument("--modes", nargs="+", default=None,
                    help="--random: time ours under each scan-threads mode (e.g. 2 auto 1), interleaved; "
                         "ratios to the first")
    args = ap.parse_args()
    if bool(args.real) == bool(args.random) and not args.scan_only:
        ap.error("give one of --real or --random (or --scan-only)")
    if set(args.cases) - set("abc") or not args.cases:
        ap.error(f"--cases takes letters among a, b, c, got {args.cases!r}")
    try:
        for m in [args.scan_threads, *(args.modes or [])] if threads is not None else []:
            threads.configure(m)
        if threads is not None:
            threads.configure(args.scan_threads)
    except ValueError as e:
        ap.error(str(e))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, scan threads {args.scan_threads}")
    if args.scan_only:
        scan_only(args)
        return
    for name in args.random or []:
        profile_random(name, args)
    for name in args.real or []:
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
