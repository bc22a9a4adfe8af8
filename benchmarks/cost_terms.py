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
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from radixflow.config import SchedulerConfig  # noqa: E402
from radixflow.core.policies import get_arm  # noqa: E402
from radixflow.report import paper  # noqa: E402
from radixflow.sim.cost_model import CallCost, CostModel, get_gpu  # noqa: E402
from radixflow.sim.runner import SimSetup, run_arm  # noqa: E402
from radixflow.spec import get_spec  # noqa: E402
from radixflow.workloads.qa import ORDERS, STREAMS, paper_questions, stream_records  # noqa: E402
from radixflow.workloads.trace import branch_from_record  # noqa: E402

ARMS = ("radix", "radixflow")


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


def branches(model: str, questions: int | None, seed: int, gap: float, rate_scale: float) -> list[list]:
    qs = paper_questions(seed, questions)
    rate = paper.RATES.get(model, 5.0) * rate_scale
    vocab = get_spec(model).vocab_size
    out = []
    for st in STREAMS:
        for od in ORDERS:
            recs = stream_records(qs, st, od, rate, seed, prefix=f"{st}-{od}:", branch_gap=gap)
            out.append([branch_from_record(r, f"{st}/{od}", vocab) for r in recs])
    return out


def run(model: str, variant: str, args) -> dict:
    spec = get_spec(model)
    s, t = paper.BUDGETS.get(model, (16, 8192))
    cfg = SchedulerConfig(max_num_seqs=s, max_num_batched_tokens=t, snapshot_mode=args.snapshot_mode)
    if args.state_interval:
        cfg = replace(cfg, state_interval=args.state_interval)
    cfg.validate()
    work = branches(model, args.questions, args.seed, args.branch_gap, args.rate_scale)
    out = {}
    for a in ARMS:
        models: list[Variant] = []

        def make(sp, g, models=models, **kw):  # kw: whatever the runner passes on to CostModel
            models.append(Variant(sp, g, variant, **kw))
            return models[-1]

        m, _ = run_arm(SimSetup(spec, get_gpu("a800"), cfg, cost_model=make), get_arm(a), work)
        calls = [c for v in models for c in v.log]
        out[a] = (m, [1e3 * sum(col) / len(calls) for col in zip(*calls)])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="qwen3.5-0.8b,qwen3.5-4b,qwen3.5-9b")
    ap.add_argument("--variants", default="base")
    ap.add_argument("--questions", type=int, default=None, help="per stream (default: all 1,551)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--branch-gap", type=float, default=0.0005, help="mean s between a question's branches")
    ap.add_argument("--rate-scale", type=float, default=1.0, help="times the paper's arrival rate")
    ap.add_argument("--snapshot-mode", default="chunk-end")
    ap.add_argument("--state-interval", type=int, default=None)
    args = ap.parse_args()
    names = CallCost._fields
    print(f"snapshot mode {args.snapshot_mode}, state interval {args.state_interval or 'default'}, branch gap "
          f"{args.branch_gap * 1e3:g} ms, rate x{args.rate_scale:g}, questions/stream {args.questions or 'all'}")
    print(f"{'model':<20} {'variant':<10} {'arm':<10} {'K':>7} {'rows/K':>6} {'rows/br':>7} {'tok/K':>6} "
          f"{'c̄ ms':>6} " + " ".join(f"{n[:8]:>8}" for n in names) + f" {'ΔK %':>6} {'paper':>6} {'lat s':>6}")
    for model in args.models.split(","):
        pb, pf = paper.arm(model, "radix"), paper.arm(model, "radixflow")
        pdk = 100 * (1 - pf.rounds / pb.rounds) if pb and pf else float("nan")
        for variant in args.variants.split(","):
            res = run(model, variant, args)
            k0 = res["radix"][0].rounds
            for a, (m, means) in res.items():
                dk = 100 * (1 - m.rounds / k0) if a != "radix" else 0.0
                print(f"{model:<20} {variant:<10} {a:<10} {m.rounds:>7,} {m.rows_per_round:>6.2f} "
                      f"{m.rows_per_branch:>7.2f} {m.tokens_per_round:>6,.0f} {m.cost_per_round * 1e3:>6.1f} "
                      + " ".join(f"{x:>8.2f}" for x in means)
                      + f" {dk:>6.1f} {pdk if a != 'radix' else 0.0:>6.1f} {m.latency_mean:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
