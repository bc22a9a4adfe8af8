"""`--scheduler vllm` (integrations/vllm/sim_backend.py): vLLM 0.33's own Scheduler under the cost model, and
radixflow's scheduler in `--snapshot-mode vllm-align` matching it step for step on small traces."""

from __future__ import annotations

import random

import pytest
from vllm_factories import load_harness

from radixflow.cli import main
from radixflow.config import SchedulerConfig
from radixflow.core.policies import get_arm
from radixflow.integrations.vllm import sim_backend as vllm_backend
from radixflow.sim.cost_model import get_gpu
from radixflow.sim.runner import SimSetup, run_arm
from radixflow.spec import get_spec
from radixflow.workloads.qa import QUALITY, RACE_M, stream_records, synth_questions
from radixflow.workloads.trace import branch_from_record


def _trace(shape, questions: int, stream: str, rate: float, gap: float = 0.0005):
    qs = synth_questions(shape, random.Random(0), questions)
    return [branch_from_record(r) for r in stream_records(qs, stream, "forward", rate, 0, branch_gap=gap)]


def _both(model, shape, stream, rate, arm, **cfg):
    """One small trace through radixflow's scheduler (vllm-align, `--handoff off`: vLLM's scheduler cannot
    hand off) and through vLLM's."""
    load_harness()
    cfg = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=8192, snapshot_mode="vllm-align",
                          **{"handoff": "off", **cfg})
    setup = SimSetup(get_spec(model), get_gpu("a800"), cfg, check=True)
    branches = _trace(shape, 12, stream, rate)
    ours, _ = run_arm(setup, get_arm(arm), [branches])
    theirs, runs = vllm_backend.run_vllm_arm(setup, get_arm(arm), [branches])
    return ours, theirs, runs, branches


@pytest.mark.parametrize(("model", "shape", "stream", "rate", "arm"), [
    ("qwen3.5-0.8b", QUALITY, "reuse", 5.0, "radix"),
    ("qwen3.5-0.8b", QUALITY, "cold", 5.0, "radixflow"),
    ("nemotron-nano-9b-v2", QUALITY, "reuse", 0.0, "radixflow"),
    ("nemotron-nano-9b-v2", RACE_M, "cold", 1.5, "radix+flex"),
])
def test_vllm_align_matches_vllms_scheduler_exactly(model, shape, stream, rate, arm):
    ours, theirs, runs, _ = _both(model, shape, stream, rate, arm)
    assert 1 < ours.rounds < ours.fragments  # several rounds, several rows each: not a trivial trace
    assert (ours.rounds, ours.tokens, ours.cached_tokens) == (theirs.rounds, theirs.tokens, theirs.cached_tokens)
    if arm.startswith("radix+") or arm == "radix":  # prefix-stop against vLLM native: row for row
        assert (ours.fragments, ours.blocked_deferrals) == (theirs.fragments, theirs.blocked_deferrals)
        assert ours.host_time == pytest.approx(theirs.host_time)  # same rows, same cost model, same clock
    else:  # state-ready against the plugin: both reserve for deferred branches, each its own way (SPEC §12)
        assert ours.fragments == pytest.approx(theirs.fragments, rel=0.03)
        assert ours.blocked_deferrals > 0 and theirs.blocked_deferrals > 0
    assert all(b.finished_at is not None for b in runs[0].branches)


@pytest.mark.parametrize(("model", "shape", "stream", "rate", "arm"), [
    ("qwen3.5-0.8b", RACE_M, "cold", 0.0, "radix"),
    ("qwen3.5-0.8b", QUALITY, "reuse", 5.0, "radix"),
    ("nemotron-nano-9b-v2", QUALITY, "cold", 1.5, "radix"),
    ("qwen3.5-0.8b", QUALITY, "reuse", 0.0, "radixflow"),
])
def test_partial_hits_match_vllms_scheduler_with_the_same_prefix_match_unit(model, shape, stream, rate, arm):
    # --prefix-match-unit 16 on both sides: the tail-boundary stop gives about two rows per branch, hits
    # land on 16-token boundaries inside a block, and the producer's copy-on-write defers its siblings.
    ours, theirs, _, branches = _both(model, shape, stream, rate, arm, prefix_match_unit=16)
    assert ours.fragments > 1.5 * len(branches)  # the tail cut: more than one row for most branches
    assert ours.cached_tokens % 16 == 0 and ours.cached_tokens > 0
    assert (ours.rounds, ours.tokens, ours.cached_tokens) == (theirs.rounds, theirs.tokens, theirs.cached_tokens)
    if arm == "radix":  # row for row (native vLLM reports no deferrals to compare)
        assert ours.fragments == theirs.fragments
        assert ours.host_time == pytest.approx(theirs.host_time)
    else:
        assert ours.fragments == pytest.approx(theirs.fragments, rel=0.03)


