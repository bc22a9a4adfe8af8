"""Rounds against reuse for the branch-checkpoint wait rule (`--checkpoint-wait`, docs/checkpoints.md).

On the multi-candidate workload with vLLM-sized blocks (Qwen3.5-4B, 528-token blocks), one run per
rule on the same trace, beside boundary checkpoints and the full-attention control (Qwen3-8B,
16-token pages):

    python benchmarks/checkpoint_wait.py                  # the 120-question sample (seconds)
    python benchmarks/checkpoint_wait.py --full --waits grid,64   # the whole workload (minutes per run)

The sample is 120 questions of each stream, forward order, 3 req/s, S = 16, T = 8,192; `--full` is
every question, both orders, the paper's rates and budgets. Rows: rounds K, reuse %, ΔK and Δreuse
against boundary checkpoints, the gap to the control, T_host and mean latency.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import tempfile

from radixflow.cli import main as cli


def run(model: str, extra: list[str], full: bool) -> dict:
    """One `simulate` arm (radixflow) on the sample or the whole workload; `--handoff off` unless `extra`
    names a mode: these rows are the wait rule's (docs/checkpoints.md), the default `auto` hands off."""
    sample = [] if full else ["--questions", "120", "--rate", "3", "--max-num-seqs", "16", "--order", "forward"]
    if "--handoff" not in extra:
        extra = [*extra, "--handoff", "off"]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "arm.json")
        with contextlib.redirect_stdout(io.StringIO()):
            rc = cli(["simulate", "--model", model, "--policy", "radixflow", *sample, *extra, "--json", out])
        if rc:
            raise SystemExit(f"simulate {model} {' '.join(extra)} exited with {rc}")
        with open(out) as f:
            return json.load(f)["arms"][0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="the whole paper workload instead of the sample")
    ap.add_argument("--waits", default="grid,400,350,300,64,1", help="comma list of --checkpoint-wait values")
    ap.add_argument("--snapshot-mode", default="every-boundary", help="every-boundary or vllm-align")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    blocks = ["--block-size", "528", "--state-interval", "528", "--snapshot-mode", args.snapshot_mode]
    control = run("qwen3-8b", [], args.full)
    boundary = run("qwen3.5-4b", [*blocks, "--checkpoints", "boundary"], args.full)
    rows = [("qwen3-8b control", control), ("qwen3.5-4b boundary", boundary)]
    for w in (x.strip() for x in args.waits.split(",") if x.strip()):
        rows.append((f"qwen3.5-4b branch, wait {w}",
                     run("qwen3.5-4b", [*blocks, "--checkpoints", "branch", "--checkpoint-wait", w], args.full)))
    print(f"{'run':32s} {'rounds':>7s} {'reuse %':>8s} {'ΔK vs bd':>9s} {'Δreuse pp':>10s} {'vs control pp':>14s} "
          f"{'blocked':>8s} {'T_host s':>9s} {'latency s':>10s}")
    for name, a in rows:
        print(f"{name:32s} {a['rounds']:7d} {a['reuse_rate']:8.3f} {a['rounds'] - boundary['rounds']:+9d} "
              f"{a['reuse_rate'] - boundary['reuse_rate']:+10.3f} {a['reuse_rate'] - control['reuse_rate']:+14.3f} "
              f"{a['blocked_deferrals']:8d} {a['host_time']:9.2f} {a['latency_mean']:10.3f}")


if __name__ == "__main__":
    main()
