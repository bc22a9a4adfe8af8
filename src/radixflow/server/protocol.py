"""OpenAI-compatible request bodies (pydantic), validated before anything reaches the engine.

Every field vLLM 0.33's OpenAI server accepts for completions and chat is declared here and is
either honoured, or refused with a 400 naming it (`unsupported()`: beam search, tools, multimodal,
...) unless it holds its default, or listed in `IGNORED` with the reason it is ignored by design.
Any other field is refused (`extra="forbid"`). An explicit `null` means the field's default.
Ranges follow the OpenAI API where it defines one, else vLLM's.
Extensions beyond vLLM: `namespace`, the prefix-cache namespace (requests share cached prefixes only
inside one namespace; default ""), and the legacy `guided_*` structured-output fields.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, model_validator

from radixflow.engine.structured import GrammarSpec

TokenIds = Annotated[list[StrictInt], Field(min_length=1)]
PromptInput = StrictStr | list[StrictStr] | TokenIds | list[TokenIds]
_INT64 = 2**63

# Accepted and not acted on, by design (docs/server.md repeats these reasons).
IGNORED = {
    "user": "an end-user id for the caller's own abuse monitoring; radixflow keeps no per-user state",
    "session_id": "a routing hint for multi-engine deployments; one server is one engine",
    "return_token_offsets": "vLLM itself ignores it outside its /render endpoints",
    "mm_payload": "vLLM itself ignores it outside its /render endpoints",
    "return_mm_kwargs": "vLLM itself ignores it outside its /render endpoints",
    "parallel_tool_calls": "only meaningful with tools, which are refused",
    "include_reasoning": "no reasoning parser runs, so there is no reasoning content to include or drop",
}


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, data: Any) -> Any:
        """`"field": null` means the field's default, as in the OpenAI API (the `openai` client sends
        null for a None argument)."""
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {k: v for k, v in data.items()
                if v is not None or k not in fields or fields[k].is_required()}


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class JsonSchemaFormat(_Body):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema")
    strict: bool | None = None

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    format: Any = None  # structural_tag only (refused)


class StructuredOutputs(_Body):
    """vLLM's `structured_outputs`: exactly one of json, regex, choice, grammar, json_object."""

    json_: str | dict[str, Any] | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[StrictStr] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False  # xgrammar's strict mode always applies (see IGNORED)
    whitespace_pattern: str | None = None

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class SamplingFields(_Body):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, description="0 or -1 disables the top-k cut")
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    seed: int | None = Field(None, ge=-_INT64, lt=_INT64)
    n: int = Field(1, ge=1, le=16, description="choices per prompt; each one is a branch")
    stop: StrictStr | list[StrictStr] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, gt=0.0)
    logit_bias: dict[str, float] | None = None
    min_tokens: int = Field(0, ge=0)
    allowed_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    bad_words: list[StrictStr] = Field(default_factory=list)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    truncation_side: Literal["left", "right"] = "left"
    prompt_logprobs: int | None = Field(None, ge=-1)
    logprob_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    priority: int = Field(0, ge=-_INT64, lt=_INT64, description="lower is scheduled earlier")
    cache_salt: str | None = Field(None, min_length=1, max_length=1024)
    request_id: str | None = Field(None, min_length=1, max_length=256)
    return_tokens_as_token_ids: bool = False  # logprobs tokens as "token_id:N" (vLLM's extension)
    return_token_ids: bool = False
    namespace: str = ""
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[StrictStr] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None
    # refused unless at their default (see `unsupported`)
    use_beam_search: bool = False
    length_penalty: float = 1.0
    watermarking: bool = False
    prompt_embeds: Any = None
    return_weight_versions: bool = False
    routed_experts_prompt_start: int = 0
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None
    repetition_detection: dict[str, Any] | None = None
    thinking_token_budget: int | None = None
    stream_interval: int | None = None
    # ignored by design (IGNORED)
    user: str | None = None
    session_id: str | None = None
    return_token_offsets: bool = False
    mm_payload: str | None = None
    return_mm_kwargs: bool | None = None

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def unsupported(self) -> list[tuple[str, str]]:
        """(field, why) for every field set to something radixflow does not do."""
        out = []
        refuse = [
            ("use_beam_search", self.use_beam_search, "beam search is not supported"),
            ("length_penalty", self.length_penalty != 1.0, "it only applies to beam search, which is not supported"),
            ("watermarking", self.watermarking, "watermarking is not supported"),
            ("prompt_embeds", self.prompt_embeds is not None, "prompt embeddings are not supported"),
            ("return_weight_versions", self.return_weight_versions, "weight versions are not tracked"),
            ("routed_experts_prompt_start", self.routed_experts_prompt_start != 0, "no MoE routing data"),
            ("kv_transfer_params", self.kv_transfer_params is not None, "disaggregated serving is not supported"),
            ("ec_transfer_params", self.ec_transfer_params is not None, "disaggregated serving is not supported"),
            ("vllm_xargs", bool(self.vllm_xargs), "no custom extensions are installed"),
            ("repetition_detection", self.repetition_detection is not None, "repetition detection is not "
             "supported"),
            ("thinking_token_budget", self.thinking_token_budget not in (None, -1), "no reasoning parser runs"),
            ("stream_interval", self.stream_interval not in (None, 1), "streams send every round's tokens"),
            ("spaces_between_special_tokens", not self.spaces_between_special_tokens,
             "fast tokenizers decode special tokens without separators"),
            ("guided_whitespace_pattern", self.guided_whitespace_pattern is not None,
             "xgrammar takes no whitespace pattern"),
            ("logprob_token_ids", self.logprob_token_ids is not None and self._logprobs_off(),
             "it needs logprobs to be set"),
        ]
        out += [(f, f"{f} is not supported: {why}") for f, on, why in refuse if on]
        if self.stream_options is not None and not self.stream:
            out.append(("stream_options", "stream_options is only allowed with stream: true"))
        if self.stream_options is not None and self.stream_options.continuous_usage_stats:
            out.append(("stream_options.continuous_usage_stats", "stream_options.continuous_usage_stats is "
                        "not supported: usage comes once, in the last chunk (include_usage)"))
        so = self.structured_outputs
        if so is not None:
            if so.structural_tag is not None:
                out.append(("structured_outputs.structural_tag", "structured_outputs.structural_tag is not "
                            "supported: use json, regex, choice or grammar"))
            if so.whitespace_pattern is not None:
                out.append(("structured_outputs.whitespace_pattern", "structured_outputs.whitespace_pattern "
                            "is not supported: xgrammar takes no whitespace pattern"))
        if self.response_format is not None and self.response_format.type == "structural_tag":
            out.append(("response_format", "response_format type 'structural_tag' is not supported: use "
                        "'json_object' or 'json_schema'"))
        return out

    def _logprobs_off(self) -> bool:
        return False

    def grammar_spec(self) -> GrammarSpec | None:
        """The one structured-output constraint, from whichever field carries it; ValueError (message
        starts with the field) when several are set or one is malformed."""
        found: list[tuple[str, GrammarSpec]] = []
        rf = self.response_format
        if rf is not None and rf.type == "json_object":
            found.append(("response_format", GrammarSpec("json_object")))
        elif rf is not None and rf.type == "json_schema":
            if rf.json_schema is None or rf.json_schema.schema_ is None:
                raise ValueError("response_format: type 'json_schema' needs json_schema.schema")
            found.append(("response_format", GrammarSpec("json_schema", json.dumps(rf.json_schema.schema_))))
        so = self.structured_outputs
        if so is not None:
            ws = not so.disable_any_whitespace
            kinds = [("json", so.json_), ("regex", so.regex), ("choice", so.choice), ("grammar", so.grammar),
                     ("json_object", so.json_object or None)]
            set_ = [(k, v) for k, v in kinds if v is not None]
            if len(set_) != 1 and so.structural_tag is None:
                raise ValueError("structured_outputs: set exactly one of json, regex, choice, grammar, "
                                 f"json_object (got {', '.join(k for k, _ in set_) or 'none'})")
            for k, v in set_:
                found.append((f"structured_outputs.{k}", _spec(k, v, ws)))
        legacy = [("guided_json", "json", self.guided_json), ("guided_regex", "regex", self.guided_regex),
                  ("guided_choice", "choice", self.guided_choice), ("guided_grammar", "grammar", self.guided_grammar)]
        found += [(name, _spec(k, v, True)) for name, k, v in legacy if v is not None]
        if len(found) > 1:
            raise ValueError(f"{found[0][0]}: only one structured-output constraint per request, got "
                             f"{', '.join(n for n, _ in found)}")
        return found[0][1] if found else None


