"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with the HTTP status."""

from __future__ import annotations

import json
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
          413: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 503: "service_unavailable"}
RETRY_AFTER_S = 1  # the Retry-After a 429 carries: the queue drains as soon as a round frees rows


_UNION_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


class APIError(Exception):
    """An error the client sees; raised anywhere in a handler (or sent from the engine thread)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or ({"Retry-After": str(RETRY_AFTER_S)} if status == 429 else {})

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": _TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}

    def sse(self) -> str:
        """The error as one server-sent event (after a stream has started, the status is already 200)."""
        return f"data: {json.dumps(self.body())}\n\n"

    def response(self) -> JSONResponse:
        return ErrorJSONResponse(self.body(), status_code=self.status, headers=self.headers)


class ErrorJSONResponse(JSONResponse):
    """ASCII JSON: an error message may quote what the client sent, lone surrogates included, and
    must still encode (the default UTF-8 rendering raises on them)."""

    def render(self, content) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param, "invalid_value")


def unauthorized() -> APIError:
    """401 for a missing, malformed or wrong key alike: the answer never says which part was wrong."""
    return APIError(401, "a valid API key is required: send 'Authorization: Bearer <key>'", None,
                    "invalid_api_key", {"WWW-Authenticate": "Bearer"})


def unexpected(exc: BaseException) -> APIError:
    """A bug of ours seen by a client: a JSON 500 that names the exception type, never a traceback."""
    return APIError(500, f"internal server error ({type(exc).__name__}); the server logged the details",
                    None, "internal_error")


def _from_validation(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    if not errors:
        return bad_request("invalid request body")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return APIError(400, f"malformed JSON body: {first.get('ctx', {}).get('error', first.get('msg'))}",
                        None, "invalid_json")
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    if not loc and first.get("type") == "missing":
        return APIError(400, "request body is required (a JSON object)", None, "invalid_json")
    # Union types report one error per alternative; the field path up to the union is what matters.
    param = ".".join(x for x in loc if not ("[" in x or x in _UNION_TAGS or x.startswith("function-")))
    if param == "prompt" and first.get("type") != "missing":
        return bad_request("prompt must be a string, a list of strings, a list of token ids or a list of "
                           "token-id lists", "prompt")
    if first.get("type") == "extra_forbidden":  # refused, not silently ignored (server/protocol.py)
        return bad_request(f"{param}: unknown field, not supported by radixflow (docs/server.md lists "
                           "the fields it accepts)", param)
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return bad_request(f"{param or 'body'}: {first.get('msg', 'invalid value')}{more}", param or None)


def install_handlers(app: FastAPI, count: Callable[[str, str], None]) -> None:
    """Error handlers; `count(endpoint, status)` records each error response."""

    def respond(request: Request, err: APIError) -> JSONResponse:
        route = request.scope.get("route")
        count(route.path if route is not None else "unmatched", str(err.status))
        return err.response()

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return respond(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return respond(request, _from_validation(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else None
        return respond(request, APIError(exc.status_code, str(exc.detail), None, code))
