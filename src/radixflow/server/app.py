"""The FastAPI application: server config, shared state, and the small endpoints.

`create_app(config)` builds an app whose lifespan starts the engine thread (the model loads there;
every endpoint answers 503 until it is ready) and a loop-lag probe, and stops both on shutdown. The
generation endpoints live in `routes.py`, the tokenizer endpoints in `tokenize.py`; every request
passes CORS (with `--allowed-origins`), the API-key check (with `--api-key`, `auth.py`) and
`GuardMiddleware` (body cap, JSON 500s), in that order.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.middleware.cors import CORSMiddleware

from radixflow import __version__
from radixflow.engine.engine import Engine, EngineConfig
from radixflow.server.auth import OPEN_PATHS, AuthMiddleware, route_path
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
    # security (docs/server.md "Security"): keys never appear in the repr, so never in a log
    api_keys: tuple[str, ...] = field(default=(), repr=False)  # empty: no key needed
    protect_metrics: bool = False  # /metrics needs the key too
    allowed_origins: tuple[str, ...] = ()  # CORS; empty: no cross-origin browser access
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    ssl_ca_certs: str | None = None
    ssl_cert_reqs: int = 0  # ssl.CERT_NONE; 2 = CERT_REQUIRED: clients must present a certificate
    root_path: str = ""  # the prefix a path-routing proxy strips
    log_requests: bool = False  # log prompt and output texts (else logs never hold request text)
    max_log_len: int | None = None  # with log_requests: characters of each text logged
    # start-up phases measured before the app exists (commands/serve.py), logged with the engine's
    startup: tuple[tuple[str, float], ...] = ()
    started_at: float | None = None  # time.monotonic() when the process started
    startup_mark: float | None = None  # time.monotonic() when those phases ended


class ServerState:
    """What the handlers share: config, engine loop, metrics."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        sc = config.engine.scheduler
        self.model_name = config.served_model_name or config.engine.model
        self.metrics = ServerMetrics(sc.max_num_seqs, sc.max_num_batched_tokens, self.model_name)
        self.loop = EngineLoop(config.engine, self.metrics, config.max_queue, config.torch_threads)
        self.loop.startup = list(config.startup)
        self.loop.started_at, self.loop.startup_mark = config.started_at, config.startup_mark
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
    endpoint = lambda scope: _endpoint(app, scope)  # noqa: E731
    # Outermost last: CORS (a browser can read even a 401) > keys (before any body is read) > guard.
    app.add_middleware(GuardMiddleware, max_body_bytes=config.max_body_bytes, count=count, endpoint=endpoint)
    if config.api_keys:
        open_paths = OPEN_PATHS if config.protect_metrics else OPEN_PATHS | {"/metrics"}
        app.add_middleware(AuthMiddleware, keys=config.api_keys, open_paths=open_paths, count=count,
                           endpoint=endpoint)
    if config.allowed_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(config.allowed_origins),
                           allow_methods=list(config.allowed_methods), allow_headers=list(config.allowed_headers),
                           allow_credentials=config.allow_credentials)

    @app.get("/health")
    async def health() -> JSONResponse:
        state.loop.check_available()
        return JSONResponse({"status": "ok"})

    def card() -> dict:
        return {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "radixflow",
                "root": config.engine.model, "max_model_len": config.engine.max_model_len}

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [card()]})

    @app.get("/v1/models/{model_id:path}")  # the OpenAI client's models.retrieve; an id may hold '/'
    async def model(model_id: str) -> JSONResponse:
        if model_id not in (state.model_name, config.engine.model):
            raise APIError(404, f"the model '{model_id}' does not exist; this server serves '{state.model_name}'",
                           "model", "model_not_found")
        return JSONResponse(card())

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
    path = route_path(scope)
    return path if path in paths else "unmatched"


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
