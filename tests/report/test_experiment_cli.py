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
