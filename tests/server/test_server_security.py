"""API keys, CORS and what the logs may say, on in-process servers over real HTTP (docs/server.md
"Security"). Tests here say which key each request sends: the suite-wide key is switched off."""

from __future__ import annotations

import http.client
import json
import logging

import httpx
import openai
import pytest
import server_harness
from server_harness import error_of, metric, scrape, start_server

from radixflow.server import logs, routes

KEYS = ("key-one", "key-two")
MARKER = "zq7SECRETMARKERpx"
_GUARDED = [("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2}),
            ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
            ("GET", "/v1/models", None), ("GET", "/v1/models/tiny-qwen3", None), ("GET", "/debug/cache", None),
            ("POST", "/tokenize", {"prompt": "hi"}), ("POST", "/detokenize", {"tokens": [1, 2]}),
            ("GET", "/openapi.json", None)]


@pytest.fixture(autouse=True)
def _own_keys(monkeypatch):
    monkeypatch.setattr(server_harness, "CLIENT_KEY", None)


@pytest.fixture(scope="module")
def keyed():
    live = start_server("tiny-qwen3", block_size=1, state_interval=1, api_keys=KEYS,
                        allowed_origins=("https://good.example",))
    yield live
    live.stop()


def _call(live, method: str, path: str, body, headers: dict | None = None) -> httpx.Response:
    return httpx.request(method, live.url + path, json=body, headers=headers, timeout=60)


def _bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize("method, path, body", _GUARDED, ids=[p for _, p, _ in _GUARDED])
def test_every_guarded_route_refuses_a_missing_or_wrong_key_alike(keyed, method, path, body):
    refusals = [_call(keyed, method, path, body),  # no header
                _call(keyed, method, path, body, _bearer("key-three")),  # a wrong key
                _call(keyed, method, path, body, _bearer("key-on")),  # a prefix of a right one
                _call(keyed, method, path, body, {"Authorization": "Basic key-one"}),  # not Bearer
                _call(keyed, method, path, body, {"Authorization": "key-one"})]
    for r in refusals:
        assert r.status_code == 401, (r.status_code, r.text)
        assert r.headers["www-authenticate"] == "Bearer"
        err = error_of(r)
        assert err["type"] == "authentication_error" and err["code"] == "invalid_api_key"
    assert len({r.content for r in refusals}) == 1  # no hint which part was wrong
    assert "key-one" not in refusals[0].text
    for key in KEYS:
        r = _call(keyed, method, path, body, _bearer(key))
        assert r.status_code == 200, (r.status_code, r.text)


def test_an_unknown_path_needs_the_key_before_it_is_a_404(keyed):
    assert _call(keyed, "GET", "/v1/nothing", None).status_code == 401
    assert _call(keyed, "GET", "/v1/nothing", None, _bearer("key-two")).status_code == 404


def test_health_version_and_metrics_stay_open(keyed):
    for path in ("/health", "/version", "/metrics"):
        assert httpx.get(keyed.url + path, timeout=10).status_code == 200, path


def test_refusals_are_counted_and_the_body_is_never_read(keyed):
    before = scrape(keyed.url)
    # 1 GiB declared, 1 KiB sent: a keyless client gets its 401 at once (not a 413, not a wait for
    # the body): the key is checked before anything is read
    conn = http.client.HTTPConnection("127.0.0.1", int(keyed.url.rsplit(":", 1)[1]), timeout=60)
    try:
        conn.putrequest("POST", "/v1/completions")
        conn.putheader("content-type", "application/json")
        conn.putheader("content-length", str(1 << 30))
        conn.endheaders(b"x" * 1024)
        r = conn.getresponse()
        assert r.status == 401 and json.loads(r.read())["error"]["type"] == "authentication_error"
    finally:
        conn.close()
    after = scrape(keyed.url)
    key = dict(endpoint="/v1/completions", status="401")
    old = metric(before, "radixflow_requests_total", **key) if any(
        n == "radixflow_requests_total" and ("status", "401") in lab and ("endpoint", "/v1/completions") in lab
        for n, lab in before) else 0.0
    assert metric(after, "radixflow_requests_total", **key) == old + 1


def test_the_openai_client_with_and_without_the_key(keyed):
    def client(key):
        return openai.OpenAI(base_url=keyed.url + "/v1", api_key=key, max_retries=0)

    bad = client("not-a-key")
    calls = [lambda c: c.completions.create(model=keyed.model, prompt="hi", max_tokens=2),
             lambda c: list(c.completions.create(model=keyed.model, prompt="hi", max_tokens=2, stream=True)),
             lambda c: c.chat.completions.create(model=keyed.model, max_tokens=2,
                                                 messages=[{"role": "user", "content": "hi"}]),
             lambda c: list(c.chat.completions.create(model=keyed.model, max_tokens=2, stream=True,
                                                      messages=[{"role": "user", "content": "hi"}])),
             lambda c: c.models.list(), lambda c: c.models.retrieve(keyed.model)]
    for call in calls:
        with pytest.raises(openai.AuthenticationError) as e:
            call(bad)
        assert e.value.status_code == 401 and e.value.body["type"] == "authentication_error"
    good = client("key-two")
    assert good.completions.create(model=keyed.model, prompt="hi", max_tokens=2).usage.completion_tokens == 2
    chunks = list(good.completions.create(model=keyed.model, prompt="hi", max_tokens=3, stream=True,
                                          stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert chunks[-1].usage.completion_tokens == 3
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    chat = list(good.chat.completions.create(model=keyed.model, max_tokens=2, stream=True,
                                             messages=[{"role": "user", "content": "hi"}]))
    assert chat[0].choices[0].delta.role == "assistant"
    assert [m.id for m in good.models.list().data] == [keyed.model]
    assert good.models.retrieve(keyed.model).id == keyed.model


def test_metrics_can_be_protected_too():
    live = start_server("tiny-qwen3", block_size=1, state_interval=1, api_keys=("m-key",), protect_metrics=True)
    try:
        assert httpx.get(live.url + "/metrics", timeout=10).status_code == 401
        assert httpx.get(live.url + "/metrics", headers=_bearer("m-key"), timeout=10).status_code == 200
        assert httpx.get(live.url + "/health", timeout=10).status_code == 200
    finally:
        live.stop()


# ---------------------------------------------------------------- CORS
def _preflight(live, origin: str) -> httpx.Response:
    return httpx.options(live.url + "/v1/completions", timeout=10, headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})


def test_cors_preflight_answers_only_allowed_origins(keyed):
    good = _preflight(keyed, "https://good.example")  # no key: a browser's preflight never carries one
    assert good.status_code == 200
    assert good.headers["access-control-allow-origin"] == "https://good.example"
    assert "POST" in good.headers["access-control-allow-methods"]
    bad = _preflight(keyed, "https://evil.example")
    assert "access-control-allow-origin" not in bad.headers
    # a browser can read the 401 of an allowed origin, and no other's
    r = httpx.post(keyed.url + "/v1/completions", json={"prompt": "x"}, headers={"Origin": "https://good.example"})
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == "https://good.example"
    r = httpx.post(keyed.url + "/v1/completions", json={"prompt": "x"}, headers={"Origin": "https://evil.example"})
    assert r.status_code == 401 and "access-control-allow-origin" not in r.headers


def test_without_allowed_origins_no_origin_is_allowed(dense_server):
    r = _preflight(dense_server, "https://good.example")
    assert "access-control-allow-origin" not in r.headers
    r = httpx.get(dense_server.url + "/health", headers={"Origin": "https://good.example"}, timeout=10)
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_a_star_allows_every_origin():
    live = start_server("tiny-qwen3", block_size=1, state_interval=1, api_keys=(), allowed_origins=("*",))
    try:
        r = _preflight(live, "https://anyone.example")
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"
    finally:
        live.stop()


# ---------------------------------------------------------------- logs
def test_a_bug_logs_its_traceback_without_the_request_text(keyed, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise KeyError(f"the prompt was {MARKER}")

    caplog.set_level(logging.INFO)
    monkeypatch.setattr(routes, "usage", broken)
    r = httpx.post(keyed.url + "/v1/completions", json={"prompt": MARKER, "max_tokens": 1},
                   headers=_bearer("key-one"), timeout=60)
    assert r.status_code == 500 and MARKER not in r.text
    monkeypatch.setattr(routes, "finish_reason", broken)  # a stream's rendering breaks: its error path
    with httpx.stream("POST", keyed.url + "/v1/completions", headers=_bearer("key-one"), timeout=60,
                      json={"prompt": MARKER, "max_tokens": 1, "stream": True}) as s:
        events = [line for line in s.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and "internal_error" in events[-2]
    text = caplog.text
    assert "unhandled error in POST /v1/completions" in text and "rendering a stream chunk failed" in text
    assert text.count("KeyError: <message withheld") >= 2  # the type and the frames stay
    assert "in broken" in text
    assert MARKER not in text


def test_log_requests_shows_the_text_cut_to_max_log_len(caplog):
    caplog.set_level(logging.INFO, logger="radixflow.server")
    live = start_server("tiny-qwen3", block_size=1, state_interval=1, api_keys=(), log_requests=True,
                        max_log_len=60)
    try:
        prompt = f"{MARKER} {'x' * 80} TAILEND"
        r = live.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2, "echo": True})
        assert r.status_code == 200
        r = live.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": MARKER}],
                                                     "max_tokens": 2})
        assert r.status_code == 200
        r = live.post("/v1/completions", json={"prompt": "STREAMED" + prompt, "max_tokens": 2, "echo": True,
                                               "stream": True})
        assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
    finally:
        live.stop()
        logs.install(reveal=False)  # the filter is per process: back to what the other servers use
    text = caplog.text
    assert text.count(MARKER) >= 3  # the prompt, the echoed output, the chat prompt
    outputs = [line for line in text.splitlines() if " output: " in line and "STREAMED" in line]
    assert len(outputs) == 1 and MARKER in outputs[0]  # a stream's output, gathered from its chunks
    assert "TAILEND" not in text and "characters)" in text


