"""What the server's logs may say: never prompt or completion text unless `--log-requests`.

Request text reaches a log only three ways, and each is closed here. (1) An exception message: a
bug's `KeyError`, a tokenizer's or a template's error may quote what the client sent, so every
traceback logged by the server, uvicorn or asyncio keeps its frames and its exception types but
not its messages (`Redact`). (2) The access log's query string: it is cut to the path. (3) The
request log itself, which exists only with `--log-requests`, each text cut to `--max-log-len`
characters. API keys are never logged at all (server/auth.py).
"""

from __future__ import annotations

import logging
import threading
import traceback

log = logging.getLogger("radixflow.server")
_LOGGERS = ("radixflow.server", "uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi", "asyncio",
            "concurrent.futures")


class Redact(logging.Filter):
    """A logger filter: tracebacks without exception messages, access lines without query strings.
    `reveal=True` (`--log-requests`) keeps the messages; the query string is cut either way."""

    def __init__(self, reveal: bool = False) -> None:
        super().__init__()
        self.reveal = reveal

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None and not self.reveal \
                and not getattr(record, "trusted", False):
            record.exc_text = withheld_traceback(record.exc_info[1])
        if record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) == 5:
            addr, method, path, version, status = record.args
            if isinstance(path, str) and "?" in path:
                record.args = (addr, method, path.split("?", 1)[0] + "?…", version, status)
        return True


def withheld_traceback(exc: BaseException) -> str:
    """`traceback.format_exception` with each message replaced by its length, causes included."""
    chain, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__cause__ if exc.__cause__ is not None else (None if exc.__suppress_context__ else exc.__context__)
    parts = []
    for i, e in enumerate(reversed(chain)):
        if i:
            parts.append("\nThe above exception led to the following exception:\n\n")
        parts.append("Traceback (most recent call last):\n")
        parts.extend(traceback.format_tb(e.__traceback__))
        parts.append(f"{type(e).__module__}.{type(e).__qualname__}: <message withheld, {len(str(e))} characters: "
                     f"it may quote the request; --log-requests shows it>\n")
    return "".join(parts).rstrip("\n")


def install(reveal: bool) -> None:
    """Puts one `Redact` filter on each logger that can carry request text (after uvicorn has
    configured its loggers; a second server in the same process replaces the filter)."""
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        for f in [f for f in logger.filters if isinstance(f, Redact)]:
            logger.removeFilter(f)
        logger.addFilter(Redact(reveal))


def route_thread_errors() -> None:
    """Uncaught exceptions of threads are logged (so redacted) instead of printed raw to stderr.
    For the `radixflow serve` process only: a test process keeps pytest's own hook."""
    def hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is not SystemExit:
            log.error("uncaught exception in thread %s", args.thread.name if args.thread else "?",
                      exc_info=(args.exc_type, args.exc_value, args.exc_traceback))
    threading.excepthook = hook


def clip(text: str, max_len: int | None) -> str:
    return text if max_len is None or len(text) <= max_len else f"{text[:max_len]}… ({len(text)} characters)"


def log_request(config, request_id: str, endpoint: str, prompts: list) -> None:
    """With `--log-requests`: the request's prompts (texts or token ids), each cut to `--max-log-len`."""
    if config.log_requests:
        shown = [clip(p if isinstance(p, str) else str(list(p)), config.max_log_len) for p in prompts]
        log.info("request %s %s: prompt%s %r", request_id, endpoint, "s" if len(shown) > 1 else "",
                 shown if len(shown) > 1 else shown[0])


def log_output(config, request_id: str, texts: list[str]) -> None:
    """With `--log-requests`: the output texts, each cut to `--max-log-len`."""
    if config.log_requests:
        log.info("request %s output: %r", request_id, [clip(t, config.max_log_len) for t in texts])


class StreamLog:
    """With `--log-requests`: a stream's text per choice, gathered from its chunks, logged at its end."""

    def __init__(self, config) -> None:
        self.config = config
        self.request_id = ""
        self.texts: dict[int, str] | None = {} if config.log_requests else None

    def add(self, chunk: dict) -> None:
        if self.texts is None:
            return
        self.request_id = chunk.get("id", self.request_id)
        for c in chunk.get("choices", ()):
            piece = c["text"] if "text" in c else (c.get("delta") or {}).get("content")
            if piece:
                self.texts[c["index"]] = self.texts.get(c["index"], "") + piece

    def close(self) -> None:
        if self.texts is not None:
            log_output(self.config, self.request_id, [self.texts[i] for i in sorted(self.texts)])
