"""Every field vLLM 0.33's OpenAI server accepts is declared by radixflow's request bodies (and so
honoured, refused by name, or ignored by design), and every field radixflow ignores says why.
Needs vLLM (scripts/install_vllm.sh); skipped otherwise, failed under RADIXFLOW_REQUIRE_VLLM=1."""

from __future__ import annotations

import os

import pytest

from radixflow.server.protocol import IGNORED, ChatCompletionRequest, CompletionRequest


def _vllm_protocol():
    try:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as VChat
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest as VCompletion
    except ImportError as exc:
        if os.environ.get("RADIXFLOW_REQUIRE_VLLM") == "1":
            pytest.fail(f"RADIXFLOW_REQUIRE_VLLM=1 but vLLM is not importable ({exc})", pytrace=False)
        pytest.skip(f"vLLM is not importable ({exc})")
    return VCompletion, VChat


def test_every_vllm_field_is_declared():
    v_completion, v_chat = _vllm_protocol()
    assert set(v_completion.model_fields) <= set(CompletionRequest.model_fields)
    assert set(v_chat.model_fields) <= set(ChatCompletionRequest.model_fields)


def test_ignored_fields_are_declared_and_give_a_reason():
    fields = set(CompletionRequest.model_fields) | set(ChatCompletionRequest.model_fields)
    assert set(IGNORED) <= fields
    assert all(len(why) > 20 for why in IGNORED.values())
