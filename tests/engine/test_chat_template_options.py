"""Tokenizer.apply_chat_template's request options: continue_final_message, a per-call template,
extra template variables, and the conflict between continuing and a generation prompt."""

from __future__ import annotations

import pytest

from radixflow.engine.tiny import resolve_model
from radixflow.engine.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_dir(resolve_model("tiny-qwen3"))


def test_continue_final_message_leaves_the_last_turn_open(tok):
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure, "}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=False, continue_final_message=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nSure,"
    with pytest.raises(ValueError, match="cannot both be true"):
        tok.apply_chat_template(msgs, add_generation_prompt=True, continue_final_message=True)


def test_per_call_template_and_variables(tok):
    text = tok.apply_chat_template([{"role": "user", "content": "x"}], template="{{ a }}|{{ messages[0].content }}",
                                   a="var")
    assert text == "var|x"
