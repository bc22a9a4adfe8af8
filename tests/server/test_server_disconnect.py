"""Clients that go away: streams dropped mid-way and non-streaming calls that time out are aborted on
the engine thread, free their pages and snapshots, and the server keeps serving."""

from __future__ import annotations

import random
import threading

import httpx
import pytest

URL = "/v1/completions"


def _metric(live, name: str) -> float:
    body = httpx.get(live.url + "/metrics", timeout=10).text
    return next(float(line.split()[-1]) for line in body.splitlines() if line.startswith(name))


def _long_prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(150)]  # crosses two snapshot boundaries (64, 128)


def test_streams_dropped_mid_way_leave_nothing_held(hybrid_server):
    aborted0 = _metric(hybrid_server, "radixflow_aborted_requests_total")

    def drop_after(seed: int, chunks: int) -> None:
        body = {"prompt": _long_prompt(seed), "max_tokens": 400, "ignore_eos": True, "stream": True,
                "namespace": f"drop-{seed}"}
        with httpx.stream("POST", hybrid_server.url + URL, json=body, timeout=60) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            got = 0
            for line in lines:
                got += line.startswith("data: ")
                if got >= chunks:
                    break
        # leaving the block closes the connection mid-stream

    threads = [threading.Thread(target=drop_after, args=(s, 1 + s % 3)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    report = hybrid_server.wait_idle()
    assert report["integrity"] == "ok" and report["holds_nothing"], report
    assert _metric(hybrid_server, "radixflow_aborted_requests_total") - aborted0 == 6
    # still serving
    out = hybrid_server.client().completions.create(model="tiny-qwen3.5", prompt="still there?", max_tokens=2)
    assert out.usage.completion_tokens >= 1


def test_non_streaming_client_timeout_aborts_the_request(hybrid_server):
    aborted0 = _metric(hybrid_server, "radixflow_aborted_requests_total")
    body = {"prompt": _long_prompt(99), "max_tokens": 1500, "ignore_eos": True, "namespace": "timeout"}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(hybrid_server.url + URL, json=body, timeout=httpx.Timeout(60, read=1.0))
    report = hybrid_server.wait_idle()
    assert report["integrity"] == "ok" and report["holds_nothing"], report
    assert _metric(hybrid_server, "radixflow_aborted_requests_total") - aborted0 == 1


def test_clients_gone_with_branches_still_queued(hybrid_server):
    """4 requests x 8 branches on 16 rows: when their clients leave, some branches are running and
    some still waiting; all are removed and free what they hold."""
    aborted0 = _metric(hybrid_server, "radixflow_aborted_requests_total")

    def fire(seed: int) -> None:
        body = {"prompt": [_long_prompt(seed)] * 8, "max_tokens": 300, "ignore_eos": True,
                "namespace": f"queued-{seed}"}
        try:
            httpx.post(hybrid_server.url + URL, json=body, timeout=httpx.Timeout(60, read=0.5))
        except httpx.ReadTimeout:
            pass

    threads = [threading.Thread(target=fire, args=(s,)) for s in range(100, 104)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    report = hybrid_server.wait_idle()
    assert report["integrity"] == "ok" and report["holds_nothing"], report
    assert _metric(hybrid_server, "radixflow_aborted_requests_total") - aborted0 == 4
