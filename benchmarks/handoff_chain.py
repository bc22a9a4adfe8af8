"""Chained producers with and without in-forward hand-off (SPEC §15): rounds beside the bound
K >= max(⌈W/T⌉, ⌈V/S⌉, ⌈D/L⌉) (core/metrics.py: lower_bound), on the simulator.

    python benchmarks/handoff_chain.py [--documents 2] [--questions 12] [--model qwen3.5-4b]

Each question appends a segment to the previous question's context of the same document
(workloads/chained.py), all arriving at t = 0. Rows: --handoff off (L = 1) and on/auto with L = 2, 3, 4
levels per forward: rounds K, the bound and its three terms, hand-off rows, extra-level time, T_host.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from radixflow.config import SchedulerConfig  # noqa: E402
from radixflow.core.policies import get_arm  # noqa: E402
from radixflow.sim.cost_model import get_gpu  # noqa: E402
from radixflow.sim.runner import SimSetup, run_arm  # noqa: E402
from radixflow.spec.model_spec import get_spec  # noqa: E402
from radixflow.workloads.chained import chained_records  # noqa: E402
from radixflow.workloads.trace import branch_from_record  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--documents", type=int, default=2)
    ap.add_argument("--questions", type=int, default=12)
    ap.add_argument("--document-len", type=int, default=512)
    ap.add_argument("--segment-len", type=int, default=256)
    ap.add_argument("--model", default="qwen3.5-4b")
    ap.add_argument("--gpu", default="a800")
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    args = ap.parse_args()
    recs = chained_records(args.documents, args.questions, args.document_len, args.segment_len)
    branches = [branch_from_record(r) for r in recs]
    spec, gpu = get_spec(args.model), get_gpu(args.gpu)
    S, T = args.max_num_seqs, args.max_num_batched_tokens
    print(f"{args.documents} chains of {args.questions} questions ({args.document_len} + i x {args.segment_len} "
          f"tokens), {args.model}, S = {S}, T = {T}, 16-token pages, 64-token state interval")
    print(f"{'handoff':>8s} {'L':>3s} {'rounds':>7s} {'bound':>6s} {'W/T':>5s} {'V/S':>5s} {'D/L':>5s} {'D':>4s} "
          f"{'hand-offs':>10s} {'levels s':>9s} {'T_host s':>9s} {'reuse %':>8s}")
    for mode, levels in (("off", 1), ("on", 2), ("on", 3), ("on", 4), ("auto", 2), ("auto", 4)):
        cfg = SchedulerConfig(max_num_seqs=S, max_num_batched_tokens=T, block_size=16, state_interval=64,
                              handoff=mode, handoff_max_levels=levels)
        m, _ = run_arm(SimSetup(spec, gpu, cfg, check=True), get_arm("radixflow"), [branches])
        L = levels if mode != "off" else 1
        terms = (math.ceil(m.tokens / T), math.ceil(m.fragments / S), math.ceil(m.dependency_depth / L))
        print(f"{mode:>8s} {L:3d} {m.rounds:7d} {m.lower_bound:6d} {terms[0]:5d} {terms[1]:5d} {terms[2]:5d} "
              f"{m.dependency_depth:4d} {m.handoff_rows:10d} {m.handoff_time:9.3f} {m.host_time:9.3f} "
              f"{m.reuse_rate:8.3f}")


if __name__ == "__main__":
    main()
