"""API keys: every route but the open ones needs `Authorization: Bearer <key>` (`--api-key`).

Deny by default: `/v1/*`, `/debug/*`, `/tokenize`, `/detokenize`, FastAPI's docs and any unknown path
are guarded; only `/health`, `/version` and (unless `--protect-metrics`) `/metrics` stay open, as in
vLLM. The check runs before the body is read, so a client without a key cannot make the server
buffer a large body. Keys are compared as SHA-256 digests (equal lengths) with
`hmac.compare_digest` against every key, without stopping at the first match, so the time taken
says nothing about which key or how much of it was right. Keys live in `ServerConfig.api_keys`
(kept out of its repr) and nowhere else: they are never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Callable, Iterable

from radixflow.server.errors import unauthorized

OPEN_PATHS = frozenset({"/health", "/version"})
ENV_VAR = "RADIXFLOW_API_KEY"


def parse_api_keys(values: Iterable[str] | None, env: str | None) -> tuple[str, ...]:
    """The keys from `--api-key` (repeated, several per flag, or comma-separated), else from
    `RADIXFLOW_API_KEY` (comma-separated). The flag wins over the variable, as vLLM's does. An
    empty variable means no key; an empty key given on the command line is an error (an unset
    shell variable in `--api-key "$KEY"` would otherwise open the server)."""
    from_flag = values is not None
    raw = list(values) if from_flag else ([env] if env else [])
    keys: list[str] = []
    for item in raw:
        parts = item.split(",")
        if from_flag and any(not p.strip() for p in parts):
            raise ValueError("--api-key: a key must not be empty")
        keys.extend(p for p in parts if p.strip())
    for i, key in enumerate(keys, 1):  # never echo the key itself
        if key != key.strip():
            raise ValueError(f"API key #{i} starts or ends with whitespace; HTTP strips it, so no client could send it")
        if not (key.isascii() and key.isprintable()):
            raise ValueError(f"API key #{i} has characters outside printable ASCII; HTTP headers cannot carry them")
    return tuple(dict.fromkeys(keys))


class AuthMiddleware:
    """Answers 401 (OpenAI's error shape, type `authentication_error`) unless the request carries
    one of `keys` or asks for an open path."""

    def __init__(self, app, keys: Iterable[str], open_paths: Iterable[str], count: Callable[[str, str], None],
                 endpoint: Callable[[dict], str]) -> None:
        self.app = app
        self._digests = [hashlib.sha256(k.encode()).digest() for k in keys]
        self.open_paths = frozenset(open_paths)
        self.count = count
        self.endpoint = endpoint

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket") or route_path(scope) in self.open_paths or self.allowed(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        self.count(self.endpoint(scope), "401")
        await unauthorized().response()(scope, receive, send)

    def allowed(self, scope) -> bool:
        value = next((v for name, v in scope.get("headers", ()) if name == b"authorization"), b"")
        scheme, _, token = value.strip().partition(b" ")
        digest = hashlib.sha256(token.strip()).digest()
        match = False
        for key in self._digests:  # every key, every time
            match |= hmac.compare_digest(digest, key)
        return match and scheme.lower() == b"bearer"


def route_path(scope) -> str:
    """The path the router matches: uvicorn prefixes `--root-path` to it, Starlette strips it."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


def exposure_warning(host: str, keys: tuple[str, ...]) -> str | None:
    """The one line to print when the server listens beyond this machine without a key."""
    if keys or _loopback(host):
        return None
    return (f"--host {host} serves every client that can reach the port and no --api-key is set: "
            f"anyone there can run requests (set --api-key or {ENV_VAR}, or bind 127.0.0.1)")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False
