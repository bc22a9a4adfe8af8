"""Servers for the HTTP tests: uvicorn in a thread on a free loopback port, driven over real HTTP.

`start_server(...)` returns a `LiveServer` with its base URL, an `openai` client factory and an
in-process handle on the engine loop (`cache()` runs the integrity checks on the engine thread).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from dataclasses import dataclass

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from radixflow.config import SchedulerConfig
from radixflow.engine.engine import EngineConfig
from radixflow.server.app import ServerConfig, cache_report
from radixflow.server.runner import DrainingServer, build_server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LiveServer:
    url: str
    server: DrainingServer
    thread: threading.Thread
    model: str

    @property
    def state(self):
        return self.server.state

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=CLIENT_KEY or "none", max_retries=0, **kw)

    def async_client(self, **kw) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=CLIENT_KEY or "none", max_retries=0, **kw)

    def post(self, path: str, **kw) -> httpx.Response:
        return httpx.post(self.url + path, timeout=60, **kw)

    def cache(self) -> dict:
        """Pool integrity and what branches hold, computed on the engine thread between rounds."""
        return self.state.loop.call(cache_report).result(timeout=60)

    def wait_idle(self, timeout: float = 30.0) -> dict:
        """Waits until no request is in flight (aborts are applied), then returns cache()."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.state.loop.in_flight == 0:
                report = self.cache()
                if report["in_flight_requests"] == 0:
                    return report
            time.sleep(0.02)
        raise AssertionError(f"server still busy after {timeout} s: {self.cache()}")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def start_server(model: str = "tiny-qwen3.5", *, block_size: int = 16, state_interval: int = 64,
                 max_num_seqs: int = 16, max_num_batched_tokens: int = 1024, max_model_len: int = 2048,
                 kv_cache_memory: int = 64 << 20, max_queue: int = 1024, policy: str = "radixflow",
                 snapshot_mode: str = "every-boundary", wait: bool = True, checkpoints: str = "boundary",
                 **server_kw) -> LiveServer:
    """`server_kw`: further ServerConfig fields (max_body_bytes, max_branches_per_request, ...).
    With RADIXFLOW_TEST_API_KEY set, the server requires that key unless `api_keys` is given."""
    server_kw.setdefault("api_keys", suite_keys())
    sched = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                            block_size=block_size, state_interval=state_interval, snapshot_mode=snapshot_mode,
                            checkpoints=checkpoints)
    engine = EngineConfig(model=model, policy=policy, scheduler=sched, kv_cache_memory=kv_cache_memory,
                          max_model_len=max_model_len)
    port = free_port()
    config = ServerConfig(engine=engine, port=port, max_queue=max_queue, debug_endpoints=True,
                          default_max_tokens=16, drain_timeout=10, torch_threads=1, **server_kw)
    server = build_server(config, log_level="warning")
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    live = LiveServer(f"http://127.0.0.1:{port}", server, thread, model)
    end = time.monotonic() + 120
    while not server.started:
        if not thread.is_alive() or time.monotonic() > end:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    if wait:
        assert server.state.loop.ready.wait(120), "model did not load"
    return live


def error_of(resp: httpx.Response) -> dict:
    body = resp.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """GET /metrics as {(sample name, frozenset of label items): value}."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return {(smp.name, frozenset(smp.labels.items())): smp.value
            for fam in text_string_to_metric_families(text) for smp in fam.samples}


def metric(samples: dict, name: str, **labels: str) -> float:
    """One sample of `scrape()`'s result; KeyError naming it if absent."""
    want = set(labels.items())
    hits = [v for (n, lab), v in samples.items() if n == name and want <= lab and len(lab) == len(want) + 1]
    if len(hits) != 1:
        raise KeyError(f"{name}{labels}: {len(hits)} samples")
    return hits[0]


# ---------------------------------------------------------------- the whole suite behind --api-key
# RADIXFLOW_TEST_API_KEY=k pytest tests/server: every server the suite starts requires k (in-process
# ones through start_server, `radixflow serve` processes through RADIXFLOW_API_KEY), and every
# client sends it: LiveServer's openai clients, and any httpx request that names no Authorization
# header (conftest.py patches httpx for the session). Tests of the key itself set CLIENT_KEY = None.
SUITE_KEY_VAR = "RADIXFLOW_TEST_API_KEY"
CLIENT_KEY: str | None = None  # what clients send when the test does not say


def suite_keys() -> tuple[str, ...]:
    key = os.environ.get(SUITE_KEY_VAR)
    return (key,) if key else ()


def auth_headers() -> dict[str, str]:
    """The Authorization header of the suite's key, for raw clients httpx's patch does not reach."""
    return {"Authorization": f"Bearer {CLIENT_KEY}"} if CLIENT_KEY else {}


def send_suite_key(mp, key: str) -> None:
    """Makes httpx (module functions, Client, AsyncClient) send `key` unless a request names its own."""
    mp.setattr(sys.modules[__name__], "CLIENT_KEY", key)
    for cls in (httpx.Client, httpx.AsyncClient):
        mp.setattr(cls, "send", _with_key(cls.send))


def _with_key(send):
    def patched(self, request, *args, **kwargs):
        if CLIENT_KEY and "authorization" not in request.headers:
            request.headers["Authorization"] = f"Bearer {CLIENT_KEY}"
        return send(self, request, *args, **kwargs)  # a coroutine for AsyncClient.send
    return patched
