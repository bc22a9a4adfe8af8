"""POST /tokenize and /detokenize, in vLLM's request and response shapes.

`/tokenize` takes a completions `prompt` or chat `messages` (rendered with the model's template)
and returns `{"count", "max_model_len", "tokens", "token_strs"}`; `/detokenize` takes `tokens` and
returns `{"prompt"}`. Fields outside these shapes are refused (extra="forbid") rather than ignored.
"""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from radixflow.server.errors import APIError, bad_request
from radixflow.server.inputs import check_text, encode_text, off_loop
from radixflow.server.protocol import ChatMessage
from radixflow.server.render import token_str

router = APIRouter()


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TokenizeCompletion(_Strict):
    model: str | None = None
    prompt: StrictStr
    add_special_tokens: bool = True  # vLLM's default; the tokenizer's post-processor decides what it adds
    return_token_strs: bool | None = False


class TokenizeChat(_Strict):
    model: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    add_generation_prompt: bool = True
    add_special_tokens: bool = False
    return_token_strs: bool | None = False


class Detokenize(_Strict):
    model: str | None = None
    tokens: list[Annotated[StrictInt, Field(ge=0)]]


@router.post("/tokenize")
async def tokenize(request: Request) -> JSONResponse:
    server = request.app.state.server
    body = await _parse(request)
    eng = server.engine_for(body.model)
    ids = await off_loop(_tokenize, eng.tokenizer, body)
    out = {"count": len(ids), "max_model_len": eng.config.max_model_len, "tokens": ids, "token_strs": None}
    if body.return_token_strs:
        out["token_strs"] = [token_str(eng.tokenizer, t) for t in ids]
    server.metrics.requests.labels("/tokenize", "200").inc()
    return JSONResponse(out)


async def _parse(request: Request) -> TokenizeChat | TokenizeCompletion:
    """The chat shape when the body has `messages`, else the completion shape (as vLLM decides)."""
    raw = await request.body()
    try:
        data = json.loads(raw) if raw else None
    except ValueError as e:
        raise APIError(400, f"malformed JSON body: {e}", None, "invalid_json") from e
    if not isinstance(data, dict):
        raise APIError(400, "request body is required (a JSON object)", None, "invalid_json")
    shape = TokenizeChat if "messages" in data else TokenizeCompletion
    try:
        return shape.model_validate(data)
    except ValidationError as e:
        raise RequestValidationError(e.errors()) from e


def _tokenize(tok, body: TokenizeChat | TokenizeCompletion) -> list[int]:
    if isinstance(body, TokenizeCompletion):
        return encode_text(tok, body.prompt, "prompt", add_special_tokens=body.add_special_tokens)
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    for i, m in enumerate(messages):
        check_text(m["content"], f"messages.{i}.content")
    try:
        text = tok.apply_chat_template(messages, body.add_generation_prompt)
    except Exception as e:  # a template error is the request's fault (roles, order)
        raise bad_request(f"messages: the chat template failed: {e}", "messages") from e
    return encode_text(tok, text, "messages", add_special_tokens=body.add_special_tokens)


@router.post("/detokenize")
async def detokenize(body: Detokenize, request: Request) -> JSONResponse:
    server = request.app.state.server
    eng = server.engine_for(body.model)
    bad = next((t for t in body.tokens if t >= eng.vocab_size), None)
    if bad is not None:
        raise bad_request(f"token id {bad} is outside the vocabulary [0, {eng.vocab_size})", "tokens")
    text = await off_loop(eng.tokenizer.decode, body.tokens)
    server.metrics.requests.labels("/detokenize", "200").inc()
    return JSONResponse({"prompt": text})
