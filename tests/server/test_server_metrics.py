"""/metrics over HTTP: gauges refreshed after every change (an abort that leaves the engine idle),
pools split into held / cached / free, the model label, TPOT and inter-token latency, and the
snapshot mode the server was started with."""

from __future__ import annotations

import httpx
from server_harness import metric, scrape, start_server

QUEUES = ("pending", "held", "waiting", "running")


def _pools(samples, name: str) -> dict[str, float]:
    return {k: metric(samples, name, kind=k) for k in ("held", "cached", "free", "total")}


def test_gauges_after_an_abort_leaves_the_engine_idle(hybrid_server):
    body = {"prompt": "abandon me " * 20, "max_tokens": 500, "ignore_eos": True, "stream": True,
            "namespace": "gauges"}
    # prefill and three decode rounds, then the engine holds the branch: it holds pages and a state slot
    with hybrid_server.held(rounds=4) as held:
        with httpx.stream("POST", hybrid_server.url + "/v1/completions", json=body, timeout=60):
            assert held.wait(60)
            during = scrape(hybrid_server.url)
        # the client left mid-stream: the request is aborted
        report = hybrid_server.wait_idle()
        after = scrape(hybrid_server.url)
    assert metric(during, "radixflow_queue_length", state="running") == 1
    pages, slots = _pools(during, "radixflow_kv_pages"), _pools(during, "radixflow_state_slots")
    assert pages["held"] + pages["cached"] + pages["free"] == pages["total"]
    assert slots["held"] >= 1  # the decoding branch's working state
    assert {q: metric(after, "radixflow_queue_length", state=q) for q in QUEUES} == dict.fromkeys(QUEUES, 0.0)
    pages, slots = _pools(after, "radixflow_kv_pages"), _pools(after, "radixflow_state_slots")
    assert pages["held"] == 0 and slots["held"] == 0
    assert pages["cached"] > 0 and slots["cached"] > 0  # what the aborted branch published stays cached
    assert pages["held"] + pages["cached"] + pages["free"] == pages["total"]
    assert pages == {k: float(v) for k, v in report["kv_pages"].items()}  # the gauges say what the pools say
    assert slots == {k: float(v) for k, v in report["state_slots"].items()}
    assert metric(after, "radixflow_aborted_requests_total") >= 1


def test_tpot_and_inter_token_latency(hybrid_server):
    def counts():
        s = scrape(hybrid_server.url)
        return (metric(s, "radixflow_time_per_output_token_seconds_count"),
                metric(s, "radixflow_inter_token_latency_seconds_count"),
                metric(s, "radixflow_inter_token_latency_seconds_sum"))

    hybrid_server.wait_idle()
    tpot0, itl0, itl_sum0 = counts()
    r = hybrid_server.post("/v1/completions", json={"prompt": ["t1", "t2"], "max_tokens": 8, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16
    tpot1, itl1, itl_sum1 = counts()
    assert tpot1 - tpot0 == 2  # one per finished branch
    assert itl1 - itl0 == 14  # 7 gaps between 8 tokens, per branch
    assert itl_sum1 > itl_sum0


def test_every_metric_carries_the_served_model_name():
    live = start_server("tiny-qwen3", served_model_name="my-model")
    try:
        r = live.post("/v1/completions", json={"model": "my-model", "prompt": "a", "max_tokens": 1})
        assert r.status_code == 200
        samples = scrape(live.url)
        assert samples and all(("model_name", "my-model") in labels for _, labels in samples)
        assert metric(samples, "radixflow_requests_total", endpoint="/v1/completions", status="200") == 1
    finally:
        live.stop()


def test_snapshot_mode_is_honoured(hybrid_server):
    """chunk-end snapshots only where a chunk ends; every-boundary at each state interval (64)."""
    live = start_server("tiny-qwen3.5", snapshot_mode="chunk-end")
    try:
        body = {"prompt": list(range(1, 301)), "max_tokens": 1, "namespace": "snapshot-mode"}
        made = {}
        for name, server in (("every-boundary", hybrid_server), ("chunk-end", live)):
            before = server.wait_idle()
            assert server.post("/v1/completions", json=body).status_code == 200
            after = server.wait_idle()
            assert after["snapshot_mode"] == name and after["integrity"] == "ok"
            made[name] = after["snapshots"] - before["snapshots"]
        assert made["every-boundary"] >= 4 > made["chunk-end"] >= 1, made
    finally:
        live.stop()


def test_handoff_rows_levels_and_extra_level_time_are_reported():
    """Four candidates over one document in one request, branch checkpoints, --handoff on: the siblings run
    as dependent rows of the first in the same forward, and /metrics counts them, their levels and time."""
    live = start_server("tiny-qwen3.5", checkpoints="branch", handoff="on")
    try:
        doc = list(range(1, 200))
        body = {"prompt": [doc + [300 + i, 400 + i] for i in range(4)], "max_tokens": 1, "namespace": "handoff"}
        assert live.post("/v1/completions", json=body).status_code == 200
        assert live.wait_idle()["integrity"] == "ok"
        samples = scrape(live.url)
        assert metric(samples, "radixflow_handoff_rows_total") >= 1
        # the siblings' producer is a multi-token row: they run folded into its scan (engine/models/batch.py
        # FOLD), no extra level is timed; what they add to its scan is predicted by the fold fit and timed
        # inside the scans, both counted
        assert metric(samples, "radixflow_handoff_seconds_total") == 0
        assert metric(samples, "radixflow_handoff_fold_seconds_total") > 0
        assert metric(samples, "radixflow_handoff_fold_measured_seconds_total") > 0
        assert metric(samples, "radixflow_handoff_level0_seconds_total") >= 0  # the rows priced at level 0
        # levels are the engine's: the folded siblings open none, every round ran one level
        assert metric(samples, "radixflow_round_levels_bucket", le="1.0") == metric(
            samples, "radixflow_round_levels_count") >= 1
    finally:
        live.stop()


def test_handoff_choices_and_predicted_level_time_are_reported():
    """--handoff auto decides by the engine's own calibrated costs: /metrics counts its choices and the
    predicted time of the levels it ran beside the measured time."""
    live = start_server("tiny-qwen3.5", checkpoints="branch", handoff="auto")
    try:
        doc = list(range(1, 200))
        body = {"prompt": [doc + [300 + i, 400 + i] for i in range(4)], "max_tokens": 1, "namespace": "auto"}
        assert live.post("/v1/completions", json=body).status_code == 200
        assert live.wait_idle()["integrity"] == "ok"
        samples = scrape(live.url)
        def chosen(c: str) -> float:
            try:
                return metric(samples, "radixflow_handoff_choices_total", choice=c)
            except KeyError:  # a labelled child appears once counted
                return 0.0
        assert chosen("handoff") + chosen("wait") + chosen("recompute") >= 1
        if chosen("handoff"):  # folded into the producer's scan: no level to predict or time
            assert metric(samples, "radixflow_handoff_predicted_seconds_total") == 0
            assert metric(samples, "radixflow_handoff_seconds_total") == 0
            assert metric(samples, "radixflow_handoff_fold_seconds_total") >= 0
    finally:
        live.stop()
