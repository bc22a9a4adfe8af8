"""Where c(B) goes, and how the round reduction answers a change in it (docs/simulator.md, "Small rounds").

For each model and cost variant, runs Radix and RadixFlow over the paper-shaped workload (all streams
and orders, SPEC §11 budgets and rates) and prints, per arm: rounds, rows per round, rows per branch,
tokens per round, the mean call c̄ split into the cost model's terms, and Radix → RadixFlow ΔK.

Variants (comma list; each is a first-principles reading of one term, applied to every model alike):
  base            today's cost model (LM head once per row, as vLLM's `logits_indices`)
  head-per-token  the model before that fix: LM-head FLOPs for every scheduled token
  call+MS         MS more fixed host work per call (e.g. call+8)
  row+MS          MS more host work per row (e.g. row+2.5)
  launch+F        the eager launch term times F (launches scale with layers: 24 on 0.8B, 32 on 4B/9B)
  scale+F         every term times F (the load a cost F times higher would give)

    python benchmarks/cost_terms.py --models qwen3.5-0.8b,qwen3.5-4b --variants base,call+8 --questions 300

Every `radixflow simulate` flag is taken (the parser is `radixflow.commands.simulate.add_arguments`),
e.g. `--snapshot-mode vllm-align --vllm-version 0.29 --mamba-cache-mode all --prefix-match-unit 16`,
`--policy`, `--scheduler vllm`, `--gpu`; `--model M` runs one model where `--models` is not given.
Defaults kept from before: models 0.8B/4B/9B, `--snapshot-mode chunk-end`, `--branch-gap 0.0005`.
`--rate-scale` multiplies the paper's rate when `--rate` is not given. Session workloads (agentic,
multi-turn) have no per-arm c̄ split here; use `radixflow simulate` for them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from radixflow.cache.eviction import get_eviction  # noqa: E402
from radixflow.commands import simulate  # noqa: E402
from radixflow.commands.common import build_workloads, scheduler_config  # noqa: E402
from radixflow.commands.sessions import SESSION_WORKLOADS  # noqa: E402
from radixflow.core.policies import parse_arms  # noqa: E402
from radixflow.integrations.vllm.sim_backend import arm_runner  # noqa: E402
from radixflow.report import paper  # noqa: E402
from radixflow.sim.cost_model import CallCost, CostModel, get_gpu  # noqa: E402
from radixflow.sim.runner import SimSetup  # noqa: E402
from radixflow.spec import get_spec  # noqa: E402

DEFAULT_MODELS = "qwen3.5-0.8b,qwen3.5-4b,qwen3.5-9b"
VARIANT_KINDS = ("base", "head-per-token", "call", "row", "launch", "scale")

class Variant(CostModel):
    """Today's c(B) with one term read differently; `log` keeps every call's terms."""

    def __init__(self, spec, gpu, name: str, **kw) -> None:
        super().__init__(spec, gpu, **kw)
        self.name = name
        self.log: list[CallCost] = []

    def terms(self, batch) -> CallCost:
        t = super().terms(batch)
        kind, _, arg = self.name.partition("+")
        if kind == "head-per-token" and batch.num_rows:
            # max(traffic, old dense) = max(max(new dense, traffic), old dense), old dense >= new dense
            dense = self.spec.flops_per_token * batch.num_tokens / (self.gpu.bf16_flops * self.k.dense_efficiency)
            t = t._replace(dense_or_traffic=max(t.dense_or_traffic, dense))
        elif kind == "call":
            t = t._replace(host=t.host + float(arg) / 1e3)
        elif kind == "row":
            t = t._replace(rows=t.rows + float(arg) / 1e3 * batch.num_rows)
        elif kind == "launch":
            t = t._replace(launches=t.launches * float(arg))
        elif kind == "scale":
            t = CallCost(*(x * float(arg) for x in t))
        elif kind != "base":
            raise ValueError(f"unknown variant {self.name!r}")
        self.log.append(t)
        return t


def config(model: str, args):
    """The scheduler config `radixflow simulate` would build from these flags for this model, but
    `--handoff off` unless given: the terms are fitted to the paper's and vLLM's runs, which wait."""
    spec = get_spec(model)
    cfg = scheduler_config(args, spec.name, **({} if args.handoff else {"handoff": "off"}))
    cfg.prefix_match_unit = args.prefix_match_unit
    cfg.vllm_version, cfg.mamba_cache_mode = args.vllm_version, args.mamba_cache_mode
    if args.eviction:
        get_eviction(args.eviction)  # checks the name
        cfg.eviction = args.eviction
    cfg.validate()
    if args.scheduler == "vllm" and cfg.checkpoints != "boundary":
        raise ValueError(f"--checkpoints {cfg.checkpoints} is radixflow's scheduler only")
    return spec, cfg


def run(model: str, variant: str, args) -> dict:
    spec, cfg = config(model, args)
    model_args = argparse.Namespace(**vars(args))
    if args.rate is None:
        model_args.rate = paper.RATES.get(spec.name, 5.0) * args.rate_scale
    work = [branches for _, branches in build_workloads(model_args, spec.name, spec.vocab_size)]
    run_arm = arm_runner(args.scheduler)
    out = {}
    for arm in parse_arms(args.policy):
        models: list[Variant] = []

        def make(sp, g, models=models, **kw):  # kw: whatever the runner passes on to CostModel
            models.append(Variant(sp, g, variant, **kw))
            return models[-1]

        setup = SimSetup(spec, get_gpu(args.gpu), cfg, args.gpu_memory_utilization, args.state_memory_fraction,
                         check=args.check, cost_model=make)
        m, _ = run_arm(setup, arm, work)
        calls = [c for v in models for c in v.log]
        out[arm.name] = (m, [1e3 * sum(col) / len(calls) for col in zip(*calls)])
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    simulate.add_arguments(ap)
    ap.add_argument("--models", default=None, help=f"comma list of models (default: --model, else {DEFAULT_MODELS})")
    ap.add_argument("--variants", default="base")
    ap.add_argument("--rate-scale", type=float, default=1.0, help="times the paper's arrival rate (without --rate)")
    ap.set_defaults(model=None, snapshot_mode="chunk-end", branch_gap=0.0005)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.workload in SESSION_WORKLOADS:
        ap.error(f"--workload {args.workload} is a closed-loop session workload; run `radixflow simulate` for it")
    models = (args.models or args.model or DEFAULT_MODELS).split(",")
    try:
        for model in models:
            config(model, args)
        for variant in args.variants.split(","):
            if variant.partition("+")[0] not in VARIANT_KINDS:
                raise ValueError(f"unknown variant {variant!r}: one of {', '.join(VARIANT_KINDS)} (with +N)")
        parse_arms(args.policy)
        arm_runner(args.scheduler)
    except ValueError as exc:
        ap.error(str(exc))
    names = CallCost._fields
    print(f"snapshot mode {args.snapshot_mode}, state interval {args.state_interval}, vLLM {args.vllm_version}, "
          f"mamba cache mode {args.mamba_cache_mode}, prefix-match unit {args.prefix_match_unit or 'block'}, "
          f"scheduler {args.scheduler}, branch gap {args.branch_gap * 1e3:g} ms, "
          f"rate {args.rate if args.rate is not None else f'paper x{args.rate_scale:g}'}, "
          f"questions/stream {args.questions or 'all'}")
    print(f"{'model':<20} {'variant':<10} {'arm':<10} {'K':>7} {'rows/K':>6} {'rows/br':>7} {'tok/K':>6} "
          f"{'c̄ ms':>6} " + " ".join(f"{n[:8]:>8}" for n in names) + f" {'ΔK %':>6} {'paper':>6} {'lat s':>6}")
    for model in models:
        pb, pf = paper.arm(model, "radix"), paper.arm(model, "radixflow")
        pdk = 100 * (1 - pf.rounds / pb.rounds) if pb and pf else float("nan")
        for variant in args.variants.split(","):
            res = run(model, variant, args)
            k0 = next(iter(res.values()))[0].rounds  # ΔK against the first arm of --policy
            for i, (a, (m, means)) in enumerate(res.items()):
                dk = 100 * (1 - m.rounds / k0) if i else 0.0
                print(f"{model:<20} {variant:<10} {a:<10} {m.rounds:>7,} {m.rows_per_round:>6.2f} "
                      f"{m.rows_per_branch:>7.2f} {m.tokens_per_round:>6,.0f} {m.cost_per_round * 1e3:>6.1f} "
                      + " ".join(f"{x:>8.2f}" for x in means)
                      + f" {dk:>6.1f} {pdk if i else 0.0:>6.1f} {m.latency_mean:>6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
