"""From a validated request body to what the engine runs: refusals, the prompt after truncation,
the cache namespace, the compiled grammar and one `SamplingParams` per choice.

Errors are 400s naming the field (`bad_request(message, field)`).
"""

from __future__ import annotations

from radixflow.engine.engine import Engine
from radixflow.engine.sampling import SamplingParams
from radixflow.engine.structured import CompiledGrammar
from radixflow.server.errors import bad_request
from radixflow.server.protocol import SamplingFields

LOGIT_BIAS_LIMIT = 100.0  # OpenAI's range; vLLM clamps to it as well


def refuse_unsupported(body: SamplingFields) -> None:
    """A 400 naming the first field set to something radixflow does not do."""
    for name, why in body.unsupported():
        raise bad_request(why, name)


def namespace(body: SamplingFields) -> str:
    """The prefix-cache namespace: `namespace`, salted by `cache_salt` (requests with different
    salts never share cached prefixes)."""
    if "\x00" in body.namespace:
        raise bad_request("namespace must not contain NUL characters", "namespace")
    if body.cache_salt is None:
        return body.namespace
    return f"{body.namespace}\x00salt:{body.cache_salt}"


def truncate(prompt: list[int], body: SamplingFields, max_model_len: int) -> list[int]:
    """`truncate_prompt_tokens` k: keep the last k tokens (`truncation_side` "left", the default) or
    the first k ("right"); -1 means `max_model_len`."""
    k = body.truncate_prompt_tokens
    if k is None:
        return prompt
    k = max_model_len if k == -1 else k
    if k == 0:
        raise bad_request("truncate_prompt_tokens must be -1 or >= 1", "truncate_prompt_tokens")
    if len(prompt) <= k:
        return prompt
    return prompt[-k:] if body.truncation_side == "left" else prompt[:k]


def grammar(body: SamplingFields, eng: Engine) -> CompiledGrammar | None:
    try:
        spec = body.grammar_spec()
    except ValueError as e:
        raise bad_request(str(e), str(e).split(":", 1)[0]) from e
    if spec is None:
        return None
    field = _grammar_field(body)
    try:
        return eng.grammar_compiler.compile(spec)
    except ValueError as e:
        raise bad_request(f"{field}: {e}", field) from e


def _grammar_field(body: SamplingFields) -> str:
    for name in ("response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
                 "guided_grammar"):
        if getattr(body, name) is not None:
            return name
    return "structured_outputs"


def logit_bias(body: SamplingFields, vocab_size: int) -> dict[int, float]:
    out = {}
    for key, value in (body.logit_bias or {}).items():
        try:
            token = int(key)
        except ValueError:
            raise bad_request(f"logit_bias: key {key!r} is not a token id", "logit_bias") from None
        if not 0 <= token < vocab_size:
            raise bad_request(f"logit_bias: token id {token} is outside the vocabulary [0, {vocab_size})",
                              "logit_bias")
        out[token] = max(-LOGIT_BIAS_LIMIT, min(LOGIT_BIAS_LIMIT, value))
    return out


def bad_words(body: SamplingFields, tok) -> list[list[int]]:
    """Each bad word as tokens, alone and after a space (as vLLM bans both spellings)."""
    out: list[list[int]] = []
    for word in body.bad_words:
        if not word:
            raise bad_request("bad_words must be non-empty strings", "bad_words")
        for text in (word, " " + word.lstrip()):
            ids = tok.encode(text)
            if ids and ids not in out:
                out.append(ids)
    return out


class ParamsBuilder:
    """Builds each choice's `SamplingParams` from one body (the shared parts computed once)."""

    def __init__(self, body: SamplingFields, eng: Engine, max_tokens: int, logprobs: int | None,
                 prompt_logprobs: int | None) -> None:
        self.body = body
        self.max_tokens = max_tokens
        self.logprobs = logprobs
        self.prompt_logprobs = prompt_logprobs
        self.grammar = grammar(body, eng)
        self.logit_bias = logit_bias(body, eng.vocab_size)
        self.bad_words = bad_words(body, eng.tokenizer)
        if body.min_tokens > max_tokens:
            raise bad_request(f"min_tokens ({body.min_tokens}) must not exceed max_tokens ({max_tokens})",
                              "min_tokens")
        if body.prompt_logprobs is not None and body.stream:
            raise bad_request("prompt_logprobs are not available when stream is true", "prompt_logprobs")

    def params(self, choice: int) -> SamplingParams:
        b = self.body
        seed = None if b.seed is None else (b.seed + choice) % 2**64
        try:
            return SamplingParams(
                temperature=b.temperature, top_p=b.top_p, top_k=b.top_k, min_p=b.min_p, seed=seed,
                max_tokens=self.max_tokens, min_tokens=b.min_tokens, stop=b.stop_strings(),
                stop_token_ids=list(b.stop_token_ids), ignore_eos=b.ignore_eos,
                include_stop_str_in_output=b.include_stop_str_in_output, logprobs=self.logprobs,
                logprob_token_ids=b.logprob_token_ids, prompt_logprobs=self.prompt_logprobs,
                presence_penalty=b.presence_penalty, frequency_penalty=b.frequency_penalty,
                repetition_penalty=b.repetition_penalty, logit_bias=self.logit_bias,
                allowed_token_ids=b.allowed_token_ids, bad_words_token_ids=self.bad_words,
                skip_special_tokens=b.skip_special_tokens, grammar=self.grammar)
        except ValueError as e:
            msg = str(e).replace("SamplingParams.", "")
            field = msg.split(" ", 1)[0].rstrip(":")
            raise bad_request(msg, "bad_words" if field == "bad_words_token_ids" else field) from e
