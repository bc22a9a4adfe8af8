"""The outermost guard of every HTTP request: a body-size cap (413) and a JSON 500 for any bug.

A pure ASGI middleware, so it sees the request before FastAPI reads the body and catches what the
route handlers and Starlette let escape. Starlette's own last-resort handler answers `text/plain`
and re-raises, which makes uvicorn drop the keep-alive connection; here the error becomes an
OpenAI-style JSON body, is counted in `radixflow_requests_total`, and the connection stays usable.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from radixflow.server.errors import APIError, unexpected

log = logging.getLogger("radixflow.server")


class GuardMiddleware:
    def __init__(self, app, max_body_bytes: int, count: Callable[[str, str], None],
                 endpoint: Callable[[dict], str]) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.count = count
        self.endpoint = endpoint  # scope -> the label of its route ("unmatched" for unknown paths)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        body = await self._read_body(scope, receive)
        if body is None:  # the client left before sending the whole body: nobody to answer
            return
        if isinstance(body, APIError):
            await self._respond(scope, send, body)
            return
        replayed = False

        async def replay():  # the body once, then the client's own messages (disconnect)
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        try:
            await self.app(scope, replay, send_tracked)
        except Exception as e:  # noqa: BLE001 - the last resort: every bug still gets a JSON answer
            log.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"))
            if not started:
                await self._respond(scope, send, unexpected(e))

    async def _read_body(self, scope, receive) -> bytes | APIError | None:
        """The whole body, or a 413 as soon as it (or its Content-Length) passes the cap."""
        limit = self.max_body_bytes
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            return _too_large(limit, declared)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # http.disconnect
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return _too_large(limit, None)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _respond(self, scope, send, err: APIError) -> None:
        self.count(self.endpoint(scope), str(err.status))
        resp = err.response()
        await send({"type": "http.response.start", "status": resp.status_code, "headers": resp.raw_headers})
        await send({"type": "http.response.body", "body": resp.body})


def _content_length(scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _too_large(limit: int, declared: int | None) -> APIError:
    size = f" ({declared} bytes)" if declared is not None else ""
    return APIError(413, f"the request body{size} is larger than the server's limit of {limit} bytes "
                         f"(--max-body-size)", None, "body_too_large")
