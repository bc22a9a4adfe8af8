import importlib.util

from radixflow.cli import main


def _quick_args(tmp_path, model: str, arms: str) -> list[str]:
    """A one-model, one-stream quick experiment with three questions."""
    return ["experiment", "--quick", "--out", str(tmp_path), "--models", model, "--arms", arms,
            "--streams", "cold", "--orders", "forward", "--questions", "3", "--jobs", "1"]


def test_experiment_cli_runs_a_subset_and_resumes(tmp_path, capsys):
    args = _quick_args(tmp_path, "qwen3-8b", "radix,radixflow")
    n = 4 + 2 * (importlib.util.find_spec("radixflow.commands.trace") is not None)
    assert main(args) == 0
    assert f"{n} cells run, 0 already done, 0 failed" in capsys.readouterr().out
    assert main(args) == 0
    assert f"0 cells run, {n} already done" in capsys.readouterr().out


def test_experiment_cli_rejects_unknown_names(tmp_path, capsys):
    assert main(["experiment", "--out", str(tmp_path), "--arms", "radix,fastest"]) == 2
    assert "unknown fastest" in capsys.readouterr().err


def test_experiment_cli_passes_the_snapshot_mode_to_the_scheduler(tmp_path, capsys):
    import json

    args = _quick_args(tmp_path, "qwen3.5-4b", "radix")
    assert main([*args, "--snapshot-mode", "chunk-end"]) == 0
    cell = tmp_path / "cells" / "qa__qwen3.5-4b__radix__cold__forward.json"
    assert json.loads(cell.read_text())["meta"]["fingerprint"]["snapshot_mode"] == "chunk-end"
    capsys.readouterr()
    assert main(args) == 0  # another mode (the preset's default, vLLM's own): the cell is run again
    meta = json.loads(cell.read_text())["meta"]
    assert meta["fingerprint"]["snapshot_mode"] == "vllm-align"
    assert meta["block_size"] == 528  # vLLM's block for Qwen3.5-4B (fp32 SSM state)
    assert meta["branch_gap"] == 0.0005


def test_the_paper_preset_takes_vllms_default_unit_for_every_model_and_the_flag_overrides_it(tmp_path, capsys):
    import json

    from radixflow.report.experiment import preset

    grid = preset("paper")
    # one rule for every model: vLLM 0.33's default (0 = the block), no unit chosen per model name
    assert {grid.unit_of(m) for m in ("qwen3.5-0.8b", "qwen3.5-27b", "nemotron-nano-9b-v2", "qwen3-8b")} == {0}
    grid.prefix_match_unit = 16
    grid.snapshot_mode = "every-boundary"
    assert grid.unit_of("qwen3.5-0.8b") == 0  # vLLM's hash block means nothing outside vllm-align
    args = _quick_args(tmp_path, "qwen3.5-4b", "radix")
    cell = tmp_path / "cells" / "qa__qwen3.5-4b__radix__cold__forward.json"
    assert main(args) == 0  # the preset's default: the block
    meta = json.loads(cell.read_text())["meta"]
    assert meta["prefix_match_unit"] == 528 and "prefix_match_unit" not in meta["fingerprint"]
    capsys.readouterr()
    assert main([*args, "--prefix-match-unit", "16"]) == 0  # partial hits: a new fingerprint, rerun
    meta = json.loads(cell.read_text())["meta"]
    assert (meta["prefix_match_unit"], meta["fingerprint"]["prefix_match_unit"]) == (16, 16)
    assert main([*args, "--prefix-match-unit", "100"]) == 2  # does not divide 528
    assert "--prefix-match-unit 100 must divide" in capsys.readouterr().err


