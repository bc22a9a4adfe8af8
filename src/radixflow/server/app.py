"""The FastAPI application: server config, shared state, and the small endpoints.

`create_app(config)` builds an app whose lifespan starts the engine thread (the model loads there;
every endpoint answers 503 until it is ready) and stops it on shutdown. The generation endpoints
live in `routes.py`.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from radixflow.engine.engine import Engine, EngineConfig
from radixflow.server.engine_loop import EngineLoop
from radixflow.server.errors import APIError, install_handlers
from radixflow.server.metrics import ServerMetrics
from radixflow.server.routes import router


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


class ServerState:
    """What the handlers share: config, engine loop, metrics."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        sc = config.engine.scheduler
        self.metrics = ServerMetrics(sc.max_num_seqs, sc.max_num_batched_tokens)
        self.loop = EngineLoop(config.engine, self.metrics, config.max_queue, config.torch_threads)
        self.model_name = config.served_model_name or config.engine.model
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
        yield
        await asyncio.to_thread(state.loop.stop)

    app = FastAPI(title="radixflow", lifespan=lifespan)
    app.state.server = state
    install_handlers(app, lambda endpoint, status: state.metrics.requests.labels(endpoint, status).inc())
    app.include_router(router)

    @app.get("/health")
    async def health() -> JSONResponse:
        state.loop.check_available()
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        card = {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "radixflow",
                "root": config.engine.model, "max_model_len": config.engine.max_model_len}
        return JSONResponse({"object": "list", "data": [card]})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    if config.debug_endpoints:
        @app.get("/debug/cache")
        async def debug_cache(request: Request) -> JSONResponse:
            state.loop.check_available()
            return JSONResponse(await asyncio.wrap_future(state.loop.call(cache_report)))

    return app


def cache_report(engine: Engine) -> dict:
    """Integrity of the pools and what is held beyond the cache (runs on the engine thread)."""
    sc = engine.scheduler
    try:
        sc.check_integrity()
        integrity = "ok"
    except AssertionError as e:
        integrity = f"violated: {e}"
    return {"integrity": integrity, "holds_nothing": sc.holds_nothing(), "rounds": sc.round,
            "blocked_total": sc.blocked_total, "held": len(sc.held), "waiting": len(sc.waiting),
            "running": len(sc.running), "in_flight_requests": len(engine.requests),
            "kv_pages": {"used": sc.pages.num_used, "total": sc.pages.capacity},
            "state_slots": {"used": sc.slots.num_used, "total": sc.slots.capacity}}
