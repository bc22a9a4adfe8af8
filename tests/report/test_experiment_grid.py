import json

from radixflow.core.policies import ARMS
from radixflow.report import experiment, paper
from radixflow.report.cells import MANIFEST, Cell
from radixflow.report.experiment import Grid, preset, run_experiment


def test_quick_preset_covers_every_model_arm_stream(quick_dir):
    cells = [Cell.from_name(p.stem) for p in (quick_dir / "cells").glob("*.json")]
    qa = {(c.model, c.arm, c.stream) for c in cells if c.kind == "qa"}
    assert {m for m, _, _ in qa} == set(paper.MODELS)
    assert {a for _, a, _ in qa} == set(ARMS)
    assert {s for _, _, s in qa} == {"cold", "reuse", "mixed"}
    assert {c.arm for c in cells if c.kind == "figure1"} == {"radix", "radixflow"}
    manifest = json.loads((quick_dir / MANIFEST).read_text())
    assert len(manifest["cells"]) == len(cells)


def test_cell_json_has_the_simulate_schema_and_distributions(quick_dir):
    d = json.loads(Cell("qa", "qwen3.5-27b", "radixflow", "reuse", "forward").path(quick_dir).read_text())
    meta, (arm,) = d["meta"], d["arms"]
    assert meta["command"] == "experiment" and meta["rate"] == 5.0
    assert (meta["max_num_seqs"], meta["max_num_batched_tokens"]) == paper.BUDGETS["qwen3.5-27b"]
    for key in (
        "policy",
        "rounds",
        "fragments",
        "tokens",
        "rows_per_round",
        "empty_slots",
        "reuse_rate",
        "latency_mean",
        "latency_p95",
        "first_selection_wait_mean",
        "host_time",
        "cost_per_round",
    ):
        assert key in arm
    assert sum(arm["rows_hist"]) == arm["rounds"]
    assert sum(r * c for r, c in enumerate(arm["rows_hist"])) == arm["fragments"]
    assert len(arm["latencies"]) == arm["requests"]
    nemo = json.loads(Cell("qa", "nemotron-nano-9b-v2", "radix", "cold", "forward").path(quick_dir).read_text())
    assert nemo["meta"]["rate"] == 1.5


def test_finished_cells_are_not_rerun_but_changed_settings_are(tmp_path, monkeypatch):
    grid = Grid(models=("qwen3.5-0.8b",), arms=("radix",), streams=("cold",), orders=("forward",), questions=4)
    n = len(grid.cells())  # the qa cell, two figure1 cells and the multi-turn ones if trace exists
    first = run_experiment(grid, tmp_path, jobs=1)
    assert len(first.ran) == n and not first.skipped
    again = run_experiment(grid, tmp_path, jobs=1)
    assert not again.ran and len(again.skipped) == n
    grid.questions = 5
    changed = run_experiment(grid, tmp_path, jobs=1)
    assert [n for n, _ in changed.ran] == ["qa__qwen3.5-0.8b__radix__cold__forward"]
    monkeypatch.setattr(experiment, "code_version", lambda: "other scheduler")
    assert len(run_experiment(grid, tmp_path, jobs=1).ran) == n  # new simulator code: every cell again


def test_a_failing_cell_is_named_and_the_rest_run(tmp_path):
    grid = Grid(
        models=("qwen3.5-0.8b",),
        arms=("radix",),
        streams=("cold",),
        orders=("forward",),
        questions=2,
        budgets={"qwen3.5-0.8b": (16, 8)},
    )  # T below one block: the config is rejected
    rep = run_experiment(grid, tmp_path, jobs=1)
    assert [n for n, _ in rep.failed] == ["qa__qwen3.5-0.8b__radix__cold__forward"]
    assert len(rep.ran) == len(grid.cells()) - 1


def test_calibration_picks_budgets_from_the_search_and_freezes_them(tmp_path, monkeypatch):
    from radixflow.report import calibrate

    monkeypatch.setattr(calibrate, "S_GRID", (4, 16))
    monkeypatch.setattr(calibrate, "T_GRID", (2048, 8192))
    grid = preset("quick")
    grid.models, grid.arms, grid.streams, grid.orders, grid.questions = (
        ("nemotron-nano-9b-v2",),
        ("radix", "radixflow"),
        ("cold",),
        ("forward",),
        3,
    )
    grid.calibrate = True
    run_experiment(grid, tmp_path, jobs=2)
    cal = json.loads((tmp_path / "calibration.json").read_text())["nemotron-nano-9b-v2"]
    assert len(cal["search"]) == 4 and cal["questions"] == 64
    chosen = calibrate.choose(cal["search"])
    assert (cal["max_num_seqs"], cal["max_num_batched_tokens"]) == (
        chosen["max_num_seqs"],
        chosen["max_num_batched_tokens"],
    )
    for arm in ("radix", "radixflow"):
        cell = json.loads(Cell("qa", "nemotron-nano-9b-v2", arm, "cold", "forward").path(tmp_path).read_text())
        assert (cell["meta"]["max_num_seqs"], cell["meta"]["max_num_batched_tokens"]) == (
            cal["max_num_seqs"],
            cal["max_num_batched_tokens"],
        )


def test_choose_prefers_throughput_then_latency():
    from radixflow.report.calibrate import choose

    trials = [
        {"max_num_seqs": 8, "max_num_batched_tokens": 2048, "throughput": 4.0, "latency_mean": 1.0},
        {"max_num_seqs": 16, "max_num_batched_tokens": 8192, "throughput": 4.98, "latency_mean": 0.5},
        {"max_num_seqs": 64, "max_num_batched_tokens": 8192, "throughput": 5.0, "latency_mean": 0.7},
    ]
    assert choose(trials)["max_num_seqs"] == 16