def test_experiment_cli_passes_checkpoints_to_every_qa_cell(tmp_path, capsys):
    import json

    args = ["experiment", "--quick", "--out", str(tmp_path), "--models", "qwen3.5-4b", "--arms", "radixflow",
            "--streams", "reuse", "--orders", "forward", "--questions", "12", "--jobs", "1"]
    assert main(args) == 0
    cell = tmp_path / "cells" / "qa__qwen3.5-4b__radixflow__reuse__forward.json"
    boundary = json.loads(cell.read_text())
    assert "checkpoints" not in boundary["meta"]["fingerprint"]  # older cells keep matching
    assert boundary["arms"][0]["exact_checkpoints"] == 0
    capsys.readouterr()
    assert main([*args, "--checkpoints", "branch"]) == 0  # another fingerprint: the cell runs again
    assert "0 failed" in capsys.readouterr().out
    branch = json.loads(cell.read_text())
    assert branch["meta"]["checkpoints"] == branch["meta"]["fingerprint"]["checkpoints"] == "branch"
    assert branch["meta"]["snapshot_mode"] == "vllm-align"  # composes with vLLM's grid (docs/checkpoints.md)
    assert branch["arms"][0]["exact_checkpoints"] > 0
    # Questions on one article resume at its exact end, not at the 528-token block below it.
    assert branch["arms"][0]["reuse_rate"] > boundary["arms"][0]["reuse_rate"] + 3


def test_experiment_cli_refuses_branch_checkpoints_on_vllms_scheduler(tmp_path, capsys):
    args = _quick_args(tmp_path, "qwen3.5-4b", "radixflow")
    assert main([*args, "--checkpoints", "branch", "--scheduler", "vllm"]) == 2
    assert "--checkpoints branch" in capsys.readouterr().err


def test_experiment_cli_takes_vllm_029_rules_for_every_model(tmp_path, capsys):
    import json

    args = _quick_args(tmp_path, "nemotron-nano-9b-v2", "radix")
    cell = tmp_path / "cells" / "qa__nemotron-nano-9b-v2__radix__cold__forward.json"
    assert main(args) == 0
    meta = json.loads(cell.read_text())["meta"]
    assert "vllm_version" not in meta["fingerprint"] and meta["mamba_cache_mode"] == "align"
    capsys.readouterr()
    assert main([*args, "--vllm-version", "0.29", "--mamba-cache-mode", "all", "--prefix-match-unit", "16"]) == 0
    assert "1 cells run" in capsys.readouterr().out  # the 0.29 rules: a new fingerprint, rerun
    meta = json.loads(cell.read_text())["meta"]
    assert (meta["fingerprint"]["vllm_version"], meta["fingerprint"]["mamba_cache_mode"]) == ("0.29", "all")
    # Nemotron-H keeps 'all': its chunk-aligned block, and vLLM's hash block backs off to it
    assert (meta["mamba_cache_mode"], meta["block_size"], meta["prefix_match_unit"]) == ("all", 1408, 1408)
    assert main([*args, "--mamba-cache-mode", "all"]) == 2  # vLLM 0.33 has no 'all' mode: one line
    assert "vLLM 0.33 has no 'all' mode" in capsys.readouterr().err


def test_simulate_records_the_vllm_rules_it_used(tmp_path, capsys):
    import json

    out = tmp_path / "r.json"
    args = ["simulate", "--model", "qwen3.5-0.8b", "--snapshot-mode", "vllm-align", "--questions", "2",
            "--stream", "cold", "--order", "forward", "--policy", "radix", "--json", str(out)]
    assert main([*args, "--vllm-version", "0.29", "--mamba-cache-mode", "all"]) == 0
    meta = json.loads(out.read_text())["meta"]
    assert (meta["vllm_version"], meta["mamba_cache_mode"], meta["block_size"]) == ("0.29", "align", 544)
    plain = [a for a in args if a not in ("--snapshot-mode", "vllm-align")]
    assert main([*plain, "--vllm-version", "0.29"]) == 2  # every-boundary: vLLM's rules need vllm-align
    assert "only with --snapshot-mode vllm-align" in capsys.readouterr().err
