"""Per-call eviction cost inside SGLang's cache, two checkouts side by side (issue #42: a refactor's
cost against the code before it): two worker processes, each importing radixflow from its own `src`,
take turns on the same (config, scale) of `integrations/sglang/cost.py` (`measure_all`, CPU time per
`cache.evict` call), the order alternating round by round; medians over the rounds, after / before,
raw and over each side's own `lru@py` (SGLang's lru on the Python core: the same code on both sides,
timed in the same round). Figures printed, never asserted. Run in the SGLang venv:

    .venv-sglang/bin/python benchmarks/sglang_cost_ab.py --before /path/to/main/src --after src [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

PLAN = [(0, 1), (15, 1), (38, 1), (0, 4)]  # (sweep config, pool scale)


def worker() -> None:
    from radixflow.integrations.sglang.cost import measure_all, scaled
    from radixflow.integrations.sglang.sweep import sweep_configs

    cfgs = sweep_configs()
    print("ready", flush=True)
    for line in sys.stdin:
        i, k = map(int, line.split())
        res = measure_all(scaled(cfgs[i], k), repeats=1)
        print(json.dumps({b: [c.calls, c.per_call] for b, c in res.items()}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="the src folder of the code before")
    ap.add_argument("--after", required=True, help="the src folder of the code after")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker()
        return
    procs = {}
    for side in ("before", "after"):
        env = {**os.environ, "PYTHONPATH": os.path.abspath(getattr(args, side)), "PYTHONWARNINGS": "ignore"}
        procs[side] = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", "--before", "-",
                                        "--after", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.DEVNULL, text=True, env=env)
    for p in procs.values():
        while p.stdout.readline().strip() != "ready":
            pass
    got: dict = {}
    for r in range(args.rounds):
        for i, k in PLAN:
            for side in (("before", "after") if r % 2 == 0 else ("after", "before")):
                t0 = time.time()
                procs[side].stdin.write(f"{i} {k}\n")
                procs[side].stdin.flush()
                got.setdefault((i, k, side), []).append(json.loads(procs[side].stdout.readline()))
                print(f"round {r} config {i} x{k} {side}: {time.time() - t0:.0f} s, load {os.getloadavg()[0]:.1f}",
                      flush=True)
    for p in procs.values():
        p.stdin.close()
    backends = list(got[(*PLAN[0], "before")][0])
    print("\n| config | scale | backend | evict calls (before / after) | µs/call before | µs/call after "
          "| after / before | after / before, × lru@py |")
    print("|---|---|---|---|---|---|---|---|")
    norm: dict = {b: [] for b in backends}
    for i, k in PLAN:
        b_runs, a_runs = got[(i, k, "before")], got[(i, k, "after")]
        for b in backends:
            bef = statistics.median(x[b][1] for x in b_runs) * 1e6
            aft = statistics.median(x[b][1] for x in a_runs) * 1e6
            nb = statistics.median(x[b][1] / x["lru@py"][1] for x in b_runs)
            na = statistics.median(x[b][1] / x["lru@py"][1] for x in a_runs)
            norm[b].append(na / nb)
            print(f"| {i} | {k}x | {b} | {b_runs[0][b][0]} / {a_runs[0][b][0]} | {bef:.0f} | {aft:.0f} | "
                  f"{aft / bef:.2f} | {na / nb:.2f} |")
    print()
    for b, v in norm.items():
        print(f"{b}: per call after / before, × lru@py, median {statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})")


if __name__ == "__main__":
    main()
