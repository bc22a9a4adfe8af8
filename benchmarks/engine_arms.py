"""The arms of `radixflow bench` side by side on a shared machine: each (policy, --handoff) run in turn,
cycled --repeat times in one process on the same loaded model, so every arm sees the same load; prints
each run and the medians of T_host, mean latency and the extra levels' time, gross and marginal (SPEC §15,
docs/handoff.md), and each arm's first tokens against the first arm's (the same set in every cycle).
Figures are printed, never asserted.

Two figures that other processes on the machine move less than T_host (wall clock):
- T_cpu: the process CPU time of the forwards (what T_host is when nothing else runs; cache contention
  still moves it);
- T_work: every arm's rounds priced by ONE cost model, least squares over all arms' rounds of all cycles
  (CPU seconds = base + tokens + rows + tokens of the longest row + scan calls, each times a fitted
  cost: what any forward does, hand-off or not). Two arms that run the same work get the same T_work
  however the load moved while each ran; the residual (T_cpu − T_work) is what the model does not explain.

    PYTHONPATH=src python benchmarks/engine_arms.py --model tiny-qwen3.5 [--questions 32] [--repeat 3]
        [--bench-flags "--kv-cache-memory 6GiB --torch-threads 2"]   # any `radixflow bench` flag
        [--arms radix:off radix:auto radixflow:off radixflow:auto]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from radixflow.cli import make_parser  # noqa: E402
from radixflow.commands import bench  # noqa: E402
from radixflow.core.loop import run_trace  # noqa: E402
from radixflow.core.metrics import measure, merge  # noqa: E402
from radixflow.engine.calibration import levels_cost  # noqa: E402
from radixflow.engine.engine import Engine  # noqa: E402
from radixflow.engine.models import batch as model_batch  # noqa: E402
from radixflow.workloads.trace import fresh_copies  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-qwen3.5")
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--arms", nargs="+", default=["radix:off", "radix:auto", "radixflow:off", "radixflow:auto"],
                    help="policy:handoff pairs")
    ap.add_argument("--rounds-json", default=None, metavar="FILE",
                    help="write every arm's per-round features and CPU seconds (per cycle) to FILE")
    ap.add_argument("--bench-flags", default="",
                    help="more `radixflow bench` flags, one string (e.g. a real-size model's --kv-cache-memory)")
    args = ap.parse_args()
    arms = [tuple(a.split(":")) for a in args.arms]
    argv = ["bench", "--model", args.model, "--questions", str(args.questions), *shlex.split(args.bench_flags)]
    parser, _ = make_parser(argv)
    bargs = parser.parse_args(argv)
    torch.set_num_threads(bargs.torch_threads or torch.get_num_threads())
    pl, loaded, workloads = bench.load(bargs)
    cfg, base = pl.scheduler, pl.engine
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{args.model}, {args.questions} questions, {args.repeat} cycles, load average {load:.1f}")
    seen: dict[tuple, list] = {a: [] for a in arms}
    rounds: dict[tuple, list] = {a: [] for a in arms}  # per cycle: the arm's per-round features and CPU time
    calls = _count_scan_calls()
    marginal: dict[tuple, list] = {a: [] for a in arms}  # the levels' marginal share (engine/calibration.py)
    firsts: dict[tuple, dict] = {a: {} for a in arms}  # (part, branch key) -> first token, every cycle
    for cycle in range(args.repeat):
        for policy, mode in arms:
            parts, levels, recs = [], [], []
            for part, (_, brs) in enumerate(workloads):
                eng = Engine(replace(base, policy=policy, scheduler=replace(cfg, handoff=mode)), loaded=loaded)
                _record_rounds(eng.executor, recs, calls)
                cal = eng.executor.calibration
                since = len(cal.levels_log) if cal is not None else 0
                copies = fresh_copies(brs)
                parts.append(measure(policy, run_trace(eng.scheduler, eng.executor, copies)))
                for b in copies:
                    if b.output:
                        firsts[(policy, mode)].setdefault((part, b.key), set()).add(b.output[0])
                levels += cal.levels_log[since:] if cal is not None else []
                del eng.executor.execute  # the wrapper's cycle would keep the engine's pool alive
                del eng
                gc.collect()
            r = merge(policy, parts)
            marginal[(policy, mode)].append(levels_cost(levels)["marginal"] / r.host_time)
            seen[(policy, mode)].append(r)
            rounds[(policy, mode)].append(recs)
            print(f"  cycle {cycle + 1} {policy:10s} {mode:4s} rounds {r.rounds:3d} T_host {r.host_time:6.2f} s "
                  f"latency {r.latency_mean:.3f} s levels {r.handoff_time:.3f} s (marginal "
                  f"{marginal[(policy, mode)][-1]:.1%} of T_host) T_cpu {sum(x[-1] for x in recs):6.2f} s",
                  flush=True)
    best = min(statistics.median(x.host_time for x in v) for v in seen.values())
    cpu = {a: statistics.median(sum(x[-1] for x in recs) for recs in v) for a, v in rounds.items()}
    work, coef = _price(rounds)
    if args.rounds_json:
        with open(args.rounds_json, "w") as fh:
            json.dump({"features": [*FEATURES, "cpu_seconds"],
                       "arms": {f"{p}:{m}": v for (p, m), v in rounds.items()}}, fh)
    for (policy, mode), v in seen.items():
        a = (policy, mode)
        n_calls = statistics.median(sum(x[4] for x in recs) for recs in rounds[a])
        t = statistics.median(x.host_time for x in v)
        print(f"{policy:10s} {mode:4s} median T_host {t:6.2f} s (x{t / best:.3f} of the best) latency "
              f"{statistics.median(x.latency_mean for x in v):.3f} s levels "
              f"{statistics.median(x.handoff_time / x.host_time for x in v):.1%} of T_host gross, "
              f"{statistics.median(marginal[a]):.1%} marginal; T_cpu {cpu[a]:6.2f} s "
              f"(x{cpu[a] / min(cpu.values()):.3f}), scan calls {n_calls}"
              f", T_work {work[a]:6.2f} s (x{work[a] / min(work.values()):.3f})")
    ref = firsts[arms[0]]
    for a in arms[1:]:
        same = sum(1 for k, v in firsts[a].items() if v == ref.get(k))
        print(f"first-token agreement {a[0]}:{a[1]} vs {arms[0][0]}:{arms[0][1]} over all cycles: "
              f"{100 * same / max(1, len(firsts[a])):.2f}% ({same}/{len(firsts[a])})")
    print("one cost model over every arm's rounds (CPU ms): " + ", ".join(
        f"{1000 * c:.4g} per {name}" for name, c in zip(FEATURES, coef)))


# what a round's CPU time is fitted on (T_work); "1" is the round's base cost
FEATURES = ("1", "token", "row", "token of the longest row", "scan call")


def _count_scan_calls() -> list[int]:
    """Counts the chunked-scan calls of every plan the engine builds (one plan per recurrent level and
    chunk; a plan's calls run once per recurrent layer, the same layers in every arm)."""
    box = [0]
    build = model_batch.build_chunk_plan

    def counted(*a, **k):
        plan = build(*a, **k)
        box[0] += len(plan.steps)
        return plan

    model_batch.build_chunk_plan = counted
    return box


def _record_rounds(executor, recs: list, calls: list[int]) -> None:
    """Wraps `executor.execute` to append each round's features and the process CPU time of its forward."""
    execute = executor.execute

    def timed(batch):
        n0, c0 = calls[0], time.process_time()
        res = execute(batch)
        cpu = time.process_time() - c0
        fr = batch.fragments
        recs.append((1, batch.num_tokens, len(fr), max(f.num_tokens for f in fr), calls[0] - n0, cpu))
        return res

    executor.execute = timed


def _price(rounds: dict[tuple, list]) -> tuple[dict[tuple, float], np.ndarray]:
    """Every arm's median T_work: its rounds priced by one least-squares fit over all arms' rounds of all
    cycles (the features are counts, the target the forward's CPU seconds), and the fitted costs."""
    rows = [r for v in rounds.values() for recs in v for r in recs]
    x = np.array([r[:-1] for r in rows], dtype=float)
    y = np.array([r[-1] for r in rows], dtype=float)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    work = {a: statistics.median(float(np.array([r[:-1] for r in recs], dtype=float).sum(0) @ coef) for recs in v)
            for a, v in rounds.items()}
    return work, coef


if __name__ == "__main__":
    main()
