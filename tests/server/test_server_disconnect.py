"""Clients that go away: streams dropped mid-way and non-streaming calls whose client closes the
connection (as a client-side timeout does) are aborted on the engine thread, free their pages and
snapshots, and the server keeps serving.

Each test holds the engine (`LiveServer.held`) while its clients leave: the requests are known to be
running, or queued, when the connection closes, however fast the machine generates."""

from __future__ import annotations

import http.client
import json
import random
import threading
from urllib.parse import urlsplit

import httpx

URL = "/v1/completions"


def _metric(live, name: str) -> float:
    body = httpx.get(live.url + "/metrics", timeout=10).text
    return next(float(line.split()[-1]) for line in body.splitlines() if line.startswith(name))


def _long_prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(150)]  # crosses two snapshot boundaries (64, 128)


def _send(live, body: dict) -> http.client.HTTPConnection:
    """Sends a non-streaming request and leaves its answer unread: closing the connection is the
    client going away."""
    url = urlsplit(live.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    conn.request("POST", URL, json.dumps(body), {"content-type": "application/json"})
    return conn


def _tokens_at_least(rids: list[str], n: int):
    """Between rounds: every branch of the requests `rids` has at least `n` output tokens."""
    def check(engine) -> bool:
        reqs = [engine.requests.get(r) for r in rids]
        return all(q is not None and all(len(b.output) >= n for b in q.branches) for q in reqs)
    return check


def test_streams_dropped_mid_way_leave_nothing_held(hybrid_server):
    aborted0 = _metric(hybrid_server, "radixflow_aborted_requests_total")
    loop = hybrid_server.loop
    seeds = range(6)
    rids = [f"cmpl-drop-{s}" for s in seeds]
    read = {s: threading.Event() for s in seeds}
    leave = threading.Event()

    def drop_after(seed: int, chunks: int) -> None:
        # return_token_ids: every token is an event, whatever text it decodes to
        body = {"prompt": _long_prompt(seed), "max_tokens": 400, "ignore_eos": True, "stream": True,
                "namespace": f"drop-{seed}", "request_id": f"drop-{seed}", "return_token_ids": True}
        with httpx.stream("POST", hybrid_server.url + URL, json=body, timeout=60) as r:
            assert r.status_code == 200
            lines = r.iter_lines()  # kept: dropping the iterator would close the connection now
            got = 0
            while got < chunks:
                got += next(lines).startswith("data: ")
            read[seed].set()
            leave.wait(60)
        # leaving the block closes the connection mid-stream

    threads = [threading.Thread(target=drop_after, args=(s, 1 + s % 3)) for s in seeds]
    with hybrid_server.held() as held:  # no round runs until all six are in the engine
        for t in threads:
            t.start()
        assert loop.when(lambda engine: all(r in engine.requests for r in rids)).wait(60)
        # then rounds run until every branch has 3 tokens (each client reads 1-3), and stop there
        loop.hold(until=_tokens_at_least(rids, 3))
        assert held.wait(60)
        assert all(ev.wait(60) for ev in read.values())
        leave.set()
        for t in threads:
            t.join(120)
        report = hybrid_server.wait_idle()  # the aborts are applied while no round runs
    assert report["integrity"] == "ok" and report["holds_nothing"], report
    assert _metric(hybrid_server, "radixflow_aborted_requests_total") - aborted0 == 6
    # still serving
    out = hybrid_server.client().completions.create(model="tiny-qwen3.5", prompt="still there?", max_tokens=2)
    assert out.usage.completion_tokens >= 1


def test_a_non_streaming_client_that_leaves_aborts_the_request(hybrid_server):
    aborted0 = _metric(hybrid_server, "radixflow_aborted_requests_total")
    body = {"prompt": _long_prompt(99), "max_tokens": 1500, "ignore_eos": True, "namespace": "timeout"}
    with hybrid_server.held(rounds=1) as held:  # its prefill runs, then the engine holds it
        conn = _send(hybrid_server, body)
        assert held.wait(60)
        running = hybrid_server.cache()
        assert running["running"] == 1 and not running["holds_nothing"], running
        conn.close()
        report = hybrid_server.wait_idle()
    assert report["integrity"] == "ok" and report["holds_nothing"], report
    assert _metric(hybrid_server, "radixflow_aborted_requests_total") - aborted0 == 1


def test_clients_gone_with_branches_still_queued(hybrid_server):
    """4 requests x 8 branches on 16 rows: when their clients leave, some branches are running and
    some still waiting; all are removed and free what they hold."""
    aborted0 = _metric(hybrid_server, "radixflow_aborted_requests_total")
    loop = hybrid_server.loop
    seeds = range(100, 104)
    rids = [f"cmpl-queued-{s}" for s in seeds]
    with hybrid_server.held() as held:  # all four are in the engine before a round runs
        conns = [_send(hybrid_server, {"prompt": [_long_prompt(s)] * 8, "max_tokens": 300, "ignore_eos": True,
                                       "namespace": f"queued-{s}", "request_id": f"queued-{s}"}) for s in seeds]
        assert loop.when(lambda engine: all(r in engine.requests for r in rids)).wait(60)
        loop.hold(rounds=3)
        assert held.wait(60)
        queued = hybrid_server.cache()
        assert queued["running"] >= 1 and queued["held"] + queued["waiting"] >= 16, queued  # 32 branches, 16 rows
        for conn in conns:
            conn.close()
        report = hybrid_server.wait_idle()
    assert report["integrity"] == "ok" and report["holds_nothing"], report
    assert _metric(hybrid_server, "radixflow_aborted_requests_total") - aborted0 == 4
