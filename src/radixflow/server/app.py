"""The FastAPI application: server config, shared state, and the small endpoints.

`create_app(config)` builds an app whose lifespan starts the engine thread (the model loads there;
every endpoint answers 503 until it is ready) and a loop-lag probe, and stops both on shutdown. The
generation endpoints live in `routes.py`, the tokenizer endpoints in `tokenize.py`; every request
passes `GuardMiddleware` (body cap, JSON 500s).
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from radixflow import __version__
from radixflow.engine.engine import Engine, EngineConfig
from radixflow.server.engine_loop import EngineLoop, pool_use
from radixflow.server.errors import APIError, install_handlers
from radixflow.server.guard import GuardMiddleware
from radixflow.server.metrics import ServerMetrics
from radixflow.server.routes import router
from radixflow.server.tokenize import router as tokenize_router

_LAG_PROBE_S = 0.02  # the loop-lag probe sleeps this long, then records how late it woke


@dataclass
class ServerConfig:
    engine: EngineConfig = field(default_factory=EngineConfig)
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None  # default: the --model argument
    max_queue: int = 1024  # requests accepted but not yet started; more get 429
    default_max_tokens: int = 256  # chat completions without max_tokens
    drain_timeout: float = 60.0  # SIGTERM: seconds to let in-flight requests finish
    debug_endpoints: bool = False  # GET /debug/cache (integrity checks; tests)
    torch_threads: int | None = None  # intra-op threads of the engine thread (default: torch's)
    max_body_bytes: int = 64 << 20  # larger request bodies get 413
    max_branches_per_request: int = 1024  # prompts x n of one request; more get 400


class ServerState:
    """What the handlers share: config, engine loop, metrics."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        sc = config.engine.scheduler
        self.model_name = config.served_model_name or config.engine.model
        self.metrics = ServerMetrics(sc.max_num_seqs, sc.max_num_batched_tokens, self.model_name)
        self.loop = EngineLoop(config.engine, self.metrics, config.max_queue, config.torch_threads)
        self.created = int(time.time())

    def engine_for(self, model: str | None) -> Engine:
        """The engine if `model` names it (or is omitted); 503 while loading/draining, 404 otherwise."""
        eng = self.loop.check_available()
        if model is not None and model not in (self.model_name, self.config.engine.model):
            raise APIError(404, f"the model '{model}' does not exist; this server serves '{self.model_name}'",
                           "model", "model_not_found")
        return eng


def create_app(config: ServerConfig) -> FastAPI:
    state = ServerState(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.loop.start()
        probe = asyncio.create_task(_probe_loop_lag(state.metrics))
        yield
        probe.cancel()
        await asyncio.to_thread(state.loop.stop)

    def count(endpoint: str, status: str) -> None:
        state.metrics.requests.labels(endpoint, status).inc()

    app = FastAPI(title="radixflow", lifespan=lifespan)
    app.state.server = state
    install_handlers(app, count)
    app.include_router(router)
    app.include_router(tokenize_router)
    app.add_middleware(GuardMiddleware, max_body_bytes=config.max_body_bytes, count=count,
                       endpoint=lambda scope: _endpoint(app, scope))

    @app.get("/health")
    async def health() -> JSONResponse:
        state.loop.check_available()
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        card = {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "radixflow",
                "root": config.engine.model, "max_model_len": config.engine.max_model_len}
        return JSONResponse({"object": "list", "data": [card]})

    @app.get("/version")
    async def version() -> JSONResponse:
        return JSONResponse({"version": __version__})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    if config.debug_endpoints:
        @app.get("/debug/cache")
        async def debug_cache(request: Request) -> JSONResponse:
            state.loop.check_available()
            return JSONResponse(await asyncio.wrap_future(state.loop.call(cache_report)))

    return app


def _endpoint(app: FastAPI, scope: dict) -> str:
    """The metrics label of a request: its route's path, or 'unmatched' (never the raw path: a
    client must not be able to mint label values)."""
    route = scope.get("route")
    if route is not None:
        return route.path
    paths = getattr(app.state, "paths", None)
    if paths is None:  # built on first use, once every route is declared
        paths = {r.path for rt in (app.router, router, tokenize_router) for r in rt.routes if hasattr(r, "path")}
        app.state.paths = paths
    return scope["path"] if scope.get("path") in paths else "unmatched"


async def _probe_loop_lag(metrics: ServerMetrics) -> None:
    """Sleeps briefly, over and over, and records how late each wake-up is: the loop's own view of
    whether something (a handler doing CPU work) keeps it from answering."""
    loop = asyncio.get_running_loop()
    while True:
        t0 = loop.time()
        await asyncio.sleep(_LAG_PROBE_S)
        metrics.loop_lag.observe(max(0.0, loop.time() - t0 - _LAG_PROBE_S))


def cache_report(engine: Engine) -> dict:
    """Integrity of the pools and what is held beyond the cache (runs on the engine thread)."""
    sc = engine.scheduler
    try:
        sc.check_integrity()
        integrity = "ok"
    except AssertionError as e:
        integrity = f"violated: {e}"
    pages, slots = pool_use(sc)
    return {"integrity": integrity, "holds_nothing": sc.holds_nothing(), "rounds": sc.round,
            "blocked_total": sc.blocked_total, "held": len(sc.held), "waiting": len(sc.waiting),
            "running": len(sc.running), "in_flight_requests": len(engine.requests),
            "kv_pages": vars(pages), "state_slots": vars(slots), "snapshots": sc.index.num_snapshots,
            "snapshot_mode": sc.config.snapshot_mode}
