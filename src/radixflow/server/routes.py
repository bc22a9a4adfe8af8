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
from radixflow.server import params as rp
from radixflow.server.engine_loop import Delta, Failed, Finished
from radixflow.server.errors import bad_request, unexpected
from radixflow.server.inputs import check_fanout, check_text, encode_prompts, encode_text, off_loop
from radixflow.server.logs import StreamLog, log_output, log_request
from radixflow.server.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from radixflow.server.render import (
    TextStream,
    chat_logprobs,
    completion_logprobs,
    finish_reason,
    prompt_logprobs,
    stop_reason,
    text_offsets,
    usage,
)
from radixflow.server.tracking import ClientGone, TrackedRequest

router = APIRouter()
log = logging.getLogger("radixflow.server")


# ====================================================================== completions
@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Response:
    server = request.app.state.server
    eng = server.engine_for(body.model)
    tok = eng.tokenizer
    rp.refuse_unsupported(body)
    rid = _request_id("cmpl", body)
    prompts, branches = await off_loop(_completion_inputs, eng, rid, body, server.config.max_branches_per_request)
    log_request(server.config, rid, "/v1/completions", body.prompt_list())
    meta = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": server.model_name}
    texts = {b.index: _text_stream(tok, body, prompts[b.index // body.n] if body.echo else None)
             for b in branches}
    tracked = TrackedRequest(server.loop, request, rid, branches, body.stream)  # from here on: abort on exit
    if body.stream:
        by_index = {b.index: b for b in branches}
        offsets: dict[int, int] = {}  # choice -> text offset of its next logprobs token
        chunks = lambda ev: _completion_chunks(ev, texts, body, meta, prompts, by_index, offsets)  # noqa: E731
        return _sse(tracked, server, "/v1/completions", chunks)
    req = await _wait(tracked, server, "/v1/completions")
    if req is None:
        return Response(status_code=499)
    choices = []
    for b in req.branches:
        st = b.user_data
        ts = texts[b.index]
        text = ts.push(list(b.output)) + ts.finish()
        prompt = prompts[b.index // body.n]
        lp = None
        if body.logprobs is not None:
            lp = completion_logprobs(tok, list(b.output), st.logprobs, st.top_logprobs, 0,
                                     prompt if body.echo else None, body.return_tokens_as_token_ids,
                                     st.prompt_logprobs)
        choice = {"index": b.index, "text": text, "logprobs": lp, "finish_reason": finish_reason(b),
                  "stop_reason": stop_reason(b, ts)}
        if body.prompt_logprobs is not None:
            choice["prompt_logprobs"] = prompt_logprobs(tok, prompt, st.prompt_logprobs,
                                                        body.return_tokens_as_token_ids)
        if body.return_token_ids:
            choice["prompt_token_ids"] = prompt
            choice["token_ids"] = list(b.output)
        choices.append(choice)
    log_output(server.config, rid, [c["text"] for c in choices])
    return JSONResponse({**meta, "choices": choices, "usage": usage(req.branches, body.n)})


def _completion_inputs(eng: Engine, rid: str, body: CompletionRequest, cap: int):
    """Prompts as token ids and their branches (runs in a worker thread: tokenizing is CPU work)."""
    raw = body.prompt_list()
    if not raw:
        raise bad_request("prompt must not be empty", "prompt")
    check_fanout(len(raw), body.n, cap)
    limit = eng.config.max_model_len if body.truncate_prompt_tokens is None else None  # else cut later
    prompts = encode_prompts(eng.tokenizer, raw, limit, body.add_special_tokens)
    prompts = [rp.truncate(p, body, eng.config.max_model_len) for p in prompts]
    echo_lp = body.echo and body.logprobs is not None  # echoed tokens carry their prompt logprobs
    plp = body.prompt_logprobs if body.prompt_logprobs is not None else (body.logprobs if echo_lp else None)
    build = rp.ParamsBuilder(body, eng, body.max_tokens, body.logprobs, plp)
    return prompts, _branches(eng, rid, prompts, body, build)


def _completion_chunks(ev, texts: dict, body: CompletionRequest, meta: dict, prompts: list[list[int]],
                       branches: dict[int, Branch], offsets: dict[int, int]):
    if isinstance(ev, Delta):
        ts = texts[ev.index]
        first = ts.first
        text = ts.push(ev.token_ids)
        lp = None
        if body.logprobs is not None:
            echo_ids, plp = None, None
            if first and body.echo:  # the echoed prompt comes with the first text; prefill is done, so
                # its prompt logprobs are complete and the engine thread no longer writes them
                echo_ids, plp = prompts[ev.index // body.n], branches[ev.index].user_data.prompt_logprobs
            start = offsets.get(ev.index, 0)
            lp = completion_logprobs(ts.tokenizer, ev.token_ids, ev.logprobs, ev.top_logprobs, start,
                                     prompt_ids=echo_ids, as_ids=body.return_tokens_as_token_ids, prompt_lps=plp)
            offsets[ev.index] = text_offsets(ts.tokenizer, [*(echo_ids or ()), *ev.token_ids], start)[1]
        if text or lp is not None or body.return_token_ids:
            choice = {"index": ev.index, "text": text, "logprobs": lp, "finish_reason": None}
            if body.return_token_ids:
                choice["token_ids"] = ev.token_ids
                if first:
                    choice["prompt_token_ids"] = prompts[ev.index // body.n]
            yield {**meta, "choices": [choice]}
        return
    for b in ev.request.branches:
        ts = texts[b.index]
        rest = ts.finish()
        yield {**meta, "choices": [{"index": b.index, "text": rest, "logprobs": None,
                                    "finish_reason": finish_reason(b), "stop_reason": stop_reason(b, ts)}]}
    if body.include_usage:
        yield {**meta, "choices": [], "usage": usage(ev.request.branches, body.n)}


# ====================================================================== chat
@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    server = request.app.state.server
    eng = server.engine_for(body.model)
    tok = eng.tokenizer
    rp.refuse_unsupported(body)
    rid = _request_id("chatcmpl", body)
    prompt_text, prompt, branches = await off_loop(_chat_inputs, eng, rid, body, server.config)
    log_request(server.config, rid, "/v1/chat/completions", [prompt_text])
    meta = {"id": rid, "object": "chat.completion.chunk" if body.stream else "chat.completion",
            "created": int(time.time()), "model": server.model_name}
    last = body.messages[-1]
    echo = last.text() if body.echo and last.role == "assistant" else ""  # vLLM: echo the open assistant turn
    texts = {b.index: _text_stream(tok, body, None, echo) for b in branches}
    tracked = TrackedRequest(server.loop, request, rid, branches, body.stream)
    if body.stream:
        chunks = lambda ev: _chat_chunks(ev, texts, body, meta, prompt, prompt_text)  # noqa: E731
        return _sse(tracked, server, "/v1/chat/completions", chunks)
    req = await _wait(tracked, server, "/v1/chat/completions")
    if req is None:
        return Response(status_code=499)
    choices = []
    for b in req.branches:
        st = b.user_data
        ts = texts[b.index]
        lp = None
        if body.logprobs:
            lp = chat_logprobs(tok, list(b.output), st.logprobs, st.top_logprobs, body.return_tokens_as_token_ids)
        text = ts.push(list(b.output)) + ts.finish()
        choice = {"index": b.index, "message": {"role": "assistant", "content": text},
                  "logprobs": lp, "finish_reason": finish_reason(b), "stop_reason": stop_reason(b, ts)}
        if body.return_token_ids:
            choice["token_ids"] = list(b.output)
        choices.append(choice)
    log_output(server.config, rid, [c["message"]["content"] for c in choices])
    out = {**meta, "choices": choices, "usage": usage(req.branches, body.n)}
    if body.prompt_logprobs is not None:
        out["prompt_logprobs"] = prompt_logprobs(tok, prompt, req.branches[0].user_data.prompt_logprobs,
                                                 body.return_tokens_as_token_ids)
    if body.return_token_ids:
        out["prompt_token_ids"] = prompt
    if body.return_prompt_text:
        out["prompt_text"] = prompt_text
    return JSONResponse(out)


def _chat_inputs(eng: Engine, rid: str, body: ChatCompletionRequest, config):
    """(rendered prompt text, its token ids, one branch per choice); runs in a worker thread."""
    check_fanout(1, body.n, config.max_branches_per_request)
    try:
        kwargs = body.template_kwargs()
    except ValueError as e:
        raise bad_request(str(e), "chat_template_kwargs") from e
    messages = body.rendered_messages()
    for i, m in enumerate(messages):
        if isinstance(m.get("content"), str):
            check_text(m["content"], f"messages.{i}.content")
    try:
        prompt_text = eng.tokenizer.apply_chat_template(messages, body.add_generation_prompt, body.chat_template,
                                                        body.continue_final_message, **kwargs)
    except Exception as e:  # a template error is the request's fault (roles, order)
        raise bad_request(f"messages: the chat template failed: {e}", "messages") from e
    limit = eng.config.max_model_len if body.truncate_prompt_tokens is None else None  # else cut below
    ids = encode_text(eng.tokenizer, prompt_text, "messages", limit, body.add_special_tokens)
    prompt = rp.truncate(ids, body, eng.config.max_model_len)
    max_tokens = body.max_completion_tokens or body.max_tokens
    if max_tokens is None:
        max_tokens = max(1, min(config.default_max_tokens, eng.config.max_model_len - len(prompt)))
    k = body.top_logprobs if body.logprobs else None
    build = rp.ParamsBuilder(body, eng, max_tokens, k, body.prompt_logprobs)
    return prompt_text, prompt, _branches(eng, rid, [prompt], body, build)


def _chat_chunks(ev, texts: dict, body: ChatCompletionRequest, meta: dict, prompt: list[int], prompt_text: str):
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
            if body.return_token_ids:
                choice["token_ids"] = ev.token_ids
            chunk = {**meta, "choices": [choice]}
            if first and body.return_token_ids:
                chunk["prompt_token_ids"] = prompt
            if first and body.return_prompt_text:
                chunk["prompt_text"] = prompt_text
            yield chunk
        return
    for b in ev.request.branches:
        ts = texts[b.index]
        first = ts.first
        delta = {"content": ts.finish()}
        if first:
            delta = {"role": "assistant", **delta}
        yield {**meta, "choices": [{"index": b.index, "delta": delta, "logprobs": None,
                                    "finish_reason": finish_reason(b), "stop_reason": stop_reason(b, ts)}]}
    if body.include_usage:
        yield {**meta, "choices": [], "usage": usage(ev.request.branches, body.n)}


# ====================================================================== shared
def _request_id(prefix: str, body: SamplingFields) -> str:
    """`{prefix}-{request_id}` when the client names the request (vLLM's field), else a fresh uuid."""
    return f"{prefix}-{body.request_id or uuid.uuid4().hex}"


def _branches(eng: Engine, rid: str, prompts: list[list[int]], body: SamplingFields,
              build: rp.ParamsBuilder) -> list[Branch]:
    """One branch per prompt and choice, validated by the engine (vocabulary, max_model_len). Every
    prompt is checked before any branch is built: a refused request of 100k prompts leaves no 100k
    objects to collect."""
    branches = []
    now = time.monotonic()
    ns = rp.namespace(body)
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise bad_request(f"prompt {i} is empty" if len(prompts) > 1 else "prompt is empty", "prompt")
        try:
            eng.check_prompt(prompt, build.max_tokens)
        except ValueError as e:
            param = "max_tokens" if "max_model_len" in str(e) else "prompt"
            raise bad_request(f"prompt {i}: {e}" if len(prompts) > 1 else str(e), param) from e
    for i, prompt in enumerate(prompts):
        for j in range(body.n):
            params = build.params(j)
            try:
                branches.append(eng.make_branch(rid, len(branches), prompt, params, ns, now, body.priority))
            except ValueError as e:
                msg = str(e)
                param = "max_tokens" if "max_model_len" in msg else "prompt"
                if msg.startswith("SamplingParams."):
                    msg = msg.removeprefix("SamplingParams.")
                    param = msg.split(":", 1)[0]
                where = f"prompt {i}: " if len(prompts) > 1 else ""
                raise bad_request(f"{where}{msg}", param) from e
    return branches


def _text_stream(tok, body: SamplingFields, echo_ids: list[int] | None, echo_text: str = "") -> TextStream:
    prefix = tok.decode(echo_ids, body.skip_special_tokens) if echo_ids else echo_text
    return TextStream(tok, body.stop_strings(), prefix, body.include_stop_str_in_output,
                      body.skip_special_tokens, body.min_tokens)


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
        shown = StreamLog(server.config)
        try:
            while True:
                ev = await tracked.next(watch_disconnect=False)  # Starlette cancels us on disconnect
                if isinstance(ev, Failed):
                    status = str(ev.error.status)
                    yield ev.error.sse()
                    break
                try:
                    rendered = list(chunks(ev))
                    lines = [f"data: {json.dumps(chunk)}\n\n" for chunk in rendered]
                except Exception as e:  # a bug while rendering: the client still gets an error event
                    log.exception("rendering a stream chunk failed")
                    err = unexpected(e)
                    status = str(err.status)
                    yield err.sse()
                    break
                for chunk, line in zip(rendered, lines):
                    shown.add(chunk)
                    yield line
                if isinstance(ev, Finished):
                    status = "200"
                    break
            yield "data: [DONE]\n\n"
        finally:
            tracked.close()
            shown.close()
            server.metrics.requests.labels(endpoint, status).inc()

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


