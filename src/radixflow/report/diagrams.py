"""The Figure 1 round diagram and the multi-turn timeline (SPEC §10): each draws a PNG and returns
what it drew."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from radixflow.report import paper

_PALETTE = (
    "#1b9e77",
    "#d95f02",
    "#7570b3",
    "#e7298a",
    "#66a61e",
    "#e6ab02",
    "#a6761d",
    "#1f78b4",
    "#b2df8a",
    "#fb9a99",
    "#cab2d6",
)


def diagram_grid(cell: dict) -> list[list[dict | None]]:
    """Rounds x rows: the fragment placed in each row slot, None for an empty slot."""
    s = cell["meta"]["max_num_seqs"]
    grid = []
    for t, rows in enumerate(cell["diagram"]):
        if len(rows) > s:
            raise ValueError(f"round {t + 1} has {len(rows)} rows, more than S={s}")
        grid.append(list(rows) + [None] * (s - len(rows)))
    return grid


def round_diagram(cells: dict[str, dict], path: Path) -> dict:
    """One panel per arm: rounds left to right, row slots top to bottom, one colour per branch group
    (a producer and its consumers share one), empty slots hatched."""
    groups = sorted({r["group"] for c in cells.values() for rows in c["diagram"] for r in rows})
    colour = {g: _PALETTE[i % len(_PALETTE)] for i, g in enumerate(groups)}
    fig = Figure(figsize=(4.6 * max(1, len(cells)), 3.4), layout="constrained")
    axes = fig.subplots(1, max(1, len(cells)), squeeze=False)[0]
    data = {}
    for ax, (arm, cell) in zip(axes, cells.items()):
        grid = diagram_grid(cell)
        s = cell["meta"]["max_num_seqs"]
        for t, col in enumerate(grid):
            for i, frag in enumerate(col):
                y = s - 1 - i
                if frag is None:
                    ax.add_patch(Rectangle((t, y), 1, 1, facecolor="white", edgecolor="grey", hatch="///"))
                    continue
                ax.add_patch(Rectangle((t, y), 1, 1, facecolor=colour[frag["group"]], edgecolor="black"))
                ax.text(
                    t + 0.5,
                    y + 0.5,
                    f"{frag['branch']}\n{frag['tokens']}",
                    ha="center",
                    va="center",
                    fontsize=7,
                )
        filled = sum(f is not None for col in grid for f in col)
        empty = sum(f is None for col in grid for f in col)
        traversal = cell["meta"].get("traversal", arm)
        ref = paper.FIGURE1.get(traversal, {})
        ax.set_xlim(0, max(1, len(grid)))
        ax.set_ylim(0, s)
        ax.set_xticks([t + 0.5 for t in range(len(grid))], [str(t + 1) for t in range(len(grid))])
        ax.set_yticks([s - 0.5 - i for i in range(s)], [f"row {i + 1}" for i in range(s)])
        ax.set_xlabel("round")
        ax.set_title(
            f"{arm} ({traversal}): {len(grid)} rounds, {empty} empty"
            + (f"\npaper: {ref['rounds']} rounds, {ref['empty_slots']} empty" if ref else ""),
            fontsize=9,
        )
        data[arm] = {
            "traversal": traversal,
            "rounds": len(grid),
            "filled": filled,
            "empty": empty,
            "tokens": sum(f["tokens"] for col in grid for f in col if f is not None),
            "grid": [[f["branch"] if f else None for f in col] for col in grid],
        }
    fig.savefig(path, dpi=110)
    return data


def timeline(cells: dict[str, dict], path: Path) -> dict:
    """Per model: request length, hit and recomputed tokens per turn as lines (plus the ready hit where
    the trace has it); the SPEC §10 reference is drawn dashed in every panel."""
    ref = paper.MULTI_TURN
    panels = list(cells.items()) or [("reference only", {"turns": []})]
    fig = Figure(figsize=(5.2 * len(panels), 3.6), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    data = {}
    series = (
        ("request_len", "request length", "#444444"),
        ("hit", "hit (identity)", "#1f77b4"),
        ("ready_hit", "ready hit (executable)", "#2ca02c"),
        ("recomputed", "recomputed", "#d62728"),
    )
    for ax, (model, cell) in zip(axes, panels):
        turns = cell.get("turns", [])
        xs = list(range(1, len(turns) + 1))
        drawn = {"turn": xs}
        for key, label, colour in series:
            vals = [t.get(key) for t in turns]
            if turns and all(v is not None for v in vals):
                big = key == "hit"  # drawn larger: the ready hit often lies on top of it
                ax.plot(
                    xs,
                    vals,
                    marker="s" if big else "o",
                    ms=9 if big else 5,
                    lw=3 if big else 1.5,
                    color=colour,
                    label=label,
                )
                drawn[key] = vals
            if key in ref:
                ax.plot(
                    range(1, len(ref[key]) + 1),
                    ref[key],
                    ls="--",
                    color=colour,
                    alpha=0.5,
                    label=f"{label} (SPEC §10)",
                )
        kind = "full attention" if model in paper.FULL_ATTENTION else "hybrid"
        ax.set_title(
            f"{paper.LABELS.get(model, model)} ({kind})"
            if turns
            else "multi-turn: no trace results (radixflow trace not available)",
            fontsize=9,
        )
        ax.set_xlabel("turn")
        ax.set_xticks(range(1, max(len(turns), len(ref["hit"])) + 1))
        ax.set_ylabel("tokens")
        ax.legend(fontsize=7)
        data[model] = drawn
    fig.savefig(path, dpi=110)
    return data
