"""Running the app under uvicorn with a draining shutdown.

The first SIGTERM (or Ctrl+C) puts the server in draining mode: new requests get 503, in-flight ones
run to the end, for at most `drain_timeout` seconds all told: at the deadline those still running
fail (503 `drain_timeout`; a stream gets it as an error event, then `[DONE]`), uvicorn closes the
connections within a short grace, and the process exits 0. A second signal stops at once.
"""

from __future__ import annotations

import logging
import time

import uvicorn

from radixflow.server import logs
from radixflow.server.app import ServerConfig, ServerState, create_app
from radixflow.server.auth import exposure_warning
from radixflow.server.errors import APIError

log = logging.getLogger("radixflow.server")
_CLOSE_GRACE_S = 2.0  # after the drain: time for connections to carry their last bytes and close


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState, drain_timeout: float) -> None:
        super().__init__(config)
        self.state = state
        self.drain_timeout = drain_timeout
        self.drain_deadline: float | None = None

    def handle_exit(self, sig, frame) -> None:  # replaces uvicorn's: drain first, never re-raise
        if self.drain_deadline is not None:
            self.should_exit = True
            self.force_exit = True
            return
        log.info("signal %s: draining %d in-flight requests", sig, self.state.loop.in_flight)
        self.state.loop.draining = True
        self.drain_deadline = time.monotonic() + self.drain_timeout

    async def on_tick(self, counter: int) -> bool:
        if self.drain_deadline is not None and not self.should_exit:
            loop = self.state.loop
            if loop.in_flight and time.monotonic() >= self.drain_deadline:
                log.warning("drain timeout (%.1f s): failing %d in-flight requests", self.drain_timeout,
                            loop.in_flight)
                loop.fail_all(APIError(503, f"the server shut down before the request finished "
                                            f"(--drain-timeout {self.drain_timeout:g} s)", None, "drain_timeout"))
                self.should_exit = True
            elif loop.in_flight == 0:
                self.should_exit = True
        return await super().on_tick(counter)


def build_server(config: ServerConfig, log_level: str = "info") -> DrainingServer:
    app = create_app(config)
    # The drain above is the graceful part; uvicorn's own wait only lets connections finish sending.
    uv = uvicorn.Config(app, host=config.host, port=config.port, log_level=log_level, lifespan="on",
                        timeout_graceful_shutdown=_CLOSE_GRACE_S, root_path=config.root_path,
                        ssl_keyfile=config.ssl_keyfile, ssl_certfile=config.ssl_certfile,
                        ssl_ca_certs=config.ssl_ca_certs, ssl_cert_reqs=config.ssl_cert_reqs)
    logs.install(reveal=config.log_requests)  # after uvicorn.Config has configured its loggers
    return DrainingServer(uv, app.state.server, config.drain_timeout)


def serve(config: ServerConfig, log_level: str = "info") -> int:
    server = build_server(config, log_level)
    warning = exposure_warning(config.host, config.api_keys)
    if warning:
        log.warning(warning)
    logs.route_thread_errors()  # a thread's uncaught traceback goes through the log filter too
    server.run()
    return 0
