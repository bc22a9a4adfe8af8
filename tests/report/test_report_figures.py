"""Each figure is drawn from the results it was given: compare what it returns with the cell JSON."""

import json

import pytest

from radixflow.core.metrics import cost_identity
from radixflow.report import diagrams, figures, paper
from radixflow.report.build import build_report
from radixflow.report.cells import load_results
from radixflow.report.tables import merge_by


@pytest.fixture(scope="module")
def report(quick_dir, tmp_path_factory):
    return build_report(quick_dir, tmp_path_factory.mktemp("report"), warn=lambda m: None)


def _merged(quick_dir):
    res = load_results(quick_dir)
    return merge_by([((c.model, c.arm), d["arms"][0]) for c, d in res.of_kind("qa").items()])


def test_figure3_bars_sum_to_the_host_time_change_in_the_json(quick_dir, report):
    fig = report.figures["figure3"]
    assert set(fig) == set(paper.MODELS)
    for m, d in fig.items():
        cells = [json.loads(p.read_text())["arms"][0] for p in (quick_dir / "cells").glob(f"qa__{m}__radix*__*.json")]
        host = {a: sum(c["host_time"] for c in cells if c["policy"] == a) for a in ("radix", "radixflow")}
        assert sum(d["stack"]) == pytest.approx(host["radix"] - host["radixflow"], abs=1e-9)
        assert d["delta_host"] == pytest.approx(host["radix"] - host["radixflow"], abs=1e-9)
        assert sum(d["stack_pct"]) == pytest.approx(d["delta_host_pct"], abs=1e-9)
    assert (report.out / "figure3.png").stat().st_size > 10_000


def test_figure3_uses_the_cost_identity_and_paper_reductions(quick_dir, report):
    merged = _merged(quick_dir)
    m = "qwen3.5-27b"
    ci = cost_identity(merged[(m, "radix")], merged[(m, "radixflow")])
    d = report.figures["figure3"][m]
    assert d["round_gain"] == pytest.approx(ci.round_gain) and d["cost_drift"] == pytest.approx(ci.cost_drift)
    assert d["paper_round_reduction"] == pytest.approx(100 * (1 - 6529 / 11748))
    rounds = merged[(m, "radix")].rounds, merged[(m, "radixflow")].rounds
    assert d["round_reduction"] == pytest.approx(100 * (1 - rounds[1] / rounds[0]))


def test_round_diagram_cells_are_the_fragments(quick_dir, report):
    fig = report.figures["figure1"]
    for arm in ("radix", "radixflow"):
        cell = json.loads((quick_dir / "cells" / f"figure1__qwen3.5-0.8b__{arm}.json").read_text())
        m = cell["arms"][0]
        d = fig[arm]
        assert d["filled"] == m["fragments"] == 15
        assert d["empty"] == m["empty_slots"]
        assert d["rounds"] == m["rounds"] and d["tokens"] == m["tokens"] == 12970
        names = sorted(b for col in d["grid"] for b in col if b)
        assert names == sorted(r["branch"] for rows in cell["diagram"] for r in rows)
    assert fig["radix"]["traversal"] == "prefix-stop" and fig["radixflow"]["traversal"] == "state-ready"


def test_round_diagram_rejects_more_rows_than_slots(tmp_path):
    cell = {
        "meta": {"max_num_seqs": 1},
        "diagram": [[{"branch": "a", "group": "g", "start": 0, "tokens": 1}] * 2],
    }
    with pytest.raises(ValueError, match="more than S=1"):
        diagrams.round_diagram({"radix": cell}, tmp_path / "x.png")


def test_figure4_distributions_match_the_cells(quick_dir, report):
    fig = report.figures["figure4"]
    merged = _merged(quick_dir)
    for (m, a), x in merged.items():
        d = fig[m][a]
        assert d["rounds"] == x.rounds
        assert d["rows_mean"] == pytest.approx(x.rows_per_round)
        assert sum(d["rows_prob"]) == pytest.approx(1.0)
        assert d["requests"] == x.requests
        assert sum(d["lat_prob"]) == pytest.approx(1.0)


def test_figure4_histogram_puts_the_maximum_in_the_last_bin(tmp_path):
    dists = {("qwen3-8b", "radix"): {"rows_hist": [0, 2, 2], "latencies": [0.0, 1.0, 2.0, 4.0]}}
    d = figures.figure4(dists, tmp_path / "f4.png", bins=4)["qwen3-8b"]["radix"]
    assert d["lat_prob"] == [0.25, 0.25, 0.25, 0.25]
    assert d["rows_prob"] == [0, 0.5, 0.5] and d["rows_mean"] == 1.5


def test_timeline_draws_the_trace_json(tmp_path):
    turns = [
        {"request_len": n, "hit": h, "ready_hit": h, "recomputed": n - h}
        for n, h in zip(paper.MULTI_TURN["request_len"], paper.MULTI_TURN["hit"])
    ]
    hybrid = [
        dict(t, ready_hit=t["hit"] // 512 * 512, recomputed=t["request_len"] - t["hit"] // 512 * 512) for t in turns
    ]
    data = diagrams.timeline({"qwen3-8b": {"turns": turns}, "qwen3.5-0.8b": {"turns": hybrid}}, tmp_path / "t.png")
    assert data["qwen3-8b"]["recomputed"] == [280, 80, 80, 80, 80]
    assert data["qwen3.5-0.8b"]["ready_hit"] == [0, 0, 512, 512, 1024]
    assert data["qwen3-8b"]["turn"] == [1, 2, 3, 4, 5]
    assert (tmp_path / "t.png").exists()


def test_timeline_without_trace_results_draws_the_reference_only(tmp_path):
    data = diagrams.timeline({}, tmp_path / "t.png")
    assert data == {"reference only": {"turn": []}}


def test_multiturn_cells_come_from_the_trace_command_and_are_drawn(quick_dir, report):
    pytest.importorskip("radixflow.commands.trace")
    for model in ("qwen3-8b", "qwen3.5-0.8b"):
        cell = json.loads((quick_dir / "cells" / f"multiturn__{model}.json").read_text())
        drawn = report.figures["multiturn"][model]
        assert drawn["request_len"] == [t["request_len"] for t in cell["turns"]]
        assert drawn["recomputed"] == [t["recomputed"] for t in cell["turns"]]
    assert report.figures["multiturn"]["qwen3-8b"]["hit"] == paper.MULTI_TURN["hit"]
