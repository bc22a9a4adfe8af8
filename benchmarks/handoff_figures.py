"""In-forward state hand-off (SPEC §15, docs/handoff.md) on the multi-candidate workload: control /
boundary / grid / hand-off, the figures of issue 18's "Done when".

One run per row on the same trace: the full-attention control (Qwen3-8B, 16-token pages) and
Qwen3.5-4B in the vLLM-sized geometry (528-token blocks) with boundary checkpoints, branch
checkpoints (`grid`) and branch checkpoints with `--handoff auto` (and `on`), the extra level charged
by the cost model (`CostModel.level_time`):

    python benchmarks/handoff_figures.py                        # the 120-question sample (seconds)
    python benchmarks/handoff_figures.py --snapshot-mode vllm-align
    python benchmarks/handoff_figures.py --full --eviction flop-aware   # the whole workload (minutes per run)

Prints rounds K, reuse %, T_host, mean latency, hand-off rows / rounds, the extra-level time, and
whether "reuse within 1 pp of the control's, rounds <= boundary's (vllm-align: x1.02), T_host <=
grid's" holds for each hand-off row.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from checkpoint_wait import run  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="the whole paper workload instead of the sample")
    ap.add_argument("--eviction", default="lru", help="eviction policy of every run")
    ap.add_argument("--snapshot-mode", default="every-boundary", help="every-boundary or vllm-align")
    ap.add_argument("--modes", default="auto,on", help="comma list of --handoff values for the hand-off rows")
    ap.add_argument("--max-levels", default="2", help="--handoff-max-levels of the hand-off rows")
    ap.add_argument("--check", action="store_true", help="check_integrity() after every round (slower)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    common = ["--eviction", args.eviction, *(["--check"] if args.check else [])]
    blocks = ["--block-size", "528", "--state-interval", "528", "--snapshot-mode", args.snapshot_mode, *common]
    control = run("qwen3-8b", common, args.full)
    boundary = run("qwen3.5-4b", [*blocks, "--checkpoints", "boundary"], args.full)
    grid = run("qwen3.5-4b", [*blocks, "--checkpoints", "branch"], args.full)
    rows = [("qwen3-8b control", control), ("qwen3.5-4b boundary", boundary), ("qwen3.5-4b branch grid", grid)]
    handoffs = []
    for mode in (x.strip() for x in args.modes.split(",") if x.strip()):
        a = run("qwen3.5-4b", [*blocks, "--checkpoints", "branch", "--handoff", mode,
                               "--handoff-max-levels", args.max_levels], args.full)
        rows.append((f"qwen3.5-4b branch hand-off {mode}", a))
        handoffs.append((mode, a))
    print(f"{'run':34s} {'rounds':>7s} {'reuse %':>8s} {'vs control pp':>14s} {'T_host s':>9s} {'latency s':>10s} "
          f"{'blocked':>8s} {'hand-offs':>10s} {'ho rounds':>10s} {'levels s':>9s}")
    for name, a in rows:
        print(f"{name:34s} {a['rounds']:7d} {a['reuse_rate']:8.3f} {a['reuse_rate'] - control['reuse_rate']:+14.3f} "
              f"{a['host_time']:9.2f} {a['latency_mean']:10.3f} {a['blocked_deferrals']:8d} "
              f"{a.get('handoff_rows', 0):10d} {a.get('handoff_rounds', 0):10d} {a.get('handoff_time', 0.0):9.2f}")
    slack = 1.02 if args.snapshot_mode == "vllm-align" else 1.0
    for mode, a in handoffs:
        reuse = a["reuse_rate"] - control["reuse_rate"]
        ok = (reuse >= -1.0, a["rounds"] <= slack * boundary["rounds"], a["host_time"] <= grid["host_time"])
        print(f"hand-off {mode}: reuse within 1 pp of the control {'yes' if ok[0] else 'NO'} ({reuse:+.3f} pp), "
              f"rounds <= {slack:g} x boundary {'yes' if ok[1] else 'NO'} ({a['rounds']} vs {boundary['rounds']}), "
              f"T_host <= grid {'yes' if ok[2] else 'NO'} ({a['host_time']:.2f} vs {grid['host_time']:.2f} s): "
              f"{'HOLDS' if all(ok) else 'DOES NOT HOLD'}")


if __name__ == "__main__":
    main()
