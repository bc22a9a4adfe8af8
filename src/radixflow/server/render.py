"""Turning branch outputs into OpenAI response fields: text with stop strings, logprobs, usage.

`TextStream` detokenizes incrementally: it holds back a trailing incomplete UTF-8 character and the
longest suffix that could still grow into a stop string, and cuts the text at the first stop string
(which, as in the OpenAI API, is not returned).
"""

from __future__ import annotations

from radixflow.core.branch import Branch
from radixflow.engine.sampling import first_stop


class TextStream:
    def __init__(self, tokenizer, stop: list[str], prefix: str = "", include_stop: bool = False,
                 skip_special_tokens: bool = True, min_tokens: int = 0) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.prefix = prefix  # echoed prompt text, sent before the first output text
        self.include_stop = include_stop  # include_stop_str_in_output
        self.skip_special_tokens = skip_special_tokens
        self.min_tokens = min_tokens  # stop strings count only once they end past this many tokens
        self.first = True
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.token_ids: list[int] = []
        self.sent = 0
        self.stopped = False
        self.stop_hit: str | None = None  # the stop string that ended the text (stop_reason)
        self._floor: int | None = 0 if min_tokens <= 1 else None

    def full_text(self) -> str:
        text = self.tokenizer.decode(self.token_ids, self.skip_special_tokens)
        if not self.stop:
            return text
        if self._floor is None:
            if len(self.token_ids) < self.min_tokens - 1:
                return text
            self._floor = len(self.tokenizer.decode(self.token_ids[:self.min_tokens - 1], self.skip_special_tokens))
        hit = first_stop(text, self.stop, self._floor)
        if hit:
            cut, s = hit
            self.stopped, self.stop_hit = True, s
            return text[:cut + len(s)] if self.include_stop else text[:cut]
        return text

    def push(self, token_ids: list[int]) -> str:
        """Adds tokens; returns the text that is now safe to send."""
        self.token_ids.extend(token_ids)
        text = self.full_text()
        end = len(text)
        if not self.stopped:
            end = max(self.sent, end - self.holdback)
            while end > self.sent and text[end - 1] == "\ufffd":  # maybe an incomplete character
                end -= 1
        return self._emit(text, end)

    def finish(self) -> str:
        """Everything not sent yet (the branch is done)."""
        text = self.full_text()
        return self._emit(text, len(text))

    def _emit(self, text: str, end: int) -> str:
        out = text[self.sent:end]
        self.sent = max(self.sent, end)
        if self.first:
            out, self.first = self.prefix + out, False
        return out


def token_str(tokenizer, token_id: int, as_id: bool = False) -> str:
    """A token as text; `token_id:N` when asked, or when it is not valid text by itself (a partial
    UTF-8 character)."""
    if as_id:
        return f"token_id:{token_id}"
    s = tokenizer.decode([token_id], skip_special_tokens=False)
    return f"token_id:{token_id}" if not s or "\ufffd" in s else s


def completion_logprobs(tokenizer, token_ids: list[int], logprobs: list[float | None],
                        top: list[list[tuple[int, float]] | None], offset: int = 0,
                        prompt_ids: list[int] | None = None, as_ids: bool = False,
                        prompt_lps: dict | None = None) -> dict:
    """The legacy completions `logprobs` object; echoed prompt tokens carry their prompt logprobs
    (`RequestState.prompt_logprobs`; the first prompt token has none). `text_offset` is each
    token's character position in the returned text (echo first), from the tokens' real bytes: a
    token holding part of a character starts where that character starts."""
    prompt_ids = prompt_ids or []
    offsets, _ = text_offsets(tokenizer, [*prompt_ids, *token_ids], offset)
    tokens, lps, tops = [], [], []
    for q, t in enumerate(prompt_ids):
        entry = (prompt_lps or {}).get(q)
        tokens.append(token_str(tokenizer, t, as_ids))
        lps.append(None if entry is None else entry[0])
        tops.append(None if entry is None else {token_str(tokenizer, i, as_ids): v for i, v in entry[2]})
    for t, lp, tp in zip(token_ids, logprobs, top):
        tokens.append(token_str(tokenizer, t, as_ids))
        lps.append(lp)
        tops.append({token_str(tokenizer, i, as_ids): v for i, v in tp} if tp is not None else None)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def text_offsets(tokenizer, token_ids: list[int], start: int = 0) -> tuple[list[int], int]:
    """(where each token's text starts, where the text after the last one starts), in characters of
    the decoded text: each UTF-8 lead byte begins one character; special tokens decode to nothing."""
    offsets, pos = [], start
    for t in token_ids:
        offsets.append(pos)
        if not tokenizer.is_special(t):
            pos += sum(1 for b in tokenizer.token_bytes(t) if b & 0xC0 != 0x80)
    return offsets, pos


def chat_logprobs(tokenizer, token_ids: list[int], logprobs: list[float | None],
                  top: list[list[tuple[int, float]] | None], as_ids: bool = False) -> dict:
    def entry(t: int, lp: float | None) -> dict:
        return {"token": token_str(tokenizer, t, as_ids), "logprob": lp, "bytes": list(tokenizer.token_bytes(t))}

    content = []
    for t, lp, tp in zip(token_ids, logprobs, top):
        e = entry(t, lp)
        e["top_logprobs"] = [entry(i, v) for i, v in tp or []]
        content.append(e)
    return {"content": content}


def prompt_logprobs(tokenizer, prompt: list[int], entries: dict, as_ids: bool = False) -> list[dict | None]:
    """vLLM's `prompt_logprobs`: None for the first token, then per position {token id: {logprob,
    rank, decoded_token}} for the prompt token and the top-k."""
    out: list[dict | None] = [None]
    for q in range(1, len(prompt)):
        entry = entries.get(q)
        if entry is None:
            out.append(None)
            continue
        lp, rank, top = entry
        pos = {str(prompt[q]): {"logprob": lp, "rank": rank, "decoded_token": token_str(tokenizer, prompt[q], as_ids)}}
        for r, (t, v) in enumerate(top, 1):
            pos.setdefault(str(t), {"logprob": v, "rank": r, "decoded_token": token_str(tokenizer, t, as_ids)})
        out.append(pos)
    return out


def stop_reason(branch: Branch, text: TextStream) -> str | int | None:
    """vLLM's `stop_reason`: the stop string or the stop token id (not EOS) that ended the branch;
    None for EOS, a completed grammar, or a length cut."""
    if branch.finish_reason != "stop":
        return None
    if text.stop_hit is not None:
        return text.stop_hit
    params = getattr(branch.user_data, "params", None)
    last = branch.output[-1] if branch.output else None
    if params is None or last not in params.stop_token_ids:
        return None
    eos = set(getattr(text.tokenizer, "eos_token_ids", ()))
    return last if params.ignore_eos or last not in eos else None


def usage(branches: list[Branch], n: int = 1) -> dict:
    """Token counts of a request whose branch `i*n + j` is prompt i, choice j: each prompt counts
    once (as in OpenAI's API), with the most any of its choices found cached."""
    prompt = sum(b.prompt_len for b in branches if b.index % n == 0)
    completion = sum(len(b.output) for b in branches)
    cached_by_prompt: dict[int, int] = {}
    for b in branches:
        i = b.index // n
        cached_by_prompt[i] = max(cached_by_prompt.get(i, 0), b.cached_tokens or 0)
    cached = sum(cached_by_prompt.values())
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def finish_reason(branch: Branch) -> str | None:
    return {"stop": "stop", "length": "length", "abort": "abort"}.get(branch.finish_reason or "",
                                                                   branch.finish_reason)
