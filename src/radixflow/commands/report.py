"""Tables and figures from `radixflow experiment` (and `bench`) results, beside the paper's numbers.

Writes report.md and index.html with PNG figures into --out; a missing or corrupt cell is named in a
warning and in the report, and the rest is still rendered.
"""

from __future__ import annotations

from pathlib import Path

from radixflow.report.build import build_report


def add_arguments(p) -> None:
    p.add_argument(
        "results",
        help="results directory written by `radixflow experiment` (bench JSON files "
        "anywhere under it are reported too)",
    )
    p.add_argument("--out", default=None, help="report directory (default: RESULTS/report)")


def run(args) -> int:
    out = Path(args.out) if args.out else Path(args.results) / "report"
    rep = build_report(args.results, out)
    figs = ", ".join(f"{n}.png" for n in rep.figures)
    print(
        f"wrote {out / 'report.md'}, {out / 'index.html'} and {figs or 'no figures'}; "
        f"{len(rep.problems)} problem(s), {len(rep.divergences)} divergence(s) over 10 % from the paper"
    )
    return 0
