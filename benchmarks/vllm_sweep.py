"""The SPEC §12 sweep through vLLM 0.33's own scheduler on CPU: native against the plugin, per config.

For every configuration of `radixflow.integrations.vllm.sweep.sweep_configs()` it prints steps,
prefix-hit tokens, last finish step and preemptions for both arms and the three ratios the claim rule
must keep (plugin/native: steps <= 1.02, hit tokens >= 0.98, last finish <= 1.05), then the
RACE-M-shaped 256-question burst (all arrivals at 0, S = 16, T = 8192): steps native -> plugin and the
reduction (>= 40 % required).

    python benchmarks/vllm_sweep.py [--only NAME_SUBSTRING] [--skip-race] [--seeds 10,11,12,13]
                                    [--spec-tokens 1,3]

`--seeds` reruns every selected config with each of the given seeds instead of its own (held-out runs).
`--tight-pool-seeds 0-199` adds issue 44's tight-pool shape (S = 10, T = 1,024, 64 blocks of 16,
watermark 0.02, 9 x 9 one-token branches) at each of those seeds, sync and async, and counts, for each,
the seeds where the plugin is worse than native.
`--spec-tokens` adds the speculative-decoding configs (`sweep.spec_configs`: for each N, sync and async,
ngram and EAGLE drafts, decode-heavy, KV-tight and the paper's QA shape; seeded draft acceptance, the
same draws in both arms). The last lines count the configs that break a limit and those where the plugin
is worse than native at all in steps, hit tokens or last finish.

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
    p.add_argument("--seeds", default="", help="comma-separated seeds to rerun each config with (held-out runs)")
    p.add_argument("--tight-pool-seeds", default="",
                   help="seeds for the tight-pool shape, sync and async: a range A-B (inclusive) or a comma list")
    p.add_argument("--spec-tokens", default="",
                   help="comma-separated num_speculative_tokens values (>= 1): add speculative-decoding configs")
    args = p.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        p.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    try:
        tight_seeds = _seed_list(args.tight_pool_seeds)
    except ValueError:
        p.error(f"--tight-pool-seeds must be a range A-B or comma-separated integers, got {args.tight_pool_seeds!r}")
    try:
        spec_tokens = [int(s) for s in args.spec_tokens.split(",") if s.strip()]
    except ValueError:
        spec_tokens = [0]
    if any(n < 1 for n in spec_tokens):
        p.error(f"--spec-tokens must be comma-separated integers >= 1, got {args.spec_tokens!r}")
    from radixflow.integrations.vllm.sweep import (
        run_config,
        spec_configs,
        sweep_configs,
        tight_pool_configs,
        with_seed,
    )

    configs = [c for c in sweep_configs() + spec_configs(spec_tokens) if args.only in c.name]
    if seeds:
        configs = [with_seed(c, s) for c in configs for s in seeds]
    if tight_seeds:
        configs = [c for c in configs if not c.name.startswith("tightpool-")] + tight_pool_configs(tight_seeds)
    families: dict[str, list[int]] = {}  # tight-pool mode -> [configs, plugin worse]

    cols = f"{'config':<32} {'steps n/p':>11} {'hits n/p':>11} {'finish n/p':>11} {'preempt n/p':>11} " \
           f"{'defer':>6} {'steps':>6} {'hits':>6} {'finish':>6}  ok"
    print(cols)
    failures = worse = 0
    for config in configs:
        native, plugin = run_config(config, plugin=False), run_config(config, plugin=True)
        r_steps = plugin.steps / native.steps
        r_hits = plugin.hit_tokens / native.hit_tokens if native.hit_tokens else 1.0
        r_finish = plugin.last_finish_step / native.last_finish_step
        ok = r_steps <= LIMITS["steps"] and r_hits >= LIMITS["hits"] and r_finish <= LIMITS["finish"]
        failures += not ok
        is_worse = (plugin.steps > native.steps or plugin.hit_tokens < native.hit_tokens
                    or plugin.last_finish_step > native.last_finish_step)
        worse += is_worse
        if config.name.startswith("tightpool-"):
            family = families.setdefault(config.name.split("-")[1], [0, 0])
            family[0] += 1
            family[1] += is_worse
        pairs = " ".join(f"{getattr(native, f):>5}/{getattr(plugin, f):<5}"
                         for f in ("steps", "hit_tokens", "last_finish_step", "preemptions"))
        print(f"{config.name:<32} {pairs} {plugin.deferrals:>6} {r_steps:>6.3f} {r_hits:>6.3f} {r_finish:>6.3f}  "
              f"{'yes' if ok else 'NO'}")
    print(f"{failures} of {len(configs)} configs break a limit")
    print(f"{worse} of {len(configs)} configs have the plugin worse than native in steps, hit tokens or last finish")
    for mode, (count, bad) in families.items():
        print(f"tight pool, {mode}: plugin worse than native in {bad} of {count} seeds")
    if not args.skip_race:
        from vllm_replay import qa_branches, replay_vllm

        branches = qa_branches("race-m", args.race_questions, "cold", 0.0, 0)
        native = replay_vllm(branches, False, 16, 8192, 16)
        plugin = replay_vllm(branches, True, 16, 8192, 16)
        cut = 1 - plugin["steps"] / native["steps"]
        print(f"RACE-M burst, {args.race_questions} questions: steps {native['steps']} -> {plugin['steps']} "
              f"(reduction {100 * cut:.1f} %), reuse {native['reuse_pct']:.3f} -> {plugin['reuse_pct']:.3f} %")
    return 0


def _seed_list(text: str) -> list[int]:
    text = text.strip()
    if not text:
        return []
    if "-" in text and "," not in text:
        first, last = (int(x) for x in text.split("-", 1))
        if last < first:
            raise ValueError(text)
        return list(range(first, last + 1))
    return [int(x) for x in text.split(",") if x.strip()]


if __name__ == "__main__":
    sys.exit(main())
