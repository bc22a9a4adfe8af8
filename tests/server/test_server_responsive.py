"""The event loop stays responsive while huge requests are tokenized and built (in a worker thread).

Measured through the loop two ways in the same run: the server's own loop-lag probe (a 20 ms sleep
that records how late it wakes, `radixflow_event_loop_lag_seconds`) and the latency of `/health`
requests sent while the big request is being processed, next to reference `/health` requests sent
just before on the same connection. The worker thread that builds the big request's inputs does
not return before `PROBES` `/health` calls have been answered since it began: that many land while
the request is processed, however fast the machine tokenizes.
"""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from server_harness import error_of, metric, scrape, start_server

from radixflow.engine.engine import Engine
from radixflow.engine.tokenizer import Tokenizer
from radixflow.server import routes

LIMIT_S = 0.1
PROBES = 5


@pytest.fixture(scope="module")
def roomy_server():
    """Room for 300k branches per request and 40k-token prompts (so a 500 kB prompt is tokenized)."""
    live = start_server("tiny-qwen3", max_branches_per_request=300_000, max_model_len=40_000,
                        kv_cache_memory=96 << 20)
    yield live
    live.stop()


def _probes(before, after, le: str) -> float:
    """Loop-lag probes between two scrapes that woke within `le` seconds ('+Inf': all)."""
    name = "radixflow_event_loop_lag_seconds_bucket"
    return metric(after, name, le=le) - metric(before, name, le=le)


def _health_while(live, body: dict, monkeypatch) -> tuple[httpx.Response, list[float], list[float]]:
    """Sends `body` to /v1/completions and polls /health until it is answered: (its response,
    reference latencies before it, latencies during it). Its inputs are built in the worker thread
    as always, which then waits until PROBES /health calls were answered since it began."""
    began, probed = threading.Event(), threading.Event()
    build = routes._completion_inputs

    def held_build(*args):
        began.set()
        try:
            return build(*args)
        finally:
            probed.wait(60)

    monkeypatch.setattr(routes, "_completion_inputs", held_build)
    result: dict = {}
    raw = json.dumps(body).encode()  # before the window: the client shares the server's process

    def health(probe: httpx.Client) -> float:
        r = probe.get("/health")
        assert r.status_code == 200
        return r.elapsed.total_seconds()

    with httpx.Client(base_url=live.url, timeout=60) as probe:
        reference = [health(probe) for _ in range(20)]
        big = threading.Thread(target=lambda: result.update(r=httpx.post(
            live.url + "/v1/completions", content=raw, headers={"content-type": "application/json"}, timeout=300)))
        big.start()
        during = []
        since_began = 0
        while big.is_alive():
            during.append(health(probe))
            since_began += began.is_set()
            if since_began >= PROBES:
                probed.set()
        big.join()
    assert began.is_set() and since_began >= PROBES, (began.is_set(), since_began)
    return result["r"], reference, during


@pytest.mark.parametrize("body, fragment", [
    # 5M characters cannot fit 40k tokens of at most 13 characters each: refused before tokenizing
    ({"prompt": "a" * 5_000_000, "max_tokens": 1}, "(5000000 characters) is longer than max_model_len 40000"),
    # 500k characters could: tokenized (about a second of the Rust tokenizer, GIL released), then refused
    ({"prompt": "a" * 500_000, "max_tokens": 1}, "the prompt is 500000 tokens, more than max_model_len 40000"),
    # 200k prompts parsed, tokenized and checked before the empty last one refuses the request
    ({"prompt": ["ab"] * 199_999 + [""], "max_tokens": 1}, "prompt 199999 is empty"),
], ids=["5MB-prompt", "500kB-prompt", "200k-prompts"])
def test_health_answers_within_100ms_while_a_huge_request_is_processed(roomy_server, body, fragment, monkeypatch):
    _assert_responsive(roomy_server, body, fragment, monkeypatch)


def test_a_200k_prompt_list_over_the_default_cap_is_refused_and_the_loop_stays_responsive(hybrid_server,
                                                                                          monkeypatch):
    _assert_responsive(hybrid_server, {"prompt": ["ab"] * 200_000, "max_tokens": 1},
                       "200000 prompt(s) x n=1 = 200000 sequences; the server allows at most 1024", monkeypatch)


def test_tokenizing_and_building_run_off_the_event_loop(hybrid_server, monkeypatch):
    threads = {}
    real_encode, real_make = Tokenizer.encode_batch, Engine.make_branch

    def encode(self, *args, **kw):
        threads["encode"] = threading.current_thread().name
        return real_encode(self, *args, **kw)

    def make(self, *args, **kw):
        threads["make_branch"] = threading.current_thread().name
        return real_make(self, *args, **kw)

    monkeypatch.setattr(Tokenizer, "encode_batch", encode)
    monkeypatch.setattr(Engine, "make_branch", make)
    r = hybrid_server.post("/v1/completions", json={"prompt": ["one", "two"], "max_tokens": 1})
    assert r.status_code == 200
    r = hybrid_server.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                         "max_tokens": 1})
    assert r.status_code == 200
    loop_thread = hybrid_server.thread.name  # uvicorn's event loop runs in the harness thread
    assert set(threads) == {"encode", "make_branch"}
    assert all(name != loop_thread for name in threads.values()), threads


def _assert_responsive(live, body: dict, fragment: str, monkeypatch) -> None:
    before = scrape(live.url)
    r, reference, during = _health_while(live, body, monkeypatch)
    after = scrape(live.url)
    assert r.status_code == 400 and fragment in error_of(r)["message"]
    probes = _probes(before, after, "+Inf")
    late = probes - _probes(before, after, str(LIMIT_S))
    very_late = probes - _probes(before, after, "0.25")
    print(f"\n{len(during)} /health calls during: median {sorted(during)[len(during) // 2] * 1e3:.1f} ms, "
          f"max {max(during) * 1e3:.1f} ms; reference (before) median {sorted(reference)[10] * 1e3:.1f} ms, max "
          f"{max(reference) * 1e3:.1f} ms; {probes:.0f} loop probes, {late:.0f} later than {LIMIT_S} s")
    # Before the fix one request stalled the loop for 9-13 s: every probe and /health call meanwhile
    # was seconds late. What stays on the loop is FastAPI's JSON parse (~25-50 ms of GIL for these
    # bodies); the rest of the time the loop waits at most a GIL switch interval (5 ms) per step.
    # The machine is shared (load average ~10 on 2 cores), so an OS scheduling delay can push a
    # rare call past 100 ms: 90% of the /health calls must answer within 100 ms and all within
    # 250 ms; at most two probes (or 5%) may wake more than 100 ms late, none 250 ms.
    p90 = sorted(during)[int(0.9 * (len(during) - 1))]
    assert p90 < LIMIT_S and max(during) < 0.25, (p90, max(during), max(reference))
    assert very_late == 0 and late <= max(2.0, 0.05 * probes), (probes, late, very_late)
