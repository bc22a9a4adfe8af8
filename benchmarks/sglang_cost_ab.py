"""Per-call eviction cost inside SGLang's cache, two checkouts side by side (issue #42: a refactor's
cost against the code before it): two worker processes, each importing radixflow from its own `src`,
take turns on the same (config, scale) of `integrations/sglang/cost.py` (`measure_all`, CPU time per
`cache.evict` call), the order alternating round by round; medians over the rounds, after / before,
raw and over each side's own `lru@py` (SGLang's lru on the Python core: the same code on both sides,
timed in the same round). Figures printed, never asserted. Run in the SGLang venv:

    .venv-sglang/bin/python benchmarks/sglang_cost_ab.py --before /path/to/main/src --after src [--rounds 4]

Timing moves by a few per cent on identical code on a shared machine, so `--instructions` counts
instead: each side replays each (config, backend) under valgrind's callgrind, collecting only inside
`cache.evict` (a toggle built here with `cc` from valgrind's `callgrind.h`), hash seed 0 and gc off;
it prints instructions after / before per backend. With `--runs 1` address-space randomisation is off
(`setarch -R`): one code gives one count. But two codes lay the heap out differently, which moves the
count of code they share (node sets hash by address): `lru@py` (SGLang's own lru, the same code on both
sides) is the reference. `--runs N` (N > 1) keeps randomisation on and takes each side's median of N
runs, sampling layouts. Needs valgrind (with its headers), cc and setarch:

    .venv-sglang/bin/python benchmarks/sglang_cost_ab.py --before /path/to/main/src --after src --instructions \
        [--runs 5] [--plan 38x1,0x4] [--backends lru@py,radixflow-rr-tail]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

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


TOGGLE_C = """#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void cg_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
"""
INSTR_BACKENDS = ("lru@py", "radixflow-rr-tail", "radixflow-level-tail", "radixflow-flop-aware")


def count_worker(backend: str, i: int, k: int) -> None:
    """One replay with callgrind collecting inside `cache.evict` only (the toggle: RADIXFLOW_CG_TOGGLE)."""
    import ctypes
    import gc

    from radixflow.integrations.sglang.cost import scaled, twin_for
    from radixflow.integrations.sglang.sweep import replay, sweep_configs

    lib = ctypes.CDLL(os.environ["RADIXFLOW_CG_TOGGLE"])
    cfg = scaled(sweep_configs()[i], k)
    tw = twin_for(backend, cfg)
    evict, started = tw.cache.evict, []

    def counted(*a, **kw):
        if not started:
            lib.cg_start()
            started.append(True)
        lib.cg_toggle()
        try:
            return evict(*a, **kw)
        finally:
            lib.cg_toggle()

    tw.cache.evict = counted
    gc.collect()
    gc.disable()
    replay(tw, cfg["sessions"], 1.0)
    print(json.dumps({"calls": len(tw.evict_calls)}), flush=True)


def instructions(args) -> None:
    missing = [t for t in ("valgrind", "cc", "setarch") if shutil.which(t) is None]
    if missing:
        sys.exit(f"error: --instructions needs {', '.join(missing)} on PATH")
    work = tempfile.mkdtemp(prefix="rf-cg-")
    src = os.path.join(work, "toggle.c")
    lib = os.path.join(work, "toggle.so")
    with open(src, "w") as f:
        f.write(TOGGLE_C)
    built = subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", lib, src], capture_output=True, text=True)
    if built.returncode:
        sys.exit(f"error: could not build the callgrind toggle (valgrind's headers?): {built.stderr.strip()}")
    plan = [tuple(map(int, p.split("x"))) for p in args.plan.split(",")] if args.plan else PLAN
    backends = args.backends.split(",") if args.backends else INSTR_BACKENDS

    fixed = ["setarch", "-R"] if args.runs == 1 else []

    def run(side: str, backend: str, i: int, k: int, r: int) -> tuple[int, int]:
        out = os.path.join(work, f"{side}-{backend}-{i}-{k}-{r}.out")
        env = {**os.environ, "PYTHONPATH": os.path.abspath(getattr(args, side)), "PYTHONWARNINGS": "ignore",
               "PYTHONHASHSEED": "0", "RADIXFLOW_CG_TOGGLE": lib}
        p = subprocess.run([*fixed, "valgrind", "--tool=callgrind", "--instr-atstart=no",
                            "--collect-atstart=no", f"--callgrind-out-file={out}", sys.executable,
                            os.path.abspath(__file__), "--count-worker", f"{backend},{i},{k}", "--before", "-",
                            "--after", "-"], capture_output=True, text=True, env=env)
        m = re.search(r"Collected\s*:\s*(\d+)", p.stderr)
        if p.returncode or m is None:
            sys.exit(f"error: callgrind run {side} {backend} config {i} x{k} failed: {p.stderr[-800:]}")
        os.remove(out)
        return int(m.group(1)), json.loads(p.stdout.strip().splitlines()[-1])["calls"]

    runs = max(1, args.runs)
    how = f"median of {runs} runs a side" if runs > 1 else "one run a side, address-space randomisation off"
    print(f"instructions inside evict calls, {how}\n")
    print("| config | scale | backend | evict calls (before / after) | instructions before | after | after / before |")
    print("|---|---|---|---|---|---|---|")
    ratios: dict = {b: [] for b in backends}
    with ThreadPoolExecutor(2) as pool:  # the two sides of one (config, backend) at once
        for i, k in plan:
            for b in backends:
                got = {"before": [], "after": []}
                for r in range(runs):
                    for side, res in zip(("before", "after"), pool.map(run, ("before", "after"), (b, b), (i, i),
                                                                         (k, k), (r, r))):
                        got[side].append(res)
                ib, cb = statistics.median(x[0] for x in got["before"]), got["before"][0][1]
                ia, ca = statistics.median(x[0] for x in got["after"]), got["after"][0][1]
                ratios[b].append(ia / ib)
                print(f"| {i} | {k}x | {b} | {cb} / {ca} | {ib:,.0f} | {ia:,.0f} | {ia / ib:.4f} |", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    print()
    for b, v in ratios.items():
        print(f"{b}: instructions inside evict calls, after / before, median {statistics.median(v):.4f} "
              f"({min(v):.4f}-{max(v):.4f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="the src folder of the code before")
    ap.add_argument("--after", required=True, help="the src folder of the code after")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--instructions", action="store_true",
                    help="count instructions inside evict calls under callgrind instead of timing")
    ap.add_argument("--plan", help="with --instructions: configs as CONFIGxSCALE,... (default: the timed plan)")
    ap.add_argument("--backends", help=f"with --instructions: backends (default: {','.join(INSTR_BACKENDS)})")
    ap.add_argument("--runs", type=int, default=1, help="with --instructions: runs a side (>1: layouts sampled)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--count-worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker()
        return
    if args.count_worker:
        b, i, k = args.count_worker.split(",")
        count_worker(b, int(i), int(k))
        return
    if args.instructions:
        instructions(args)
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
