"""Bad input, unknown models, overload and unavailability over raw HTTP: status and message each."""

from __future__ import annotations

import threading

import httpx
import pytest
from server_harness import error_of, metric, scrape, start_server

from radixflow.server import engine_loop

URL = "/v1/completions"


def _post(live, body, path=URL, **kw):
    return live.post(path, json=body, **kw)


@pytest.mark.parametrize("raw, fragment", [
    (b'{"prompt": "a", ', "malformed JSON body"),
    (b"not json at all", "malformed JSON body"),
    (b"", "request body is required"),
])
def test_malformed_json(hybrid_server, raw, fragment):
    r = hybrid_server.post(URL, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400
    err = error_of(r)
    assert fragment in err["message"] and err["type"] == "invalid_request_error"


@pytest.mark.parametrize("body, param, fragment", [
    ({"prompt": 5}, "prompt", "prompt must be a string, a list of strings"),
    ({"prompt": [1, "a"]}, "prompt", "prompt must be a string"),
    ({"prompt": [[]]}, "prompt", "prompt must be a string"),
    ({"prompt": "a", "max_tokens": "many"}, "max_tokens", "valid integer"),
    ({"prompt": "a", "stream": "yes please"}, "stream", "valid boolean"),
    ({"prompt": "a", "stop": 3}, "stop", "valid string"),
    ({}, "prompt", "Field required"),
    ({"prompt": "a", "temperature": -0.5}, "temperature", "greater than or equal to 0"),
    ({"prompt": "a", "temperature": 2.5}, "temperature", "less than or equal to 2"),
    ({"prompt": "a", "top_p": 0}, "top_p", "greater than 0"),
    ({"prompt": "a", "top_p": 1.5}, "top_p", "less than or equal to 1"),
    ({"prompt": "a", "top_k": -2}, "top_k", "greater than or equal to -1"),
    ({"prompt": "a", "max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
    ({"prompt": "a", "logprobs": 21}, "logprobs", "less than or equal to 20"),
    ({"prompt": "a", "n": 0}, "n", "greater than or equal to 1"),
])
def test_wrong_types_and_out_of_range_values(hybrid_server, body, param, fragment):
    r = _post(hybrid_server, body)
    assert r.status_code == 400, r.text
    err = error_of(r)
    assert err["param"] == param and fragment in err["message"], err


@pytest.mark.parametrize("body, param, fragment", [
    ({"prompt": ""}, "prompt", "prompt is empty"),
    ({"prompt": []}, "prompt", "prompt must not be empty"),
    ({"prompt": ["ok", ""]}, "prompt", "prompt 1 is empty"),
    ({"prompt": [1, 2, 512]}, "prompt", "token id 512 is outside the vocabulary [0, 512)"),
    ({"prompt": [-1]}, "prompt", "token id -1 is outside the vocabulary"),
    ({"prompt": "a" * 2000, "max_tokens": 100}, "max_tokens", "exceeds max_model_len 2048"),
])
def test_prompts_the_engine_refuses(hybrid_server, body, param, fragment):
    r = _post(hybrid_server, body)
    assert r.status_code == 400, r.text
    err = error_of(r)
    assert err["param"] == param and fragment in err["message"], err


def test_chat_errors(hybrid_server):
    r = _post(hybrid_server, {"messages": []}, "/v1/chat/completions")
    assert r.status_code == 400 and error_of(r)["param"] == "messages"
    r = _post(hybrid_server, {"messages": [{"role": "wizard", "content": "x"}]}, "/v1/chat/completions")
    assert r.status_code == 400 and "messages.0.role" in error_of(r)["message"]
    r = _post(hybrid_server, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 5000},
              "/v1/chat/completions")
    assert r.status_code == 400 and "max_model_len" in error_of(r)["message"]


def test_unknown_model_and_route(hybrid_server):
    r = _post(hybrid_server, {"model": "gpt-9", "prompt": "a"})
    assert r.status_code == 404
    err = error_of(r)
    assert err["code"] == "model_not_found" and "gpt-9" in err["message"] and "tiny-qwen3.5" in err["message"]
    r = _post(hybrid_server, {"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]},
              "/v1/chat/completions")
    assert r.status_code == 404
    r = httpx.get(hybrid_server.url + "/v1/nothing", timeout=10)
    assert r.status_code == 404 and error_of(r)["message"] == "Not Found"


def test_draining_refuses_new_requests(hybrid_server):
    loop = hybrid_server.state.loop
    loop.draining = True
    try:
        r = _post(hybrid_server, {"prompt": "a"})
        assert r.status_code == 503 and error_of(r)["code"] == "draining"
        assert httpx.get(hybrid_server.url + "/health", timeout=10).status_code == 503
    finally:
        loop.draining = False
    assert _post(hybrid_server, {"prompt": "a", "max_tokens": 1}).status_code == 200


def test_503_while_loading(monkeypatch):
    gate = threading.Event()
    real = engine_loop.Engine

    def slow_engine(config):
        gate.wait(60)
        return real(config)

    monkeypatch.setattr(engine_loop, "Engine", slow_engine)
    live = start_server("tiny-qwen3", wait=False)
    try:
        r = httpx.get(live.url + "/health", timeout=10)
        assert r.status_code == 503 and error_of(r)["code"] == "loading"
        r = _post(live, {"prompt": "a"})
        assert r.status_code == 503 and "still loading" in error_of(r)["message"]
        gate.set()
        assert live.state.loop.ready.wait(60)
        assert _post(live, {"prompt": "a", "max_tokens": 1}).status_code == 200
    finally:
        gate.set()
        live.stop()


def test_429_when_the_admission_queue_is_full():
    live = start_server("tiny-qwen3", max_num_seqs=1, max_queue=1)
    try:
        loop = live.loop
        long = {"prompt": "hold the only row", "max_tokens": 1500, "ignore_eos": True, "stream": True}
        # A's first round runs, then the engine holds: A keeps the only row while B and C arrive
        with live.held(rounds=1) as held, httpx.stream("POST", live.url + URL, json=long, timeout=60):
            assert held.wait(60)  # A is running: it holds the only row
            result = {}
            waiter = threading.Thread(target=lambda: result.update(r=_post(live, {"prompt": "b", "max_tokens": 2})))
            waiter.start()  # B waits for a row: the queue (1) is now full
            assert loop.when(lambda engine: len(engine.requests) == 2).wait(60)
            assert loop.pending == 1
            r = _post(live, {"prompt": "c", "max_tokens": 2})
            assert r.status_code == 429
            err = error_of(r)
            assert err["code"] == "queue_full" and "admission queue is full (1 requests" in err["message"]
        # A's client went away: A is aborted, B gets the row and completes.
        waiter.join(60)
        assert result["r"].status_code == 200
        report = live.wait_idle()
        assert report["integrity"] == "ok" and report["holds_nothing"]
    finally:
        live.stop()


def test_errors_are_counted_in_metrics(hybrid_server):
    _post(hybrid_server, {"prompt": "a", "temperature": -1})
    httpx.get(hybrid_server.url + "/no/such/path", timeout=10)
    samples = scrape(hybrid_server.url)
    assert metric(samples, "radixflow_requests_total", endpoint="/v1/completions", status="400") >= 1
    assert metric(samples, "radixflow_requests_total", endpoint="unmatched", status="404") >= 1


def _inject_step_failure(live) -> None:
    def install(eng):
        real = eng.step

        def boom(now=None):
            eng.step = real  # fail once
            raise RuntimeError("injected failure")

        eng.step = boom

    live.state.loop.call(install).result(timeout=30)


def test_engine_error_fails_the_request_and_the_server_keeps_serving(hybrid_server):
    _inject_step_failure(hybrid_server)
    r = _post(hybrid_server, {"prompt": "x", "max_tokens": 2})
    assert r.status_code == 500
    err = error_of(r)
    assert err["code"] == "engine_error" and "injected failure" in err["message"]
    _inject_step_failure(hybrid_server)
    with httpx.stream("POST", hybrid_server.url + URL, json={"prompt": "x", "stream": True}, timeout=60) as s:
        assert s.status_code == 200  # the stream had started: the error arrives as an event
        lines = [line for line in s.iter_lines() if line.startswith("data: ")]
    assert "injected failure" in lines[0] and lines[-1] == "data: [DONE]"
    report = hybrid_server.wait_idle()
    assert report["integrity"] == "ok" and report["holds_nothing"]
    assert _post(hybrid_server, {"prompt": "a", "max_tokens": 1}).status_code == 200
