"""Builds the report of a results directory: tables, figures, report.md and index.html.

A missing or corrupt cell is named (a warning and a note in the report) and the rest goes on; a
table or figure with no data for it is left out with a note instead of failing the report.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from radixflow.report import diagrams, figures, paper
from radixflow.report.cells import Results, load_results
from radixflow.report.html import Section, markdown, page
from radixflow.report.tables import (
    Table,
    ablation_splits,
    ablation_table,
    divergence_table,
    divergences,
    merge_by,
    rows_per_branch_table,
    table1,
    table2,
)

TITLE = "radixflow — experiments beside the paper"


@dataclass
class Report:
    """What was written, and the data each figure drew (for tests and for docs/results.md)."""

    out: Path
    sections: list[Section] = field(default_factory=list)
    figures: dict[str, dict] = field(default_factory=dict)
    tables: dict[str, Table] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    divergences: list = field(default_factory=list)


def _qa_records(res: Results, key) -> list:
    return [(key(c), d["arms"][0]) for c, d in res.of_kind("qa").items()]


def _dists(res: Results) -> dict[tuple, dict]:
    out: dict[tuple, dict] = {}
    for c, d in res.of_kind("qa").items():
        arm = d["arms"][0]
        if "rows_hist" not in arm or "latencies" not in arm:
            continue
        acc = out.setdefault((c.model, c.arm), {"rows_hist": [], "latencies": []})
        h = arm["rows_hist"]
        acc["rows_hist"] = [
            a + b
            for a, b in zip(
                acc["rows_hist"] + [0] * (len(h) - len(acc["rows_hist"])),
                h + [0] * (len(acc["rows_hist"]) - len(h)),
            )
        ]
        acc["latencies"] += [v for v in arm["latencies"] if v is not None]
    return out


def _figure(rep: Report, name: str, title: str, text: list[str], draw) -> None:
    png = f"{name}.png"
    try:
        rep.figures[name] = draw(rep.out / png)
    except Exception as e:  # one broken figure must not sink the whole report
        msg = f"{title}: not drawn ({type(e).__name__}: {e})"
        rep.problems.append(msg)
        rep.sections.append(Section(title, text=[msg]))
        return
    rep.sections.append(Section(title, text=text, image=png))


def _experiment_sections(rep: Report, res: Results) -> None:
    merged = merge_by(_qa_records(res, lambda c: (c.model, c.arm)))
    if not merged:
        rep.sections.append(Section("Tables 1 and 2", text=["No multi-candidate QA cells in this directory."]))
    else:
        rep.tables["rows_per_branch"] = rows_per_branch_table(merged)
        rep.sections.append(Section("Rows per branch", tables=[rep.tables["rows_per_branch"]]))
        rep.tables["table1"], rep.tables["table2"] = table1(merged), table2(merged)
        rep.sections.append(
            Section("Table 1 and Table 2 (simulator)", tables=[rep.tables["table1"], rep.tables["table2"]])
        )
        per_stream = merge_by(_qa_records(res, lambda c: (c.model, c.stream, c.arm)))
        per_stream.update({(m, "all", a): v for (m, a), v in merged.items()})
        rep.tables["ablation"] = ablation_table(ablation_splits(per_stream))
        rep.sections.append(Section("Ablation: admission vs traversal", tables=[rep.tables["ablation"]]))
        rep.divergences = divergences(merged)
        rep.tables["divergences"] = divergence_table(rep.divergences)
        rep.sections.append(
            Section(
                "Divergences from the paper",
                tables=[rep.tables["divergences"]],
                text=["Each row needs a cause in docs/results.md."]
                if rep.divergences
                else ["None over the threshold."],
            )
        )
    fig1 = {c.arm: d for c, d in res.of_kind("figure1").items()}
    if fig1:
        ordered = {a: fig1[a] for a in sorted(fig1, key=lambda a: a != "radix")}
        _figure(
            rep,
            "figure1",
            "Figure 1: rounds of the toy instance",
            [
                "Rows x rounds of the Figure 1 instance (S=4, T=4,096); one colour per branch group (a "
                "producer and its consumer share one), empty slots hatched; labels are branch and fragment "
                "tokens."
            ],
            lambda p: diagrams.round_diagram(ordered, p),
        )
    if merged:
        _figure(
            rep,
            "figure3",
            "Figure 3: reductions and the cost identity",
            [
                "Left: round and latency reduction of RadixFlow vs Radix (ours solid, paper hatched). "
                "Right: round gain (K0−K1)·c̄0 up, cost drift K1·(c̄1−c̄0) down, in % of Radix's host "
                "time; the diamond is the measured ΔT_host, which the two bars sum to."
            ],
            lambda p: figures.figure3(merged, p),
        )
        dists = _dists(res)
        if dists:
            _figure(
                rep,
                "figure4",
                "Figure 4: rows per round and request latency",
                [
                    "Distributions over all streams and orders of each arm (top: rows per round; bottom: "
                    "client latency of logical requests)."
                ],
                lambda p: figures.figure4(dists, p),
            )
    turns = {c.model: d for c, d in res.of_kind("multiturn").items()}
    note = (
        []
        if turns
        else [
            "No multi-turn cells: `radixflow trace multi-turn` was not available when the "
            "experiment ran; only the SPEC §10 reference is drawn."
        ]
    )
    _figure(
        rep,
        "multiturn",
        "Multi-turn timeline (SPEC §10)",
        [
            "Request length, hit and recomputed tokens per turn for a full-attention and a hybrid model; "
            "dashed: the SPEC §10 reference (200-token system prompt, 80-token turns, 150-token answers).",
            *note,
        ],
        lambda p: diagrams.timeline(turns, p),
    )


def model_key(name: str) -> str:
    """Our preset name for a bench `meta.model` (a preset, an HF name or a checkpoint path), if any."""
    base = str(name).rstrip("/").rsplit("/", 1)[-1].lower()
    return next((m for m in paper.MODELS if base == m or base.endswith("-" + m)), base)


def _bench_sections(rep: Report, res: Results) -> None:
    try:
        recs = [
            ((model_key(d["meta"].get("model", name)), arm["policy"]), arm)
            for name, d in res.bench
            for arm in d["arms"]
        ]
        merged = merge_by(recs)
    except (ValueError, TypeError, KeyError) as e:
        rep.problems.append(f"bench results: unreadable arms ({e}); left out")
        return
    rep.tables["bench_table1"] = table1(merged, "Bench Table 1")
    rep.tables["bench_table2"] = table2(merged, "Bench Table 2")
    rep.sections.append(
        Section(
            "Real-engine bench results",
            text=[f"From {', '.join(n for n, _ in res.bench)}."],
            tables=[rep.tables["bench_table1"], rep.tables["bench_table2"]],
        )
    )


def _setup_section(res: Results) -> Section:
    grid = res.manifest.get("grid", {})
    text = [f"Results directory: {res.root}. Cells read: {len(res.cells)}."]
    if grid:
        text.append(
            f"Grid: models {', '.join(grid.get('models', []))}; arms {', '.join(grid.get('arms', []))}; "
            f"streams {', '.join(grid.get('streams', []))}; orders {', '.join(grid.get('orders', []))}; "
            f"questions per stream {grid.get('questions') or paper.QUESTIONS}; GPU {grid.get('gpu')}; "
            f"budgets {res.manifest.get('budget_source', 'paper')}; snapshot mode "
            f"{grid.get('snapshot_mode', 'every-boundary')}; simulator code {res.manifest.get('code_version', '?')}."
        )
    tables = []
    if res.calibration:
        t = Table(
            "Calibrated budgets (radix, 64 held-out questions)",
            ["model", "S, T", "paper S, T", "throughput req/s"],
        )
        for m, c in res.calibration.items():
            best = [
                s
                for s in c.get("search", [])
                if s["max_num_seqs"] == c["max_num_seqs"] and s["max_num_batched_tokens"] == c["max_num_batched_tokens"]
            ]
            t.rows.append(
                [
                    m,
                    f"{c['max_num_seqs']}, {c['max_num_batched_tokens']}",
                    ", ".join(map(str, c.get("paper", []))) or "—",
                    f"{best[0]['throughput']:.3f}" if best else "—",
                ]
            )
        tables.append(t)
    return Section("Setup", text=text, tables=tables)


def build_report(results_dir: str | Path, out_dir: str | Path, warn=None) -> Report:
    warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
    res = load_results(results_dir)
    rep = Report(Path(out_dir))
    rep.out.mkdir(parents=True, exist_ok=True)
    rep.problems += res.problems
    rep.sections.append(_setup_section(res))
    _experiment_sections(rep, res)
    if res.bench:
        _bench_sections(rep, res)
    for msg in rep.problems:
        warn(msg)
    if rep.problems:
        rep.sections.insert(
            1,
            Section(
                "Problems",
                text=["These results were left out; the rest of the report is built without them."],
                bullets=list(rep.problems),
            ),
        )
    (rep.out / "report.md").write_text(markdown(TITLE, rep.sections))
    (rep.out / "index.html").write_text(page(TITLE, rep.sections))
    return rep
