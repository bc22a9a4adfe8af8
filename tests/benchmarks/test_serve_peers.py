"""benchmarks/serve_peers.py: its workloads, its summaries, and its radixflow client against a live server."""

from __future__ import annotations

import importlib.util
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "server"))

from server_harness import start_server  # noqa: E402


def _load():
    spec = importlib.util.spec_from_file_location("serve_peers", ROOT / "benchmarks" / "serve_peers.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["serve_peers"] = mod   # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


sp = _load()


# ---------------------------------------------------------------------------- workloads
def test_scoring_workload_is_seeded_and_shaped_as_stated():
    sizes = sp.Sizes()
    qs = sp.scoring_workload(sizes, 0)
    assert qs == sp.scoring_workload(sizes, 0)
    assert qs != sp.scoring_workload(sizes, 1)
    assert len(qs) == sizes.docs * sizes.questions_per_doc == 8
    assert [q.doc for q in qs] == [0, 0, 0, 0, 1, 1, 1, 1]   # a document's questions back to back
    for q in qs:
        assert 800 <= q.doc_len <= 1200 and 12 <= q.shared - q.doc_len <= 40
        assert len(q.prompts) == 4
        for p in q.prompts:   # document + question, then a candidate of its own
            assert p[:q.shared] == q.prompts[0][:q.shared] and 2 <= len(p) - q.shared <= 12
            assert all(0 <= t < 256 for t in p)
        same_doc = [o for o in qs if o.doc == q.doc]
        assert all(o.prompts[0][:o.doc_len] == q.prompts[0][:q.doc_len] for o in same_doc)
    assert qs[0].prompts[0][:100] != qs[4].prompts[0][:100]
    total = sum(len(p) for q in qs for p in q.prompts)
    assert 32 * (800 + 12 + 2) <= total <= 32 * (1200 + 40 + 12)


def test_agentic_workload_is_seeded_and_shaped_as_stated():
    sizes = sp.Sizes()
    ss = sp.agentic_workload(sizes, 0)
    assert ss == sp.agentic_workload(sizes, 0) and ss != sp.agentic_workload(sizes, 5)
    assert len(ss) == 4
    for s in ss:
        assert 400 <= len(s.first) <= 600
        assert len(s.tools) == sizes.turns - 1 == 3
        assert all(60 <= len(t) <= 140 for t in s.tools)


def test_scale_multiplies_documents_and_sessions_and_lengths():
    small = sp.Sizes().scaled(0.5, lengths=0.25)
    assert (small.docs, small.sessions) == (1, 2)
    assert small.doc_len == (200, 300) and small.candidate_len == (1, 3) and small.reply_tokens == 16
    assert sp.Sizes().scaled(0.01).docs == 1
    with pytest.raises(ValueError):
        sp.Sizes().scaled(0)


# ---------------------------------------------------------------------------- summaries
def _item(key, ttft, prompt=100, cached=0, tokens=(1,)):
    return sp.Item(key, ttft, ttft, prompt, prompt - cached, cached, [sp.Row(t, -0.5) for t in tokens])


def test_percentile_is_linear_between_ranks():
    xs = [float(x) for x in range(1, 101)]
    assert sp.percentile(xs, 50) == pytest.approx(50.5)
    assert sp.percentile(xs, 99) == pytest.approx(99.01)
    assert sp.percentile([3.0], 99) == 3.0
    assert sp.percentile([4.0, 1.0], 0) == 1.0
    assert math.isnan(sp.percentile([], 50))


def test_summarise_counts_and_rates():
    items = [_item("a", 1.0, 100, 0), _item("b", 2.0, 200, 150), _item("c", 4.0, 300, 280)]
    s = sp.summarise(items, 10.0)
    assert s["items"] == 3 and s["items_per_s"] == pytest.approx(0.3)
    assert s["ttft_p50_s"] == 2.0 and s["ttft_p99_s"] == pytest.approx(3.96)
    assert (s["prompt_tokens"], s["computed"], s["cached"]) == (600, 170, 430)


def test_ratios_and_verdicts():
    ours = {"startup_s": 10.0, "scoring": {"items_per_s": 3.0, "ttft_p99_s": 1.0},
            "agentic": {"items_per_s": 0.9, "ttft_p99_s": 2.0}, "decode": {"1": {"tok_s": 5.0}, "16": {"tok_s": 20.0}}}
    llama = {"startup_s": 5.0, "scoring": {"items_per_s": 1.5, "ttft_p99_s": 2.0},
             "agentic": {"items_per_s": 1.0, "ttft_p99_s": 1.0},
             "decode": {"1": {"tok_s": 10.0}, "16": {"tok_s": 40.0}}}
    r = sp.ratios(ours, llama)
    assert r == pytest.approx({"scoring_throughput": 2.0, "scoring_ttft_p99": 0.5, "agentic_throughput": 0.9,
                               "agentic_ttft_p99": 2.0, "startup": 2.0, "decode_1": 0.5, "decode_16": 0.5})
    top1 = {"scoring": {"rows": 4, "same": 4}, "agentic": {"replies": 2, "same": 2}}
    v = sp.verdicts(r, top1, 10.0)
    assert v == {"scoring >= 1.5x": True, "agentic >= 1.0x": False, "TTFT p99 scoring <= llama": True,
                 "TTFT p99 agentic <= llama": False, "top-1 same on every compared row": True, "start-up <= 15 s": True}
    worse = sp.verdicts(r, {**top1, "agentic": {"replies": 2, "same": 1}}, 20.0)
    assert worse["top-1 same on every compared row"] is False and worse["start-up <= 15 s"] is False
    assert sp.verdicts({}, {}, None)["scoring >= 1.5x"] is None


def test_compare_scoring_finds_every_differing_row():
    ours = [_item("d0/q0", 1, tokens=(5, 6, 7, 8)), _item("d0/q1", 1, tokens=(1, 2, 3, 4))]
    theirs = [_item("d0/q0", 1, tokens=(5, 6, 7, 8)), _item("d0/q1", 1, tokens=(1, 9, 3, 4))]
    theirs[0].rows[2].logprob = -0.5 + 2e-3
    c = sp.compare_scoring(ours, theirs)
    assert (c["rows"], c["same"]) == (8, 7)
    assert c["mismatches"] == ["d0/q1/1: 2 vs 9"]
    assert c["max_abs_dlogprob"] == pytest.approx(2e-3)


def test_compare_agentic_stops_a_session_at_its_first_different_reply():
    ours = [_item("s0/t0", 1, tokens=(1, 2, 3)), _item("s1/t0", 1, tokens=(4, 5, 6)),
            _item("s0/t1", 1, tokens=(7, 8, 9)), _item("s1/t1", 1, tokens=(1, 1, 1))]
    theirs = [_item("s0/t0", 1, tokens=(1, 2, 3)), _item("s1/t0", 1, tokens=(4, 0, 6)),
              _item("s0/t1", 1, tokens=(7, 8, 9)), _item("s1/t1", 1, tokens=(1, 1, 1))]
    c = sp.compare_agentic(ours, theirs)
    assert (c["replies"], c["same"], c["not_compared"]) == (3, 2, 1)   # s1/t1 follows a different history
    assert (c["tokens"], c["same_tokens"]) == (9, 8)
    assert c["mismatches"] == ["s1/t0: first difference at token 1"]


def test_llama_server_response_is_read_from_its_own_fields():
    # the shape tools/server/server-task.cpp writes for a non-streamed /completion with n_probs
    out = {"index": 0, "content": "x", "tokens": [17], "stop": True,
           "completion_probabilities": [{"id": 17, "token": "x", "logprob": -1.25, "bytes": [120],
                                         "top_logprobs": [{"id": 17, "token": "x", "logprob": -1.25}]}],
           "timings": {"cache_n": 1000, "prompt_n": 68, "prompt_ms": 900.0, "predicted_n": 1}}
    row, computed, cached = sp.LlamaClient._one(out)
    assert (row.token, row.logprob, computed, cached) == (17, -1.25, 68, 1000)


def test_missing_llama_server_is_one_clear_error(capsys, tmp_path):
    rc = sp.main(["--models", "tiny-qwen3.5", "--llama-server", str(tmp_path / "nope" / "llama-server")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "llama-server is not installed" in err[0] and "scripts/install_llamaserver.sh" in err[0]
    assert "--only radixflow" in err[0]


def test_llama_commands_state_each_workloads_settings(tmp_path):
    sizes = sp.Sizes()
    cmd = sp.llama_cmd(tmp_path / "llama-server", tmp_path / "m.gguf", 1234, "agentic", sizes)
    assert cmd[cmd.index("-np") + 1] == "4" and "--no-cache-idle-slots" in cmd
    assert cmd[cmd.index("-t") + 1] == cmd[cmd.index("-tb") + 1] == "2"
    scoring = sp.llama_cmd(tmp_path / "llama-server", tmp_path / "m.gguf", 1234, "scoring", sizes)
    assert scoring[scoring.index("-ub") + 1] == "64" and scoring[scoring.index("-np") + 1] == "1"


# ---------------------------------------------------------------------------- the client, end to end
def test_radixflow_client_runs_both_workloads_against_a_live_server():
    sizes = replace(sp.Sizes().scaled(0.5, lengths=0.125), probe_streams=(1, 3), probe_tokens=4)
    server = start_server("tiny-qwen3.5", api_keys=(), max_model_len=1024)
    try:
        client = sp.RadixflowClient(server.url, "tiny-qwen3.5", 120)
        questions = sp.scoring_workload(sizes, 0)
        summary, items = sp.run_scoring(client, questions)
        assert summary["items"] == len(questions) == 4
        assert all(len(i.rows) == 4 and all(0 <= r.token < 512 and r.logprob <= 0 for r in i.rows) for i in items)
        assert summary["prompt_tokens"] == sum(len(p) for q in questions for p in q.prompts)
        assert summary["computed"] + summary["cached"] == summary["prompt_tokens"]
        assert summary["cached"] > 0          # later questions reuse the document
        again, items2 = sp.run_scoring(client, questions)
        assert [r.token for i in items for r in i.rows] == [r.token for i in items2 for r in i.rows]
        assert again["cached"] > summary["cached"]

        sessions = sp.agentic_workload(sizes, 0)
        summary, turns = sp.run_agentic(client, sessions, sizes)
        assert summary["items"] == len(sessions) * sizes.turns == 8
        assert all(len(t.rows) == sizes.reply_tokens and 0 <= t.ttft <= t.latency for t in turns)
        later = [t for t in turns if not t.key.endswith("/t0")]
        assert all(t.cached > 0 for t in later)    # a turn extends its session's history
        assert summary["computed"] + summary["cached"] == summary["prompt_tokens"]

        decode = sp.run_decode(client, sizes, 0)
        assert set(decode) == {"1", "3"}
        assert decode["3"]["tokens"] == 3 * (sizes.probe_tokens - 1) and decode["3"]["tok_s"] > 0
    finally:
        server.stop()


def test_a_server_that_exits_or_never_answers_is_reported_and_stopped(tmp_path):
    boom = [sys.executable, "-c", "import sys; print('boom: bad flag'); sys.exit(3)", "--port", str(sp.free_port())]
    with pytest.raises(RuntimeError, match=r"(?s)exited with 3.*boom: bad flag"):
        with sp.Server(boom, tmp_path / "boom.log"):
            pass
    # a process that never serves: it waits on an event nobody sets, until the harness stops it
    never = "import threading; threading.Event().wait()"
    silent = sp.Server([sys.executable, "-c", never, "--port", str(sp.free_port())],
                       tmp_path / "silent.log", startup_timeout=1.0)
    with pytest.raises(RuntimeError, match="did not answer 200 within 1 s"):
        with silent:
            pass
    assert silent.proc.poll() is not None   # stopped, not left running


def test_interleaved_runs_alternate_the_servers_item_by_item():
    """Side by side (the default order): item i goes to both clients, the first of them alternating, each
    keeps its own agentic histories, and a client's time is the sum of its items' latencies."""
    calls = []

    class Fake(sp.Client):
        def __init__(self, name: str, latency: float, reply: int):
            super().__init__("http://x", "m", 1.0)
            self.name, self.latency, self.reply = name, latency, reply

        def stream(self, prompt, n, key=""):
            calls.append((self.name, key, len(prompt)))
            return sp.Item(key, self.latency / 2, self.latency, len(prompt), 1, len(prompt) - 1,
                           [sp.Row(self.reply)] * n)

    sizes = sp.Sizes().scaled(0.5, lengths=0.125)
    sessions = sp.agentic_workload(sizes, 0)
    a, b = Fake("a", 0.5, 7), Fake("b", 2.0, 9)
    (sa, ia), (sb, ib) = sp.run_agentics([a, b], sessions, sizes)
    n = len(sessions) * sizes.turns
    assert [c[0] for c in calls] == ["a", "b", "b", "a"] * (n // 2)
    assert [c[1] for c in calls[::2]] == [i.key for i in ia] == [i.key for i in ib]
    assert sa["wall_s"] == 0.5 * n and sb["wall_s"] == 2.0 * n and sa["items_per_s"] == 4 * sb["items_per_s"]
    # each history grows by its own server's reply: the same lengths here, its own tokens
    assert [c[2] for c in calls if c[0] == "a"] == [c[2] for c in calls if c[0] == "b"]
    assert all(r.token == 7 for i in ia for r in i.rows) and all(r.token == 9 for i in ib for r in i.rows)
