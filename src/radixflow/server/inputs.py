"""Turning request text into token ids safely, off the event loop.

JSON may carry lone UTF-16 surrogates (`"\\ud800"`), which are valid Python strings but not Unicode
text: the tokenizer refuses them with a `TypeError`. They are caught here and refused as a 400
naming the field. `off_loop` runs the CPU-heavy part of a handler (tokenization, branch building)
in a worker thread, so the event loop keeps answering while a huge prompt is processed.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from typing import TypeVar

from radixflow.engine.tokenizer import PromptTooLong
from radixflow.server.errors import bad_request

_SURROGATE = re.compile("[\ud800-\udfff]")
T = TypeVar("T")


def check_text(text: str, param: str) -> None:
    """400 if `text` holds a lone surrogate (it cannot be encoded as UTF-8)."""
    if text.isascii():
        return
    m = _SURROGATE.search(text)
    if m is not None:
        raise bad_request(f"{param}: character {m.start()} is a lone UTF-16 surrogate "
                          f"(U+{ord(m.group()):04X}); send valid Unicode text", param)


def encode_text(tokenizer, text: str, param: str, limit: int | None = None,
                add_special_tokens: bool = False) -> list[int]:
    """Token ids of `text`, or a 400 naming `param` (bad text, or more than `limit` tokens)."""
    check_text(text, param)
    try:
        return tokenizer.encode(text, add_special_tokens, limit)
    except ValueError as e:
        raise bad_request(f"{param}: {e}", param) from e


def encode_prompts(tokenizer, prompts: list[str | list[int]], limit: int | None,
                   add_special_tokens: bool = False) -> list[Sequence[int]]:
    """A completions prompt list as token ids: texts are tokenized together (a batch at a time, the
    GIL released), token-id lists pass through. Errors name `prompt` (one prompt) or `prompt.i`."""
    def param(i: int) -> str:
        return "prompt" if len(prompts) == 1 else f"prompt.{i}"

    where = [i for i, p in enumerate(prompts) if isinstance(p, str)]
    for i in where:
        check_text(prompts[i], param(i))
    out = [p if isinstance(p, list) else None for p in prompts]
    try:
        # a tuple of ints leaves the collector's view; 100k live lists would make its full passes long
        for i, ids in zip(where, tokenizer.iter_encode([prompts[i] for i in where], limit, add_special_tokens)):
            out[i] = tuple(ids)
    except PromptTooLong as e:
        raise bad_request(f"{param(where[e.index])}: {e}", param(where[e.index])) from e
    return out


def check_fanout(num_prompts: int, n: int, cap: int) -> None:
    """400 when prompts x n (the branches of one request) exceeds the server's cap."""
    if num_prompts * n > cap:
        raise bad_request(f"this request asks for {num_prompts} prompt(s) x n={n} = {num_prompts * n} "
                          f"sequences; the server allows at most {cap} per request "
                          f"(--max-branches-per-request)", "prompt" if n == 1 else "n")


async def off_loop(fn: Callable[..., T], *args) -> T:
    """fn(*args) in a worker thread; its exceptions (APIError included) propagate to the handler."""
    return await asyncio.to_thread(fn, *args)
