"""POST /v1/completions and /v1/chat/completions.

A completions call is ONE logical request with one branch per prompt (times `n`): a list of
candidates sent with `max_tokens: 1, logprobs: k` is the multi-candidate scoring shape, and its
branches share the cached document through one namespace. A chat call is one branch per choice.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from radixflow.core.branch import Branch
from radixflow.engine.engine import Engine
from radixflow.engine.sampling import SamplingParams
from radixflow.server.engine_loop import Delta, Failed, Finished
from radixflow.server.errors import bad_request, unexpected
from radixflow.server.inputs import check_fanout, check_text, encode_prompts, encode_text, off_loop
from radixflow.server.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from radixflow.server.render import TextStream, chat_logprobs, completion_logprobs, finish_reason, text_offsets, usage
from radixflow.server.tracking import ClientGone, TrackedRequest

router = APIRouter()
log = logging.getLogger("radixflow.server")


# ====================================================================== completions
@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Response:
    server = request.app.state.server
    eng = server.engine_for(body.model)
    tok = eng.tokenizer
    rid = f"cmpl-{uuid.uuid4().hex}"
    prompts, branches = await off_loop(_completion_inputs, eng, rid, body, server.config.max_branches_per_request)
    meta = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": server.model_name}
    texts = {b.index: _text_stream(tok, body, prompts[b.index // body.n] if body.echo else None)
             for b in branches}
    tracked = TrackedRequest(server.loop, request, rid, branches, body.stream)  # from here on: abort on exit
    if body.stream:
        offsets: dict[int, int] = {}  # choice -> text offset of its next logprobs token
        return _sse(tracked, server, "/v1/completions",
                    lambda ev: _completion_chunks(ev, texts, body, meta, offsets))
    req = await _wait(tracked, server, "/v1/completions")
    if req is None:
        return Response(status_code=499)
    choices = []
    for b in req.branches:
        st = b.user_data
        text = texts[b.index].push(list(b.output)) + texts[b.index].finish()
        lp = None
        if body.logprobs is not None:
            echo_ids = prompts[b.index // body.n] if body.echo else None
            lp = completion_logprobs(tok, list(b.output), st.logprobs, st.top_logprobs, 0, echo_ids,
                                     body.return_tokens_as_token_ids)
        choices.append({"index": b.index, "text": text, "logprobs": lp, "finish_reason": finish_reason(b)})
    return JSONResponse({**meta, "choices": choices, "usage": usage(req.branches, body.n)})


def _completion_inputs(eng: Engine, rid: str, body: CompletionRequest, cap: int):
    """Prompts as token ids and their branches (runs in a worker thread: tokenizing is CPU work)."""
    raw = body.prompt_list()
    if not raw:
        raise bad_request("prompt must not be empty", "prompt")
    check_fanout(len(raw), body.n, cap)
    prompts = encode_prompts(eng.tokenizer, raw, eng.config.max_model_len)
    return prompts, _branches(eng, rid, prompts, body, body.max_tokens, body.logprobs)


def _completion_chunks(ev, texts: dict, body: CompletionRequest, meta: dict, offsets: dict[int, int]):
    if isinstance(ev, Delta):
        ts = texts[ev.index]
        text = ts.push(ev.token_ids)
        lp = None
        if body.logprobs is not None:
            start = offsets.get(ev.index, len(ts.prefix))
            lp = completion_logprobs(ts.tokenizer, ev.token_ids, ev.logprobs, ev.top_logprobs, start,
                                     as_ids=body.return_tokens_as_token_ids)
            offsets[ev.index] = text_offsets(ts.tokenizer, ev.token_ids, start)[1]
        if text or lp is not None:
            choice = {"index": ev.index, "text": text, "logprobs": lp, "finish_reason": None}
            yield {**meta, "choices": [choice]}
        return
    for b in ev.request.branches:
        rest = texts[b.index].finish()
        yield {**meta, "choices": [{"index": b.index, "text": rest, "logprobs": None,
                                    "finish_reason": finish_reason(b)}]}
    if body.include_usage:
        yield {**meta, "choices": [], "usage": usage(ev.request.branches, body.n)}


# ====================================================================== chat
@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    server = request.app.state.server
    eng = server.engine_for(body.model)
    tok = eng.tokenizer
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    branches = await off_loop(_chat_inputs, eng, rid, body, server.config)
    meta = {"id": rid, "object": "chat.completion.chunk" if body.stream else "chat.completion",
            "created": int(time.time()), "model": server.model_name}
    texts = {b.index: _text_stream(tok, body, None) for b in branches}
    tracked = TrackedRequest(server.loop, request, rid, branches, body.stream)
    if body.stream:
        return _sse(tracked, server, "/v1/chat/completions", lambda ev: _chat_chunks(ev, texts, body, meta))
    req = await _wait(tracked, server, "/v1/chat/completions")
    if req is None:
        return Response(status_code=499)
    choices = []
    for b in req.branches:
        st = b.user_data
        lp = None
        if body.logprobs:
            lp = chat_logprobs(tok, list(b.output), st.logprobs, st.top_logprobs, body.return_tokens_as_token_ids)
        text = texts[b.index].push(list(b.output)) + texts[b.index].finish()
        choices.append({"index": b.index, "message": {"role": "assistant", "content": text},
                        "logprobs": lp, "finish_reason": finish_reason(b)})
    return JSONResponse({**meta, "choices": choices, "usage": usage(req.branches, body.n)})


def _chat_inputs(eng: Engine, rid: str, body: ChatCompletionRequest, config) -> list[Branch]:
    """The rendered conversation's branches, one per choice (runs in a worker thread)."""
    check_fanout(1, body.n, config.max_branches_per_request)
    messages = body.rendered_messages()
    for i, m in enumerate(messages):
        check_text(m["content"], f"messages.{i}.content")
    try:
        text = eng.tokenizer.apply_chat_template(messages)
    except Exception as e:  # a template error is the request's fault (roles, order)
        raise bad_request(f"messages: the chat template failed: {e}", "messages") from e
    prompt = encode_text(eng.tokenizer, text, "messages", eng.config.max_model_len)
    max_tokens = body.max_completion_tokens or body.max_tokens
    if max_tokens is None:
        max_tokens = max(1, min(config.default_max_tokens, eng.config.max_model_len - len(prompt)))
    k = body.top_logprobs or 0 if body.logprobs else None
    return _branches(eng, rid, [prompt], body, max_tokens, k)


