"""One markdown table per experiment directory: the paper grid's headline figures beside the paper.

Per model, from the cells of `radixflow experiment` (any questions count; compare percentages):
ΔK Radix → RadixFlow, Flex-only (Radix → Radix+Flex), traversal (Radix+Flex → RadixFlow, of
Radix+Flex), rows per round and per branch (fragments ÷ branches), reuse Δ between the arms and the
mean latency, each beside the paper's (report/paper.py). With two directories (e.g. radixflow's
scheduler and `--scheduler vllm`) it adds their steps/rows/hits ratio per model.

    python benchmarks/paper_grid_summary.py RESULTS_DIR [VLLM_RESULTS_DIR]
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from radixflow.report import paper  # noqa: E402

ARMS = ("radix", "radix+flex", "radixflow")


def load(root: str) -> dict:
    agg: dict = collections.defaultdict(collections.Counter)
    lat: dict = collections.defaultdict(list)
    for f in sorted(Path(root, "cells").glob("qa__*.json")):
        d = json.loads(f.read_text())
        m, a = d["meta"], d["arms"][0]
        k = (m["model"], m["arm"])
        for key in ("rounds", "fragments", "branches", "prompt_tokens", "cached_tokens"):
            agg[k][key] += a[key]
        agg[k]["cells"] += 1
        lat[k] += a.get("latencies", [])
    for k, v in lat.items():
        agg[k]["latency"] = sum(v) / len(v) if v else float("nan")
    return agg


def pct(a: float, b: float) -> float:
    return 100.0 * (1 - a / b) if b else float("nan")


def table(agg: dict) -> list[str]:
    out = ["| model | cells | ΔK Radix→RadixFlow % | paper | Flex-only % | paper | traversal % | paper | "
           "rows/round R→RF | paper | rows/branch R | paper | reuse % R | reuse Δ pp | paper Δ | "
           "latency s R→RF | paper |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for model in paper.MODELS:
        r, f, x = (agg.get((model, a)) for a in ARMS)
        if not (r and f and x):
            continue
        p = paper.TABLES[model][1]
        pr, px = p["radix"], p["radixflow"]
        pf = p.get("radix+flex")
        abl = paper.ABLATION.get((model, "all"), {})
        p_flex = pct(pf.rounds, pr.rounds) if pf and pf.rounds else abl.get("admission")
        p_trav = pct(px.rounds, pf.rounds) if pf and pf.rounds else abl.get("traversal")
        p_rpb = pr.rounds * pr.rows_per_round / (4 * paper.QUESTIONS * 6)

        def fmt(v, spec=".1f"):
            return "—" if v is None else format(v, spec)

        reuse = [100 * c["cached_tokens"] / c["prompt_tokens"] for c in (r, x)]
        out.append(
            f"| {model} | {r['cells'] + f['cells'] + x['cells']} | {pct(x['rounds'], r['rounds']):.1f} | "
            f"{pct(px.rounds, pr.rounds):.1f} | {pct(f['rounds'], r['rounds']):.1f} | {fmt(p_flex)} | "
            f"{pct(x['rounds'], f['rounds']):.1f} | {fmt(p_trav)} | "
            f"{r['fragments'] / r['rounds']:.2f}→{x['fragments'] / x['rounds']:.2f} | "
            f"{pr.rows_per_round:.2f}→{px.rows_per_round:.2f} | {r['fragments'] / r['branches']:.2f} | "
            f"{p_rpb:.2f} | {reuse[0]:.3f} | {reuse[1] - reuse[0]:+.3f} | {px.reuse_rate - pr.reuse_rate:+.3f} | "
            f"{r['latency']:.3f}→{x['latency']:.3f} | {pr.latency_mean:g}→{px.latency_mean:g} |")
    return out


def versus(ours: dict, theirs: dict) -> list[str]:
    out = ["| model | arm | steps ours / vLLM | rows per step ours / vLLM | hit tokens ours / vLLM |",
           "|---|---|---|---|---|"]
    for model in paper.MODELS:
        for arm in ARMS:
            a, b = ours.get((model, arm)), theirs.get((model, arm))
            if not (a and b) or not b["rounds"]:
                continue
            out.append(f"| {model} | {arm} | {a['rounds']:,} / {b['rounds']:,} ({a['rounds'] / b['rounds']:.3f}) | "
                       f"{a['fragments'] / a['rounds']:.2f} / {b['fragments'] / b['rounds']:.2f} | "
                       f"{a['cached_tokens']:,} / {b['cached_tokens']:,} "
                       f"({a['cached_tokens'] / b['cached_tokens'] if b['cached_tokens'] else 1:.3f}) |")
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    grids = [load(d) for d in argv]
    for d, g in zip(argv, grids):
        print(f"\n{d}\n")
        print("\n".join(table(g)))
    if len(grids) == 2:
        print(f"\n{argv[0]} against {argv[1]}\n")
        print("\n".join(versus(*grids)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
