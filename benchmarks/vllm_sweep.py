"""The SPEC §12 sweep through vLLM 0.33's own scheduler on CPU: native against the plugin, per config.

For every configuration of `radixflow.integrations.vllm.sweep.sweep_configs()` it prints steps,
prefix-hit tokens, last finish step and preemptions for both arms and the three ratios the claim rule
must keep (plugin/native: steps <= 1.02, hit tokens >= 0.98, last finish <= 1.05), then the
RACE-M-shaped 256-question burst (all arrivals at 0, S = 16, T = 8192): steps native -> plugin and the
reduction (>= 40 % required).

    python benchmarks/vllm_sweep.py [--only NAME_SUBSTRING] [--skip-race]

vLLM prints CPU-platform notices on stderr; the tables are on stdout.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

LIMITS = {"steps": 1.02, "hits": 0.98, "finish": 1.05}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="", help="run only configs whose name contains this")
    p.add_argument("--skip-race", action="store_true", help="skip the 256-question RACE-M burst")
    p.add_argument("--race-questions", type=int, default=256)
    args = p.parse_args(argv)
    from radixflow.integrations.vllm.sweep import run_config, sweep_configs

    cols = f"{'config':<22} {'steps n/p':>11} {'hits n/p':>11} {'finish n/p':>11} {'preempt n/p':>11} " \
           f"{'defer':>6} {'steps':>6} {'hits':>6} {'finish':>6}  ok"
    print(cols)
    failures = 0
    for config in sweep_configs():
        if args.only not in config.name:
            continue
        native, plugin = run_config(config, plugin=False), run_config(config, plugin=True)
        r_steps = plugin.steps / native.steps
        r_hits = plugin.hit_tokens / native.hit_tokens if native.hit_tokens else 1.0
        r_finish = plugin.last_finish_step / native.last_finish_step
        ok = r_steps <= LIMITS["steps"] and r_hits >= LIMITS["hits"] and r_finish <= LIMITS["finish"]
        failures += not ok
        pairs = " ".join(f"{getattr(native, f):>5}/{getattr(plugin, f):<5}"
                         for f in ("steps", "hit_tokens", "last_finish_step", "preemptions"))
        print(f"{config.name:<22} {pairs} {plugin.deferrals:>6} {r_steps:>6.3f} {r_hits:>6.3f} {r_finish:>6.3f}  "
              f"{'yes' if ok else 'NO'}")
    print(f"configs failing a limit: {failures}")
    if not args.skip_race:
        from vllm_replay import qa_branches, replay_vllm

        branches = qa_branches("race-m", args.race_questions, "cold", 0.0, 0)
        native = replay_vllm(branches, False, 16, 8192, 16)
        plugin = replay_vllm(branches, True, 16, 8192, 16)
        cut = 1 - plugin["steps"] / native["steps"]
        print(f"RACE-M burst, {args.race_questions} questions: steps {native['steps']} -> {plugin['steps']} "
              f"(reduction {100 * cut:.1f} %), reuse {native['reuse_pct']:.3f} -> {plugin['reuse_pct']:.3f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