def test_the_redact_filter_withholds_messages_and_query_strings():
    f = logs.Redact()
    try:
        raise ValueError(f"bad {MARKER}") from KeyError(MARKER)
    except ValueError as e:
        exc = e
    record = logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, "Exception in ASGI application",
                               None, (type(exc), exc, exc.__traceback__))
    assert f.filter(record)
    text = logging.Formatter().format(record)
    assert MARKER not in text and "builtins.KeyError: <message withheld" in text
    assert "builtins.ValueError: <message withheld" in text and "led to the following" in text
    access = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:1", "GET", f"/v1/models?q={MARKER}", "1.1", 200), None)
    f.filter(access)
    assert access.getMessage() == '127.0.0.1:1 - "GET /v1/models?… HTTP/1.1" 200'
    shown = logs.Redact(reveal=True)
    record.exc_text = None
    shown.filter(record)
    assert MARKER in logging.Formatter().format(record)  # --log-requests keeps the messages


def test_behind_a_prefix_stripping_proxy_root_path_keeps_the_open_and_the_guarded_paths():
    live = start_server("tiny-qwen3", block_size=1, state_interval=1, api_keys=("p-key",), root_path="/llm")
    try:
        # the proxy forwarded /llm/health as /health; uvicorn puts the prefix back in scope["path"]
        assert httpx.get(live.url + "/health", timeout=10).status_code == 200
        assert httpx.get(live.url + "/v1/models", timeout=10).status_code == 401
        r = httpx.get(live.url + "/v1/models", headers=_bearer("p-key"), timeout=10)
        assert r.status_code == 200 and r.json()["data"][0]["id"] == "tiny-qwen3"
        spec = httpx.get(live.url + "/openapi.json", headers=_bearer("p-key"), timeout=10).json()
        assert spec["servers"] == [{"url": "/llm"}]  # FastAPI's links carry the prefix
    finally:
        live.stop()


def test_the_session_servers_follow_the_suite_key(hybrid_server, suite_api_key):
    """RADIXFLOW_TEST_API_KEY runs the whole suite behind a key: then a keyless request is refused."""
    r = httpx.get(hybrid_server.url + "/v1/models", timeout=10)  # no header: CLIENT_KEY is off here
    assert r.status_code == (401 if suite_api_key else 200)
    assert hybrid_server.state.config.api_keys == ((suite_api_key,) if suite_api_key else ())
