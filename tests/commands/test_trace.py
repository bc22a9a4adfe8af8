"""`radixflow trace multi-turn`: the chapter's table, its JSON and the hybrid gap."""

from __future__ import annotations

import json

from radixflow.cli import main

CHAPTER = ["trace", "multi-turn", "--system", "200", "--user", "80", "--assistant", "150", "--turns", "5"]


def test_full_attention_table_and_json(tmp_path, capsys):
    path = tmp_path / "t.json"
    assert main([*CHAPTER, "--model", "qwen3-8b", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "600 tokens with the cache, 3,700 without" in out
    data = json.loads(path.read_text())
    turns = data["turns"]
    assert [t["request_len"] for t in turns] == [280, 510, 740, 970, 1200]
    assert [t["hit"] for t in turns] == [0, 430, 660, 890, 1120]
    assert [t["ready_hit"] for t in turns] == [0, 430, 660, 890, 1120]
    assert [t["recomputed"] for t in turns] == [280, 80, 80, 80, 80]
    assert (data["total_recomputed"], data["total_without_cache"]) == (600, 3700)


def test_hybrid_variants_show_the_gap(tmp_path, capsys):
    path = tmp_path / "h.json"
    argv = [*CHAPTER, "--model", "qwen3.5-0.8b", "--variant", "rewrite-turn2", "--variant", "new-user",
            "--json", str(path)]
    assert main(argv) == 0
    assert "new user" in capsys.readouterr().out
    data = json.loads(path.read_text())
    assert data["hybrid"] and data["total_recomputed"] == 600  # variants stay out of the totals
    rewrite, new_user = data["variants"]
    assert (rewrite["hit"], rewrite["ready_hit"]) == (430, 430)
    assert (new_user["hit"], new_user["ready_hit"], new_user["recomputed"]) == (200, 0, 280)


def test_user_errors_exit_2(capsys):
    assert main([*CHAPTER, "--model", "no-such-model"]) == 2
    assert "unknown model" in capsys.readouterr().err
    assert main(["trace", "multi-turn", "--system", "-1"]) == 2


def test_simulate_dispatches_session_workloads(tmp_path, capsys):
    path = tmp_path / "s.json"
    argv = ["simulate", "--workload", "agentic", "--model", "qwen3-8b", "--agents", "6", "--calls", "4",
            "--context-len", "256", "--cache-capacity", "4x", "--eviction", "lru,rr-tail:2", "--check",
            "--json", str(path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "published -65.7 %" in out
    data = json.loads(path.read_text())
    assert [p["eviction"] for p in data["policies"]] == ["lru", "rr-tail:2"]
    assert data["policies"][0]["calls"] == 24
    argv = ["simulate", "--workload", "multi-turn", "--model", "qwen3.5-0.8b", "--users", "3", "--turns", "2",
            "--cache-capacity", "3000", "--eviction", "rr-tail"]
    assert main(argv) == 0
    assert main(["simulate", "--workload", "agentic", "--eviction", "fifo"]) == 2
    assert main(["simulate", "--workload", "agentic", "--cache-capacity", "500"]) == 2
    assert "less than the longest call" in capsys.readouterr().err
    # No --cache-capacity: pools sized from GPU memory, nothing is evicted.
    assert main(["simulate", "--workload", "agentic", "--model", "qwen3.5-0.8b", "--agents", "2", "--calls", "2",
                 "--context-len", "64", "--eviction", "rr-tail"]) == 0


def test_branch_checkpoints_give_exact_hits_with_16_token_pages(tmp_path, capsys):
    """SPEC §10 on a hybrid model, 16-token pages, 512-token interval: boundary mode rounds the ready
    hit down to a page; branch checkpoints resume at the exact end of the last turn."""
    base = [*CHAPTER, "--model", "qwen3.5-4b", "--block-size", "16", "--state-interval", "512",
            "--variant", "rewrite-turn2"]
    hits = {}
    for mode in ("boundary", "branch"):
        path = tmp_path / f"{mode}.json"
        assert main([*base, "--checkpoints", mode, "--json", str(path)]) == 0
        data = json.loads(path.read_text())
        assert data["checkpoints"] == mode
        hits[mode] = [t["ready_hit"] for t in data["turns"]] + [data["variants"][0]["ready_hit"]]
        for t in data["turns"] + data["variants"]:
            m = t["misses"]
            assert t["ready_hit"] + m["checkpoint_missing"] + m["evicted"] + m["no_shared_prefix"] == t["request_len"]
    assert hits["boundary"] == [0, 416, 656, 880, 1120, 416]
    assert hits["branch"] == [0, 430, 660, 890, 1120, 430]
    assert "ckpt missing" in capsys.readouterr().out


def test_trace_refuses_a_handoff_it_cannot_run_and_records_off(tmp_path, capsys):
    from radixflow.cli import main

    assert main(["trace", "multi-turn", "--handoff", "auto"]) == 2
    assert "argument --handoff: invalid choice: 'auto'" in capsys.readouterr().err
    out = tmp_path / "t.json"
    assert main(["trace", "multi-turn", "--turns", "2", "--handoff", "off", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["meta"]["handoff"] == "off"
