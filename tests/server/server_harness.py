"""Servers for the HTTP tests: uvicorn in a thread on a loopback socket bound once, driven over real
HTTP.

`start_server(...)` returns a `LiveServer` with its base URL, an `openai` client factory and an
in-process handle on the engine loop, a `HeldLoop`: the server's own loop with a gate the test
holds, so a test decides when rounds run (`held(...)`) and waits on what the engine thread sees
(`when(...)`) instead of on the clock. `cache()` runs the integrity checks on the engine thread.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from radixflow.config import SchedulerConfig
from radixflow.engine.engine import Engine, EngineConfig
from radixflow.server.app import ServerConfig, cache_report
from radixflow.server.engine_loop import EngineLoop
from radixflow.server.runner import DrainingServer, build_server

_WAIT_S = 120  # how long a test waits for an event before it fails (a loaded machine loads a model slowly)


class HeldLoop(EngineLoop):
    """The server's engine loop with a gate the test holds; without a hold it runs unchanged.

    `hold(rounds)` lets the engine run `rounds` more rounds (with `until`: rounds until until(engine)
    is true between two rounds), then run none until `release()`. Meanwhile commands (adds, aborts,
    calls, the drain's failures) are still applied and the gauges refreshed, so clients can come,
    leave and be refused while every request in the engine stays where it is. `when(pred)` is an
    event the engine thread sets, between rounds, once pred(engine) is true.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.held = threading.Event()  # set while the engine is held (its gauges are up to date)
        self._rounds_left: int | None = None  # engine thread only: None = not held
        self._until: Callable[[Engine], bool] | None = None
        self._watches: list[tuple[Callable[[Engine], bool], threading.Event]] = []

    def hold(self, rounds: int = 0, until: Callable[[Engine], bool] | None = None) -> threading.Event:
        """Arms the gate (on the engine thread, between rounds); returns `held`, set once it holds."""
        def arm(engine: Engine) -> None:
            self.held.clear()
            self._rounds_left, self._until = (None, until) if until is not None else (rounds, None)

        self.call(arm).result(_WAIT_S)
        return self.held

    def release(self) -> None:
        def free(engine: Engine) -> None:
            self._rounds_left, self._until = None, None
            self.held.clear()

        self.call(free).result(_WAIT_S)

    def when(self, pred: Callable[[Engine], bool]) -> threading.Event:
        """An event set on the engine thread once pred(engine) is true (checked between rounds)."""
        done = threading.Event()
        self.call(lambda engine: self._watches.append((pred, done)))
        return done

    def _holding(self) -> bool:
        if self._until is not None and self._until(self.engine):
            self._rounds_left, self._until = 0, None
        return self._rounds_left == 0

    def _check_watches(self) -> None:
        if self._watches:
            fired = [(pred, ev) for pred, ev in self._watches if pred(self.engine)]
            self._watches = [w for w in self._watches if w not in fired]
            for _, ev in fired:
                ev.set()

    def _apply_commands(self, timeout: float | None) -> bool:
        while True:
            self._check_watches()  # between rounds, the gauges refreshed
            go_on = super()._apply_commands(timeout)
            if not (go_on and self._holding()):
                return go_on
            self._update_gauges()  # the loop refreshes them after commands; held, it does so here
            self.held.set()
            timeout = None  # held: wait for the next command, run no round

    def _after_round(self, batch, finished, blocked: int) -> None:
        super()._after_round(batch, finished, blocked)
        if self._rounds_left:
            self._rounds_left -= 1


@dataclass
class LiveServer:
    url: str
    server: DrainingServer
    thread: threading.Thread
    model: str

    @property
    def state(self):
        return self.server.state

    @property
    def loop(self) -> HeldLoop:
        return self.server.state.loop

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=CLIENT_KEY or "none", max_retries=0, **kw)

    def async_client(self, **kw) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=CLIENT_KEY or "none", max_retries=0, **kw)

    def post(self, path: str, **kw) -> httpx.Response:
        return httpx.post(self.url + path, timeout=60, **kw)

    def cache(self) -> dict:
        """Pool integrity and what branches hold, computed on the engine thread between rounds."""
        return self.loop.call(cache_report).result(timeout=60)

    def wait_idle(self, timeout: float = _WAIT_S) -> dict:
        """Waits until no request is in flight (aborts are applied), then returns cache()."""
        loop = self.loop
        idle = loop.when(lambda engine: loop.in_flight == 0 and not engine.requests)
        assert idle.wait(timeout), f"server still busy after {timeout} s: {self.cache()}"
        return self.cache()

    @contextmanager
    def held(self, rounds: int = 0, until: Callable[[Engine], bool] | None = None):
        """`HeldLoop.hold(rounds, until)` for the block, released at its end; yields the `held` event."""
        held = self.loop.hold(rounds, until)
        try:
            yield held
        finally:
            self.loop.release()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def start_server(model: str = "tiny-qwen3.5", *, block_size: int = 16, state_interval: int = 64,
                 max_num_seqs: int = 16, max_num_batched_tokens: int = 1024, max_model_len: int = 2048,
                 kv_cache_memory: int = 64 << 20, max_queue: int = 1024, policy: str = "radixflow",
                 snapshot_mode: str = "every-boundary", wait: bool = True, checkpoints: str = "boundary",
                 handoff: str | None = None, **server_kw) -> LiveServer:
    """`server_kw`: further ServerConfig fields (max_body_bytes, max_branches_per_request, ...).
    With RADIXFLOW_TEST_API_KEY set, the server requires that key unless `api_keys` is given."""
    server_kw.setdefault("api_keys", suite_keys())
    sched = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                            block_size=block_size, state_interval=state_interval, snapshot_mode=snapshot_mode,
                            checkpoints=checkpoints, **({} if handoff is None else {"handoff": handoff}))
    engine = EngineConfig(model=model, policy=policy, scheduler=sched, kv_cache_memory=kv_cache_memory,
                          max_model_len=max_model_len)
    # Bound and listening before uvicorn starts, and handed to it: no other process can take the port,
    # and a client may connect at once (the kernel queues it until uvicorn accepts).
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = ServerConfig(engine=engine, port=port, max_queue=max_queue, debug_endpoints=True,
                          default_max_tokens=16, drain_timeout=10, torch_threads=1, **server_kw)
    server = build_server(config, log_level="warning")
    state = server.state
    state.loop = HeldLoop(config.engine, state.metrics, config.max_queue, config.torch_threads)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    live = LiveServer(f"http://127.0.0.1:{port}", server, thread, model)
    if wait:
        assert state.loop.ready.wait(_WAIT_S), "model did not load"
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
