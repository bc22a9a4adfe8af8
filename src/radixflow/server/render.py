"""Turning branch outputs into OpenAI response fields: text with stop strings, logprobs, usage.

`TextStream` detokenizes incrementally: it holds back a trailing incomplete UTF-8 character and the
longest suffix that could still grow into a stop string, and cuts the text at the first stop string
(which, as in the OpenAI API, is not returned).
"""

from __future__ import annotations

from radixflow.core.branch import Branch


class TextStream:
    def __init__(self, tokenizer, stop: list[str], prefix: str = "") -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.prefix = prefix  # echoed prompt text, sent before the first output text
        self.first = True
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.token_ids: list[int] = []
        self.sent = 0
        self.stopped = False

    def full_text(self) -> str:
        text = self.tokenizer.decode(self.token_ids)
        cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            return text[:cut]
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
                        prompt_ids: list[int] | None = None, as_ids: bool = False) -> dict:
    """The legacy completions `logprobs` object; echoed prompt tokens get null logprobs. `text_offset`
    is each token's character position in the returned text (echo first), from the tokens' real
    bytes: a token holding part of a character starts where that character starts."""
    prompt_ids = prompt_ids or []
    offsets, _ = text_offsets(tokenizer, [*prompt_ids, *token_ids], offset)
    tokens, lps, tops = [], [], []
    for t in prompt_ids:
        tokens.append(token_str(tokenizer, t, as_ids))
        lps.append(None)
        tops.append(None)
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