@pytest.mark.parametrize(("shape", "stream", "rate", "arm"), [
    (QUALITY, "cold", 1.5, "radix"),
    (RACE_M, "reuse", 1.5, "radix"),
    (QUALITY, "reuse", 0.0, "radixflow"),
])
def test_vllm_029_rules_match_vllms_scheduler_without_the_checkpoint_export(shape, stream, rate, arm):
    # --vllm-version 0.29 on Nemotron-H: no Mamba-2 checkpoint export, so its last chunk is cut as
    # Qwen3.5's; vLLM's scheduler gets the same (MambaSpec.num_prefill_checkpoint_blocks = 0).
    ours, theirs, _, branches = _both("nemotron-nano-9b-v2", shape, stream, rate, arm, vllm_version="0.29")
    assert (ours.rounds, ours.tokens, ours.cached_tokens) == (theirs.rounds, theirs.tokens, theirs.cached_tokens)
    if arm == "radix":
        assert ours.fragments == theirs.fragments
        assert ours.host_time == pytest.approx(theirs.host_time)
    else:
        assert ours.fragments == pytest.approx(theirs.fragments, rel=0.03)
    if shape is QUALITY:  # articles past the 1,312-token block: the cut adds rows 0.33's export saves
        default, _, _, _ = _both("nemotron-nano-9b-v2", shape, stream, rate, arm)
        assert ours.fragments > default.fragments


def test_vllm_backend_refuses_029_all_mode():
    load_harness()
    cfg = SchedulerConfig(snapshot_mode="vllm-align", vllm_version="0.29", mamba_cache_mode="all")
    setup = SimSetup(get_spec("nemotron-nano-9b-v2"), get_gpu("a800"), cfg)
    with pytest.raises(ValueError, match="no 'all' Mamba cache mode"):
        vllm_backend.run_vllm_arm(setup, get_arm("radix"), [_trace(QUALITY, 2, "cold", 1.5)])


def test_vllm_backend_refuses_the_fragment_arm():
    load_harness()
    setup = SimSetup(get_spec("qwen3.5-0.8b"), get_gpu("a800"), SchedulerConfig(snapshot_mode="vllm-align"))
    with pytest.raises(ValueError, match="no vLLM counterpart"):
        vllm_backend.run_vllm_arm(setup, get_arm("radixflow+frag"), [_trace(RACE_M, 1, "cold", 0.0)])


def test_simulate_with_vllm_scheduler_writes_the_same_json(tmp_path, capsys):
    load_harness()
    import json

    out = tmp_path / "r.json"
    args = ["simulate", "--model", "nemotron-nano-9b-v2", "--questions", "6", "--stream", "cold", "--order",
            "forward", "--snapshot-mode", "vllm-align", "--branch-gap", "0.0005", "--json", str(out)]
    assert main([*args, "--scheduler", "vllm"]) == 0
    assert "rows/branch" in capsys.readouterr().out
    theirs = json.loads(out.read_text())
    assert main(args) == 0
    ours = json.loads(out.read_text())
    assert theirs["meta"]["scheduler"] == "vllm" and theirs["meta"]["block_size"] == 1312
    assert theirs["meta"]["handoff"] == "off" and ours["meta"]["handoff"] == "auto"  # vLLM's waits; ours defaults
    assert main([*args, "--handoff", "off"]) == 0  # radixflow's scheduler on vLLM's wait path: the same rows
    ours = json.loads(out.read_text())
    for a, b in zip(ours["arms"], theirs["arms"]):
        assert a.keys() == b.keys()
        assert (a["rounds"], a["fragments"], a["cached_tokens"]) == (b["rounds"], b["fragments"], b["cached_tokens"])
        assert a["rows_per_branch"] == a["fragments"] / a["branches"]


def test_simulate_with_vllm_scheduler_without_vllm_is_one_line_exit_2(monkeypatch, capsys):
    def missing():
        raise vllm_backend.VllmUnavailable("--scheduler vllm needs vLLM 0.33 (the 'vllm' extra)")

    monkeypatch.setattr(vllm_backend, "_harness", missing)
    assert main(["simulate", "--questions", "1", "--scheduler", "vllm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs vLLM 0.33" in err[0]
