import json
import subprocess
import sys

import pytest

from radixflow.cli import main


def test_figure1_json_schema(tmp_path):
    out = tmp_path / "f1.json"
    assert main(["simulate", "--workload", "figure1", "--policy", "radix,radixflow", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    arms = {a["policy"]: a for a in data["arms"]}
    for key in ("policy", "rounds", "fragments", "tokens", "rows_per_round", "empty_slots", "reuse_rate",
                "latency_mean", "latency_p95", "first_selection_wait_mean", "host_time", "cost_per_round",
                "lower_bound"):
        assert key in arms["radix"]
    assert data["meta"]["handoff"] == "off"  # the paper's Figure 1 waits unless --handoff is given
    assert (arms["radix"]["rounds"], arms["radix"]["empty_slots"]) == (6, 9)
    assert (arms["radixflow"]["rounds"], arms["radixflow"]["empty_slots"]) == (4, 1)
    ci = arms["radixflow"]["cost_identity"]
    assert abs(ci["delta_host"] - (ci["round_gain"] - ci["cost_drift"])) < 1e-9


@pytest.mark.parametrize("args,msg", [
    (["--policy", "nope"], "unknown policy 'nope'"),
    (["--model", "gpt-9"], "unknown model 'gpt-9'"),
    (["--max-num-batched-tokens", "8", "--block-size", "16"], "smaller than one block"),
    (["--checkpoints", "branch", "--scheduler", "vllm"], "--checkpoints branch is radixflow's scheduler only"),
    (["--checkpoint-wait", "sometimes"], "argument --checkpoint-wait: must be 'grid' or a positive token count"),
])
def test_bad_input_one_line_error_nonzero_exit(args, msg):
    r = subprocess.run([sys.executable, "-m", "radixflow.cli", "simulate", "--workload", "figure1", *args],
                       capture_output=True, text=True)
    assert r.returncode != 0
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and msg in lines[0]


def test_bad_trace_file(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"request_id": "r", "branch": 0}\n')
    r = subprocess.run([sys.executable, "-m", "radixflow.cli", "simulate", "--workload", str(p)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "missing field" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_checkpoints_flag_reports_misses_by_cause(tmp_path):
    """vLLM-sized blocks: branch checkpoints recover the within-block sharing; the JSON splits the prompt."""
    reuse = {}
    for mode in ("boundary", "branch"):
        out = tmp_path / f"{mode}.json"
        assert main(["simulate", "--model", "qwen3.5-0.8b", "--questions", "12", "--rate", "3", "--stream", "cold",
                     "--order", "forward", "--policy", "radixflow", "--block-size", "528", "--state-interval", "528",
                     "--checkpoints", mode, "--check", "--json", str(out)]) == 0
        arm = json.loads(out.read_text())["arms"][0]
        m = arm["misses"]
        assert m["ready_hit"] + m["checkpoint_missing"] + m["evicted"] + m["no_shared_prefix"] == m["prompt"]
        assert m["ready_hit"] == arm["cached_tokens"] and m["identity_hit"] >= m["ready_hit"]
        assert (arm["exact_checkpoints"] > 0) == (mode == "branch") and arm["capture_time"] > 0
        reuse[mode] = arm["reuse_rate"]
    assert reuse["branch"] > reuse["boundary"] + 5


def test_unknown_checkpoint_mode_is_refused():
    r = subprocess.run([sys.executable, "-m", "radixflow.cli", "simulate", "--workload", "figure1",
                        "--checkpoints", "everywhere"], capture_output=True, text=True)
    assert r.returncode != 0 and "everywhere" in r.stderr


def test_checkpoint_wait_trades_rounds_for_reuse(tmp_path):
    """'grid' waits only where boundary mode waits too (or for free); 64 waits whenever it saves 64
    tokens: more reuse, more rounds (the siblings of a question shorter than a block wait a round). The
    wait path: `--handoff off` (with the default auto those siblings are handed off instead)."""
    arms = {}
    for mode, wait in (("boundary", "grid"), ("branch", "grid"), ("branch", "64")):
        out = tmp_path / f"{mode}-{wait}.json"
        assert main(["simulate", "--model", "qwen3.5-4b", "--questions", "24", "--rate", "3", "--max-num-seqs", "16",
                     "--order", "forward", "--policy", "radixflow", "--block-size", "528", "--state-interval", "528",
                     "--checkpoints", mode, "--checkpoint-wait", wait, "--handoff", "off", "--check", "--json",
                     str(out)]) == 0
        arms[mode, wait] = json.loads(out.read_text())["arms"][0]
    boundary, grid, always = arms["boundary", "grid"], arms["branch", "grid"], arms["branch", "64"]
    assert boundary["reuse_rate"] + 5 < grid["reuse_rate"] < always["reuse_rate"]
    assert grid["rounds"] < always["rounds"]
    assert grid["blocked_deferrals"] < always["blocked_deferrals"]