def _spec(kind: str, value: Any, any_whitespace: bool) -> GrammarSpec:
    if kind == "json":
        text = value if isinstance(value, str) else json.dumps(value)
        return GrammarSpec("json_schema", text, any_whitespace)
    if kind == "json_object":
        return GrammarSpec("json_object", "", any_whitespace)
    if kind == "choice":
        return GrammarSpec.choice(value)
    return GrammarSpec(kind, value)


class CompletionRequest(SamplingFields):
    prompt: PromptInput
    max_tokens: int = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    add_special_tokens: bool = True
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)

    def prompt_list(self) -> list[str | list[int]]:
        """The prompts as a list: one string or one token-id list per branch group."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and isinstance(p[0], int):
            return [p]
        return list(p)

    def unsupported(self) -> list[tuple[str, str]]:
        out = super().unsupported()
        if self.suffix:
            out.append(("suffix", "suffix is not supported: no insertion (fill-in-the-middle) mode"))
        if self.best_of not in (None, 1):
            out.append(("best_of", "best_of > 1 is not supported: ask for n choices and rank them yourself"))
        return out

    def _logprobs_off(self) -> bool:
        return self.logprobs is None


class ContentPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: StrictStr | list[ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[Any] | None = None
    refusal: str | None = None

    @model_validator(mode="after")
    def _content_rules(self) -> ChatMessage:
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content (only assistant messages may omit it)")
        if self.tool_calls:
            raise ValueError("tool_calls are not supported (tools are not supported)")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def rendered(self) -> dict[str, str]:
        m = {"role": self.role, "content": self.text()}
        for k in ("name", "tool_call_id"):
            if getattr(self, k) is not None:
                m[k] = getattr(self, k)
        return m


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int = Field(0, ge=0, le=20)
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    documents: list[dict[str, str]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_prompt_text: bool = False
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    reasoning_effort: str | None = None
    media_io_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    include_reasoning: bool = True

    def rendered_messages(self) -> list[dict[str, str]]:
        return [m.rendered() for m in self.messages]

    def template_kwargs(self) -> dict[str, Any]:
        """Variables for the chat template: `chat_template_kwargs`, then `documents`."""
        kw = dict(self.chat_template_kwargs or {})
        for reserved in ("messages", "add_generation_prompt"):
            if reserved in kw:
                raise ValueError(f"chat_template_kwargs: {reserved!r} is set by the request itself")
        if self.documents is not None:
            kw["documents"] = self.documents
        return kw

    def unsupported(self) -> list[tuple[str, str]]:
        out = super().unsupported()
        refuse = [
            ("tools", bool(self.tools), "tool calling is not supported"),
            ("tool_choice", self.tool_choice not in (None, "none", "auto"), "tool calling is not supported"),
            ("functions", bool(self.functions), "function calling is not supported"),
            ("function_call", self.function_call not in (None, "none", "auto"), "function calling is not "
             "supported"),
            ("reasoning_effort", self.reasoning_effort is not None, "no reasoning parser runs"),
            ("media_io_kwargs", self.media_io_kwargs is not None, "multimodal input is not supported"),
            ("mm_processor_kwargs", self.mm_processor_kwargs is not None, "multimodal input is not supported"),
        ]
        out += [(f, f"{f} is not supported: {why}") for f, on, why in refuse if on]
        if self.top_logprobs and not self.logprobs:
            out.append(("top_logprobs", "top_logprobs needs logprobs: true"))
        if self.continue_final_message and self.add_generation_prompt:
            out.append(("continue_final_message", "continue_final_message cannot be used with "
                        "add_generation_prompt (set add_generation_prompt to false)"))
        return out

    def _logprobs_off(self) -> bool:
        return not self.logprobs
