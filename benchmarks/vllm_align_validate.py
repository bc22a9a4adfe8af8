"""Does `--snapshot-mode vllm-align` predict vLLM 0.33's scheduler? Prints one row per trace x arm.

Each trace runs twice under the same cost model and virtual clock: through radixflow's own scheduler
in vllm-align mode (`sim.runner.run_arm`) and through vLLM's real `Scheduler` (`integrations.vllm.sim_backend`,
native for `radix`, the state-ready plugin for `radixflow`). Printed: steps, rows per step and
prefix-hit tokens on both sides and their relative differences (figures, never asserted here).

    python benchmarks/vllm_align_validate.py [--questions 48] [--models qwen3.5-0.8b,...] [--gap 0.0005]
        [--prefix-match-unit 16]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from radixflow.commands.common import PAPER_BUDGETS, PAPER_RATES  # noqa: E402
from radixflow.config import SchedulerConfig  # noqa: E402
from radixflow.core.policies import get_arm  # noqa: E402
from radixflow.integrations.vllm.sim_backend import run_vllm_arm  # noqa: E402
from radixflow.sim.cost_model import get_gpu  # noqa: E402
from radixflow.sim.runner import SimSetup, run_arm  # noqa: E402
from radixflow.spec import get_spec  # noqa: E402
from radixflow.workloads.qa import QUALITY, RACE_M, stream_records, synth_questions  # noqa: E402
from radixflow.workloads.trace import branch_from_record  # noqa: E402

SHAPES = {"race-m": RACE_M, "quality": QUALITY}


def trace(shape: str, questions: int, stream: str, rate: float, gap: float, seed: int):
    qs = synth_questions(SHAPES[shape], random.Random(seed), questions)
    return [branch_from_record(r) for r in stream_records(qs, stream, "forward", rate, seed, branch_gap=gap)]


def compare(model: str, shape: str, questions: int, stream: str, rate: float, gap: float, arm_name: str,
            seed: int = 0, unit: int = 0) -> dict:
    spec = get_spec(model)
    s, t = PAPER_BUDGETS.get(model, (16, 8192))
    setup = SimSetup(spec, get_gpu("a800"), SchedulerConfig(max_num_seqs=s, max_num_batched_tokens=t,
                                                              snapshot_mode="vllm-align",
                                                              prefix_match_unit=unit, handoff="off"))
    branches = trace(shape, questions, stream, rate, gap, seed)
    arm = get_arm(arm_name)
    ours, _ = run_arm(setup, arm, [branches])
    theirs, _ = run_vllm_arm(setup, arm, [branches])
    return {"ours": ours, "vllm": theirs, "block": setup.scheduler_config().block_size}


def rel(a: float, b: float) -> float:
    return 100.0 * (a - b) / b if b else (0.0 if a == b else float("inf"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--questions", type=int, default=48)
    p.add_argument("--models", default="qwen3.5-0.8b,qwen3.5-27b,nemotron-nano-9b-v2")
    p.add_argument("--shapes", default="race-m,quality")
    p.add_argument("--streams", default="cold,reuse")
    p.add_argument("--arms", default="radix,radixflow")
    p.add_argument("--gap", type=float, default=0.0005, help="mean seconds between a question's branches")
    p.add_argument("--prefix-match-unit", type=int, default=0,
                   help="vLLM's hash block on both sides (0: the block B, vLLM's default; 16: partial hits)")
    args = p.parse_args(argv)
    head = (f"{'model':20} {'trace':22} {'arm':10} {'B':>5} | {'steps':>6} {'vLLM':>6} {'Δ%':>6} | "
            f"{'rows/st':>7} {'vLLM':>7} {'Δ%':>6} | {'rows/br':>7} {'vLLM':>7} | "
            f"{'hit tok':>9} {'vLLM':>9} {'Δ%':>6} | {'s':>5}")
    print(head)
    worst = 0.0
    for model in args.models.split(","):
        for shape in args.shapes.split(","):
            for stream in args.streams.split(","):
                for rate in (0.0, PAPER_RATES.get(model, 5.0)):
                    for arm in args.arms.split(","):
                        t0 = time.perf_counter()
                        r = compare(model, shape, args.questions, stream, rate, args.gap, arm,
                                    unit=args.prefix_match_unit)
                        o, v = r["ours"], r["vllm"]
                        d = (rel(o.rounds, v.rounds), rel(o.rows_per_round, v.rows_per_round),
                             rel(o.cached_tokens, v.cached_tokens))
                        worst = max(worst, *(abs(x) for x in d))
                        name = f"{shape}/{stream}/{'burst' if rate == 0 else f'poisson {rate:g}'}"
                        print(f"{model:20} {name:22} {arm:10} {r['block']:>5} | {o.rounds:>6} {v.rounds:>6} "
                              f"{d[0]:>6.1f} | {o.rows_per_round:>7.2f} {v.rows_per_round:>7.2f} {d[1]:>6.1f} | "
                              f"{o.rows_per_branch:>7.2f} {v.rows_per_branch:>7.2f} | "
                              f"{o.cached_tokens:>9} {v.cached_tokens:>9} {d[2]:>6.1f} | "
                              f"{time.perf_counter() - t0:>5.1f}", flush=True)
    print(f"largest |Δ|: {worst:.2f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
