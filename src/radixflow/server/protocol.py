"""OpenAI-compatible request bodies (pydantic), validated before anything reaches the engine.

Ranges follow the OpenAI API where it defines one (temperature in [0, 2], logprobs up to 20 as vLLM
allows). Fields outside this subset (penalties, logit_bias, tools, ...) are accepted and ignored.
Extensions, as vLLM names them: `top_k`, `ignore_eos`, `stop_token_ids`, `return_tokens_as_token_ids`;
and `namespace`, the prefix
cache namespace (requests share cached prefixes only inside one namespace; default "").
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, StrictInt, StrictStr

TokenIds = Annotated[list[StrictInt], Field(min_length=1)]
PromptInput = StrictStr | list[StrictStr] | TokenIds | list[TokenIds]


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, description="0 or -1 disables the top-k cut")
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1, description="a 64-bit integer")
    n: int = Field(1, ge=1, le=16, description="choices per prompt; each one is a branch")
    stop: StrictStr | list[StrictStr] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    return_tokens_as_token_ids: bool = False  # logprobs tokens as "token_id:N" (vLLM's extension)
    namespace: str = ""

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    prompt: PromptInput
    max_tokens: int = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False

    def prompt_list(self) -> list[str | list[int]]:
        """The prompts as a list: one string or one token-id list per branch group."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and isinstance(p[0], int):
            return [p]
        return list(p)


class ContentPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: StrictStr | list[ContentPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)

    def rendered_messages(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.text()} for m in self.messages]
