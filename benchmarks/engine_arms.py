"""The arms of `radixflow bench` side by side on a shared machine: each (policy, --handoff) run in turn,
cycled --repeat times in one process on the same loaded model, so every arm sees the same load; prints
each run and the medians of T_host, mean latency and the extra levels' time, gross and marginal (SPEC §15,
docs/handoff.md). Figures are printed, never asserted.

    PYTHONPATH=src python benchmarks/engine_arms.py --model tiny-qwen3.5 [--questions 32] [--repeat 3]
        [--arms radix:off radix:auto radixflow:off radixflow:auto]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from radixflow.cli import make_parser  # noqa: E402
from radixflow.commands import bench  # noqa: E402
from radixflow.commands.common import build_workloads  # noqa: E402
from radixflow.core.loop import run_trace  # noqa: E402
from radixflow.core.metrics import measure, merge  # noqa: E402
from radixflow.engine.calibration import levels_cost  # noqa: E402
from radixflow.engine.engine import Engine, _dtype  # noqa: E402
from radixflow.engine.loader import load_model  # noqa: E402
from radixflow.engine.tiny import resolve_model  # noqa: E402
from radixflow.workloads.trace import fresh_copies  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-qwen3.5")
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--arms", nargs="+", default=["radix:off", "radix:auto", "radixflow:off", "radixflow:auto"],
                    help="policy:handoff pairs")
    args = ap.parse_args()
    arms = [tuple(a.split(":")) for a in args.arms]
    argv = ["bench", "--model", args.model, "--questions", str(args.questions)]
    parser, _ = make_parser(argv)
    bargs = parser.parse_args(argv)
    torch.set_num_threads(1)
    pl = bench.plan(bargs)
    cfg, base = pl.scheduler, pl.engine
    loaded = load_model(resolve_model(args.model), torch.device("cpu"), _dtype(base.dtype))
    workloads = build_workloads(bargs, args.model, vocab=min(loaded.model.vocab_size, 32000))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{args.model}, {args.questions} questions, {args.repeat} cycles, load average {load:.1f}")
    seen: dict[tuple, list] = {a: [] for a in arms}
    marginal: dict[tuple, list] = {a: [] for a in arms}  # the levels' marginal share (engine/calibration.py)
    for cycle in range(args.repeat):
        for policy, mode in arms:
            parts, levels = [], []
            for _, brs in workloads:
                eng = Engine(replace(base, policy=policy, scheduler=replace(cfg, handoff=mode)), loaded=loaded)
                cal = eng.executor.calibration
                since = len(cal.levels_log) if cal is not None else 0
                parts.append(measure(policy, run_trace(eng.scheduler, eng.executor, fresh_copies(brs))))
                levels += cal.levels_log[since:] if cal is not None else []
            r = merge(policy, parts)
            marginal[(policy, mode)].append(levels_cost(levels)["marginal"] / r.host_time)
            seen[(policy, mode)].append(r)
            print(f"  cycle {cycle + 1} {policy:10s} {mode:4s} rounds {r.rounds:3d} T_host {r.host_time:6.2f} s "
                  f"latency {r.latency_mean:.3f} s levels {r.handoff_time:.3f} s (marginal "
                  f"{marginal[(policy, mode)][-1]:.1%} of T_host)", flush=True)
    best = min(statistics.median(x.host_time for x in v) for v in seen.values())
    for (policy, mode), v in seen.items():
        t = statistics.median(x.host_time for x in v)
        print(f"{policy:10s} {mode:4s} median T_host {t:6.2f} s (x{t / best:.3f} of the best) latency "
              f"{statistics.median(x.latency_mean for x in v):.3f} s levels "
              f"{statistics.median(x.handoff_time / x.host_time for x in v):.1%} of T_host gross, "
              f"{statistics.median(marginal[(policy, mode)]):.1%} marginal")


if __name__ == "__main__":
    main()
