"""What eviction costs inside SGLang's cache: every backend against SGLang's lru, on the sweep's configs
at their pool and at 4x the pool (4x the sessions, renumbered), in CPU time (integrations/sglang/cost.py).

Run in the SGLang venv:

    .venv-sglang/bin/python benchmarks/sglang_eviction_cost.py --configs 0,2,15,33,38,42 --repeats 2
    .venv-sglang/bin/python benchmarks/sglang_eviction_cost.py            # every sweep config

Per config, scale and backend: evict calls, mean CPU µs per evict call, per call and in all against
lru on the Python tree core (`lru@py`, the core our backends need) and against lru on SGLang's default
(Rust) core (`lru`, what a user runs), and the request path (match + lock + allocate/evict + insert +
unlock, per request) against lru on both cores; the last lines give each backend's medians. The
backends take turns, repeat by repeat; medians over the repeats. Figures printed, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import time

from radixflow.integrations.sglang.cost import COST_BACKENDS, measure_all, scaled
from radixflow.integrations.sglang.sweep import sweep_configs

OURS = [b for b in COST_BACKENDS if b.startswith("radixflow-")]


def _x(a: float, b: float) -> float:
    return a / b if b else float("nan")


def _span(rows: list, k: int) -> str:
    v = [x for x, _, kk in rows if kk == k]
    return f"{min(v):.2f}–{max(v):.2f}"


def run(indices: list[int], repeats: int, scales: list[int]) -> None:
    t0 = time.perf_counter()
    cfgs = sweep_configs()
    bad = [i for i in indices if not 0 <= i < len(cfgs)]
    if bad:
        raise SystemExit(f"--configs: {bad} not in 0..{len(cfgs) - 1} (the sweep has {len(cfgs)} configs)")
    print(f"# eviction cost: {len(indices)} sweep configs x scales {scales}, {repeats} repeat(s); CPU time; "
          f"lru = SGLang's lru on its default (Rust) core, lru@py = on the Python core")
    print("| # | config | page | scale | pool | backend | evict calls | µs / call | per call × lru@py | "
          "per call × lru | total × lru@py | total × lru | request × lru@py | request × lru |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    per_call: dict = {}  # (backend, index, scale) -> µs per call
    ratios: dict = {b: {"call_py": [], "call_rs": [], "total_py": [], "total_rs": [], "req_py": [], "req_rs": []}
                    for b in COST_BACKENDS}
    for i in indices:
        for k in scales:
            cfg = scaled(cfgs[i], k)
            res = measure_all(cfg, repeats=repeats)
            py, rs = res["lru@py"], res["lru"]
            for b, c in res.items():
                per_call[(b, i, k)] = c.per_call
                row = {"call_py": _x(c.per_call, py.per_call), "call_rs": _x(c.per_call, rs.per_call),
                       "total_py": _x(c.total, py.total), "total_rs": _x(c.total, rs.total),
                       "req_py": _x(c.per_request, py.per_request), "req_rs": _x(c.per_request, rs.per_request)}
                for name, v in row.items():
                    ratios[b][name].append((v, i, k))
                print(f"| {i} | {cfgs[i]['name']} | {cfg['page']} | {k}x | {cfg['capacity']} | {b} | {c.calls} | "
                      f"{c.per_call * 1e6:.0f} | {row['call_py']:.2f} | {row['call_rs']:.2f} | "
                      f"{row['total_py']:.2f} | {row['total_rs']:.2f} | {row['req_py']:.2f} | {row['req_rs']:.2f} |",
                      flush=True)
    print()
    if len(scales) > 1:
        lo, hi = scales[0], scales[-1]
        print(f"## per call at {hi}x over {lo}x the pool")
        print("| backend | " + " | ".join(str(i) for i in indices) + " | max |")
        print("|---|" + "---|" * (len(indices) + 1))
        for b in COST_BACKENDS:
            r = [_x(per_call[(b, i, hi)], per_call[(b, i, lo)]) for i in indices]
            print(f"| {b} | " + " | ".join(f"{x:.2f}" for x in r) + f" | {max(r):.2f} |")
        print()
    for b in COST_BACKENDS:
        if b == "lru":
            continue
        r = ratios[b]
        parts = [f"{k}x: per call {_span(r['call_py'], k)} × lru@py ({_span(r['call_rs'], k)} × lru), "
                 f"total {_span(r['total_py'], k)} × lru@py ({_span(r['total_rs'], k)} × lru)" for k in scales]
        ok_py = sum(1 for (c, _, _), (t, _, _) in zip(r["call_py"], r["total_py"]) if c <= 2 and t <= 3)
        ok_rs = sum(1 for (c, _, _), (t, _, _) in zip(r["call_rs"], r["total_rs"]) if c <= 2 and t <= 3)
        n = len(r["call_py"])
        med = {name: statistics.median([x for x, _, _ in r[name] if x == x] or [float("nan")])  # (no evict
               for name in ("call_py", "req_py", "req_rs")}                                      # call: nan)
        print(f"{b}: " + "; ".join(parts) + f"; medians per call {med['call_py']:.2f} × lru@py, request path "
              f"{med['req_py']:.2f} × lru@py ({med['req_rs']:.2f} × lru); within 2x per call and 3x "
              f"in all on {ok_py} of {n} (vs lru@py), {ok_rs} of {n} (vs lru)")
    print(f"wall {time.perf_counter() - t0:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="", help="comma list of sweep config indices (default: all)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--scales", default="1,4", help="comma list of pool multiples (default 1,4)")
    args = ap.parse_args()
    try:
        indices = [int(x) for x in args.configs.split(",") if x.strip()] or list(range(len(sweep_configs())))
        scales = sorted({int(x) for x in args.scales.split(",") if x.strip()})
    except ValueError:
        ap.error("--configs and --scales take comma lists of integers")
    if args.repeats < 1 or not scales or scales[0] < 1:
        ap.error("--repeats and every --scales value must be >= 1")
    run(indices, args.repeats, scales)


if __name__ == "__main__":
    main()