def _chat_chunks(ev, texts: dict, body: ChatCompletionRequest, meta: dict):
    if isinstance(ev, Delta):
        ts = texts[ev.index]
        first = ts.first
        delta: dict = {"content": ts.push(ev.token_ids)}
        if first:
            delta = {"role": "assistant", **delta}
        lp = None
        if body.logprobs:
            lp = chat_logprobs(ts.tokenizer, ev.token_ids, ev.logprobs, ev.top_logprobs,
                               body.return_tokens_as_token_ids)
        if delta["content"] or lp is not None or "role" in delta:
            choice = {"index": ev.index, "delta": delta, "logprobs": lp, "finish_reason": None}
            yield {**meta, "choices": [choice]}
        return
    for b in ev.request.branches:
        ts = texts[b.index]
        first = ts.first
        delta = {"content": ts.finish()}
        if first:
            delta = {"role": "assistant", **delta}
        yield {**meta, "choices": [{"index": b.index, "delta": delta, "logprobs": None,
                                    "finish_reason": finish_reason(b)}]}
    if body.include_usage:
        yield {**meta, "choices": [], "usage": usage(ev.request.branches, body.n)}


# ====================================================================== shared
def _branches(eng: Engine, rid: str, prompts: list[list[int]], body: SamplingFields, max_tokens: int,
              logprobs: int | None) -> list[Branch]:
    """One branch per prompt and choice. Every prompt is checked (vocabulary, max_model_len) before
    any branch is built: a refused request of 100k prompts leaves no 100k objects to collect."""
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise bad_request(f"prompt {i} is empty" if len(prompts) > 1 else "prompt is empty", "prompt")
        try:
            eng.check_prompt(prompt, max_tokens)
        except ValueError as e:
            param = "max_tokens" if "max_model_len" in str(e) else "prompt"
            where = f"prompt {i}: " if len(prompts) > 1 else ""
            raise bad_request(f"{where}{e}", param) from e
    branches = []
    now = time.monotonic()
    for prompt in prompts:
        for j in range(body.n):
            params = _params(body, max_tokens, logprobs, j)
            branches.append(eng.make_branch(rid, len(branches), prompt, params, body.namespace, now))
    return branches


def _params(body: SamplingFields, max_tokens: int, logprobs: int | None, choice: int) -> SamplingParams:
    seed = None if body.seed is None else body.seed + choice
    try:
        return SamplingParams(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, seed=seed,
                              max_tokens=max_tokens, stop=body.stop_strings(),
                              stop_token_ids=list(body.stop_token_ids), ignore_eos=body.ignore_eos,
                              logprobs=logprobs)
    except ValueError as e:
        raise bad_request(str(e).replace("SamplingParams.", ""), None) from e


def _text_stream(tok, body: SamplingFields, echo_ids: list[int] | None) -> TextStream:
    return TextStream(tok, body.stop_strings(), tok.decode(echo_ids) if echo_ids else "")


async def _wait(tracked: TrackedRequest, server, endpoint: str):
    """Waits for the request to finish; None if the client left (the request is then aborted)."""
    try:
        while True:
            ev = await tracked.next()
            if isinstance(ev, Failed):
                raise ev.error  # counted by the error handler
            if isinstance(ev, Finished):
                server.metrics.requests.labels(endpoint, "200").inc()
                return ev.request
    except ClientGone:
        server.metrics.requests.labels(endpoint, "disconnected").inc()
        return None
    finally:
        tracked.close()


def _sse(tracked: TrackedRequest, server, endpoint: str, chunks) -> StreamingResponse:
    async def events() -> AsyncIterator[str]:
        status = "disconnected"
        try:
            while True:
                ev = await tracked.next(watch_disconnect=False)  # Starlette cancels us on disconnect
                if isinstance(ev, Failed):
                    status = str(ev.error.status)
                    yield ev.error.sse()
                    break
                try:
                    lines = [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks(ev)]
                except Exception as e:  # a bug while rendering: the client still gets an error event
                    log.exception("rendering a stream chunk failed")
                    err = unexpected(e)
                    status = str(err.status)
                    yield err.sse()
                    break
                for line in lines:
                    yield line
                if isinstance(ev, Finished):
                    status = "200"
                    break
            yield "data: [DONE]\n\n"
        finally:
            tracked.close()
            server.metrics.requests.labels(endpoint, status).inc()

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


