"""Figures 3 and 4 of the paper from our results: each function draws a PNG and returns what it drew.

Plots use matplotlib's object API (`Figure`, Agg canvas): no pyplot state, no display needed.
"""

from __future__ import annotations

import bisect
import math
from pathlib import Path

from matplotlib.figure import Figure

from radixflow.core.metrics import ArmMeasures, cost_identity
from radixflow.core.policies import ARMS
from radixflow.report import paper
from radixflow.report.tables import ordered_models

BASE, TARGET = "radix", "radixflow"
ARM_COLOURS = dict(zip(ARMS, ("#444444", "#8da0cb", "#66c2a5", "#fc8d62", "#e41a1c", "#984ea3")))


def _pct_drop(a: float, b: float) -> float:
    return 100.0 * (1 - b / a) if a else math.nan


def figure3(merged: dict[tuple, ArmMeasures], path: Path) -> dict:
    """Left: round and latency reductions of RadixFlow vs Radix per model (ours and the paper's).
    Right: the cost identity as stacked bars, round gain up and cost drift down (in % of Radix's
    T_host); their sum is the measured host-time change, marked with a diamond."""
    models = [m for m in ordered_models(merged) if (m, BASE) in merged and (m, TARGET) in merged]
    data = {}
    for m in models:
        b, x = merged[(m, BASE)], merged[(m, TARGET)]
        ci = cost_identity(b, x)
        pb, pt = paper.arm(m, BASE), paper.arm(m, TARGET)
        scale = 100.0 / b.host_time if b.host_time else math.nan
        data[m] = {
            "round_reduction": _pct_drop(b.rounds, x.rounds),
            "latency_reduction": _pct_drop(b.latency_mean, x.latency_mean),
            "paper_round_reduction": _pct_drop(pb.rounds, pt.rounds) if pb and pt else None,
            "paper_latency_reduction": _pct_drop(pb.latency_mean, pt.latency_mean) if pb and pt else None,
            "round_gain": ci.round_gain,
            "cost_drift": ci.cost_drift,
            "delta_host": ci.delta_host,
            "stack": [ci.round_gain, -ci.cost_drift],
            "stack_pct": [ci.round_gain * scale, -ci.cost_drift * scale],
            "delta_host_pct": ci.delta_host * scale,
        }
    fig = Figure(figsize=(12, 4.2), layout="constrained")
    left, right = fig.subplots(1, 2)
    xs = range(len(models))
    w = 0.2
    series = [
        ("round_reduction", "rounds (ours)", "#1f77b4", None),
        ("paper_round_reduction", "rounds (paper)", "#1f77b4", "//"),
        ("latency_reduction", "latency (ours)", "#ff7f0e", None),
        ("paper_latency_reduction", "latency (paper)", "#ff7f0e", "//"),
    ]
    for j, (key, label, colour, hatch) in enumerate(series):
        vals = [data[m][key] if data[m][key] is not None else 0.0 for m in models]
        left.bar(
            [i + (j - 1.5) * w for i in xs],
            vals,
            w,
            label=label,
            color=colour if not hatch else "white",
            edgecolor=colour,
            hatch=hatch,
        )
    left.set_xticks(list(xs), [paper.LABELS.get(m, m) for m in models], rotation=25, ha="right")
    left.set_ylabel("reduction vs Radix (%)")
    left.set_title("RadixFlow vs Radix")
    left.axhline(0, color="black", lw=0.6)
    left.legend(fontsize=8)
    gains = [data[m]["stack_pct"][0] for m in models]
    drifts = [data[m]["stack_pct"][1] for m in models]
    # A waterfall: the drift bar hangs from the top of the gain bar and ends at the net change.
    right.bar([i - 0.15 for i in xs], gains, 0.3, label="round gain (K0−K1)·c̄0", color="#1f77b4")
    right.bar([i + 0.15 for i in xs], drifts, 0.3, bottom=gains, label="−cost drift K1·(c̄1−c̄0)", color="#ff7f0e")
    right.scatter(
        list(xs),
        [data[m]["delta_host_pct"] for m in models],
        marker="D",
        color="black",
        zorder=3,
        label="measured ΔT_host = sum",
    )
    right.set_xticks(list(xs), [paper.LABELS.get(m, m) for m in models], rotation=25, ha="right")
    right.set_ylabel("% of Radix host time")
    right.set_title("cost identity: ΔT_host = round gain − cost drift")
    right.axhline(0, color="black", lw=0.6)
    levels = [0.0, *gains, *(g + d for g, d in zip(gains, drifts))]
    pad = 0.08 * ((max(levels) - min(levels)) or 1.0)
    right.set_ylim(min(levels) - pad, max(levels) + pad)  # bar sticky edges would clip the waterfall
    right.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    return data


def _histogram(values: list[float], edges: list[float]) -> list[float]:
    counts = [0] * (len(edges) - 1)
    for v in values:
        i = min(max(bisect.bisect_right(edges, v) - 1, 0), len(counts) - 1)  # the top edge is inclusive
        counts[i] += 1
    n = len(values)
    return [c / n if n else 0.0 for c in counts]


def figure4(dists: dict[tuple, dict], path: Path, bins: int = 30) -> dict:
    """Top row: distribution of rows per round; bottom row: distribution of request latency; one column
    per model, one line per arm. `dists[(model, arm)]` = {"rows_hist": counts by rows, "latencies": [...]}
    (already summed over streams and orders)."""
    models = ordered_models(dists)
    fig = Figure(figsize=(3.2 * max(1, len(models)), 5.6), layout="constrained")
    axes = fig.subplots(2, max(1, len(models)), squeeze=False)
    data: dict = {}
    for j, m in enumerate(models):
        arms = [a for a in ARMS if (m, a) in dists] + sorted(a for (mm, a) in dists if mm == m and a not in ARMS)
        lats = [v for a in arms for v in dists[(m, a)]["latencies"]]
        hi = max(lats) if lats else 1.0
        edges = [hi * k / bins for k in range(bins + 1)] if hi > 0 else [0.0, 1.0]
        data[m] = {}
        for a in arms:
            d = dists[(m, a)]
            hist = d["rows_hist"]
            rounds = sum(hist)
            probs = [c / rounds if rounds else 0.0 for c in hist]
            lat_probs = _histogram(d["latencies"], edges)
            data[m][a] = {
                "rows": list(range(len(hist))),
                "rows_prob": probs,
                "rounds": rounds,
                "rows_mean": sum(r * c for r, c in enumerate(hist)) / rounds if rounds else math.nan,
                "lat_edges": edges,
                "lat_prob": lat_probs,
                "requests": len(d["latencies"]),
            }
            kw = {"color": ARM_COLOURS.get(a), "label": a, "lw": 1.2}
            axes[0][j].step(range(len(hist)), probs, where="mid", **kw)
            axes[1][j].step(
                [(edges[k] + edges[k + 1]) / 2 for k in range(len(lat_probs))], lat_probs, where="mid", **kw
            )
        axes[0][j].set_title(paper.LABELS.get(m, m), fontsize=9)
        axes[0][j].set_xlabel("rows per round", fontsize=8)
        axes[1][j].set_xlabel("request latency (s)", fontsize=8)
        if j == 0:
            axes[0][j].set_ylabel("probability")
            axes[1][j].set_ylabel("probability")
            axes[0][j].legend(fontsize=7)
    fig.savefig(path, dpi=100)
    return data
