"""The never-loses sweep through radixflow's simulator: `radixflow` vs `radix` on every config of
`radixflow.sim.sweep` (decode-heavy, KV-tight with preemption, priority, Poisson, long documents, the
1-token burst). Prints one line per config with the ratios and the bounds it breaks, if any.

    python benchmarks/sim_sweep.py [--only NAME_PREFIX] [--model qwen3.5-0.8b] [--handoff off|on|auto]

Both arms run `--handoff off` unless told (SPEC §12's claim is the wait path's; docs/simulator.md's figures).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from radixflow.sim.sweep import BOUNDS, check, configs, run_config  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="run only configs whose name starts with this")
    ap.add_argument("--model", default="qwen3.5-0.8b")
    ap.add_argument("--handoff", default="off", choices=("off", "on", "auto"), help="both arms (SPEC §15)")
    args = ap.parse_args(argv)
    todo = [c for c in configs() if c.name.startswith(args.only)]
    print(f"{len(todo)} configs, --handoff {args.handoff}; bounds: rounds x{BOUNDS['rounds']}, hits x{BOUNDS['hits']}, "
          f"finish x{BOUNDS['finish']} (radixflow / radix)")
    head = ("config", "seed", "rounds", "ratio", "hit tok", "ratio", "finish s", "ratio", "preempt", "defer")
    print(f"{head[0]:<22}{head[1]:>5}{head[2]:>12}{head[3]:>7}{head[4]:>14}{head[5]:>7}{head[6]:>16}"
          f"{head[7]:>7}{head[8]:>9}{head[9]:>7}")
    broken = 0
    worst = {"rounds": 0.0, "hits": 9.0, "finish": 0.0}
    for c in todo:
        r = run_config(c, args.model, handoff=args.handoff)
        a, b = r["radix"], r["radixflow"]
        ratios = {"rounds": b.rounds / a.rounds, "hits": b.hits / a.hits if a.hits else 1.0,
                  "finish": b.finish / a.finish}
        worst = {"rounds": max(worst["rounds"], ratios["rounds"]), "hits": min(worst["hits"], ratios["hits"]),
                 "finish": max(worst["finish"], ratios["finish"])}
        bad = check(r)
        broken += bool(bad)
        print(f"{c.name:<22}{c.seed:>5}{a.rounds:>6}/{b.rounds:<5}{ratios['rounds']:>7.3f}"
              f"{a.hits:>7}/{b.hits:<6}{ratios['hits']:>7.3f}{a.finish:>8.3f}/{b.finish:<7.3f}"
              f"{ratios['finish']:>7.3f}{a.preemptions:>4}/{b.preemptions:<4}{b.deferrals:>7}"
              + ("   BREAKS: " + "; ".join(bad) if bad else ""))
    print(f"worst ratios: rounds {worst['rounds']:.3f}, hits {worst['hits']:.3f}, finish {worst['finish']:.3f}; "
          f"{broken} of {len(todo)} configs break a bound")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
