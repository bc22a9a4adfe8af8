"""report.md / index.html from a results directory, including damaged ones and bench results."""

import json
import math

from radixflow.cli import main
from radixflow.report.build import build_report, model_key


def test_cli_writes_every_table_and_figure(quick_dir, tmp_path, capsys):
    out = tmp_path / "rep"
    assert main(["report", str(quick_dir), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    titles = ("Rows per branch", "Table 1", "Table 2", "Ablation", "Figure 1", "Figure 3", "Figure 4", "Multi-turn")
    for title in titles:
        assert title in md
    html = (out / "index.html").read_text()
    for png in ("figure1.png", "figure3.png", "figure4.png", "multiturn.png"):
        assert (out / png).stat().st_size > 5_000
        assert f"src='{png}'" in html and f"({png})" in md
    assert "<table>" in html and "19,803" in md  # the paper's Radix rounds for 0.8B sit beside ours
    assert "wrote" in capsys.readouterr().out


# Columns that hold the paper's numbers or compare with them; every other column is ours.
PAPER_COLUMNS = {"paper", "ratio", "paper S, T", "Δ pp"}


def test_no_column_of_ours_is_empty(quick_dir, tmp_path):
    """Every measure we print has a value in every row (an empty one means the reader dropped data)."""
    rep = build_report(quick_dir, tmp_path / "rep", warn=lambda m: None)
    for name in ("rows_per_branch", "table1", "table2", "ablation"):
        t = rep.tables[name]
        assert t.rows, name
        for j, h in enumerate(t.headers):
            if h in PAPER_COLUMNS:
                continue
            empty = [r for r in t.rows if r[j] in ("—", "", "nan")]
            if h == "admission share of total %":  # a share of nothing: 0/0 where the arms tie
                empty = [r for r in empty if r[t.headers.index("K Radix")] != r[t.headers.index("K RadixFlow")]]
            assert not empty, f"{name}: column {h!r} is empty for {[r[:2] for r in empty]}"
    for m, d in rep.figures["figure3"].items():
        for key in ("round_reduction", "latency_reduction", "round_gain", "cost_drift"):
            assert d[key] is not None and math.isfinite(d[key]), (m, key)


def test_merged_latency_is_pooled_from_the_cells(quick_dir, tmp_path):
    cells = [json.loads(p.read_text())["arms"][0] for p in (quick_dir / "cells").glob("qa__qwen3-8b__radix__*.json")]
    lat = [v for c in cells for v in c["latencies"]]
    rep = build_report(quick_dir, tmp_path / "rep", warn=lambda m: None)
    t = rep.tables["table1"]
    (row,) = [r for r in t.rows if r[0] == "qwen3-8b" and r[3] == "radix"]
    assert row[t.headers.index("latency s")] == f"{sum(lat) / len(lat):.3f}"


def test_missing_and_corrupt_cells_are_named_and_the_rest_is_built(quick_copy, tmp_path):
    cells = quick_copy / "cells"
    (cells / "qa__qwen3.5-4b__radixflow__cold__forward.json").unlink()
    (cells / "qa__qwen3.5-9b__radix__mixed__reverse.json").write_text("{not json")
    (cells / "figure1__qwen3.5-0.8b__radix.json").write_text(json.dumps({"meta": {}, "arms": []}))
    warnings = []
    rep = build_report(quick_copy, tmp_path / "rep", warn=warnings.append)
    text = "\n".join(warnings)
    assert "qa__qwen3.5-4b__radixflow__cold__forward: missing" in text
    assert "qa__qwen3.5-9b__radix__mixed__reverse: corrupt" in text
    assert "figure1__qwen3.5-0.8b__radix: corrupt" in text
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## Problems" in md and "qa__qwen3.5-9b__radix__mixed__reverse" in md
    assert {"figure1", "figure3", "figure4", "multiturn"} <= set(rep.figures)
    assert set(rep.figures["figure1"]) == {"radixflow"}
    assert rep.tables["table1"].rows


def test_cli_warns_on_stderr(quick_copy, tmp_path, capsys):
    (quick_copy / "cells" / "qa__qwen3-8b__radix__cold__forward.json").write_text("[]")
    assert main(["report", str(quick_copy), "--out", str(tmp_path / "r")]) == 0
    assert "warning: cell qa__qwen3-8b__radix__cold__forward: corrupt" in capsys.readouterr().err


def test_bench_results_get_the_same_tables(quick_dir, tmp_path):
    src = json.loads((quick_dir / "cells" / "qa__qwen3.5-0.8b__radix__cold__forward.json").read_text())
    other = json.loads((quick_dir / "cells" / "qa__qwen3.5-0.8b__radixflow__cold__forward.json").read_text())
    results = tmp_path / "bench-only"
    payload = {
        "meta": {"command": "bench", "model": "qwen3.5-0.8b"},
        "arms": [src["arms"][0], other["arms"][0]],
    }
    (results / "bench").mkdir(parents=True)
    (results / "bench" / "run1.json").write_text(json.dumps(payload))
    rep = build_report(results, tmp_path / "rep", warn=lambda m: None)
    rows = rep.tables["bench_table1"].rows
    assert [r[3] for r in rows] == ["radix", "radixflow"]
    assert rows[0][7] == f"{src['arms'][0]['rounds']:,}" and rows[0][8] == "19,803"
    assert "Real-engine bench results" in (tmp_path / "rep" / "report.md").read_text()


def test_missing_results_directory_is_a_user_error(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "run `radixflow experiment` first" in capsys.readouterr().err


def test_bench_model_names_map_to_presets():
    assert model_key("/ckpt/nvidia/NVIDIA-Nemotron-Nano-9B-v2/") == "nemotron-nano-9b-v2"
    assert model_key("Qwen3-8B") == "qwen3-8b" and model_key("tiny-hybrid") == "tiny-hybrid"
