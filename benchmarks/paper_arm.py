"""Wall time of one paper-shaped arm (all streams and orders, SPEC §11 budgets and rates) for one model."""

from __future__ import annotations

import argparse
import time

from radixflow.cli import main as cli


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="qwen3.5-27b")
    ap.add_argument("--policy", default="radixflow")
    args = ap.parse_args()
    t0 = time.perf_counter()
    c0 = time.process_time()
    cli(["simulate", "--model", args.model, "--policy", args.policy, "--handoff", "off"])  # the paper's arm
    print(f"one paper-shaped arm ({args.model}, {args.policy}): wall {time.perf_counter() - t0:.1f} s, "
          f"cpu {time.process_time() - c0:.1f} s")


if __name__ == "__main__":
    main()
