"""Byte-level tokenizer and the chat template."""

from __future__ import annotations

import json

import pytest

from radixflow.engine.tokenizer import CHATML_TEMPLATE, Tokenizer, save_byte_tokenizer


@pytest.fixture
def tok(tmp_path):
    save_byte_tokenizer(tmp_path)
    return Tokenizer.from_dir(tmp_path)


@pytest.mark.parametrize("text", ["hello world", "  leading spaces\n\ttabs", "ünïcødé ✓ 漢字 🙂", ""])
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert len(ids) == len(text.encode("utf-8"))
    assert all(0 <= i < 256 for i in ids)
    assert tok.decode(ids) == text


def test_byte_ids_are_byte_values(tok):
    assert tok.encode("A") == [65]


def test_special_tokens(tok):
    assert tok.vocab_size == 259
    assert tok.encode("<|im_start|>") == [257]
    assert tok.eos_token_id == 258 and 256 in tok.eos_token_ids
    assert tok.decode(tok.encode("<|im_start|>hi<|im_end|>")) == "hi"
    assert tok.decode([257, 104, 105], skip_special_tokens=False) == "<|im_start|>hi"


def test_chat_template_from_directory_and_fallback(tmp_path, tok):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    want = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.chat_template == CHATML_TEMPLATE
    assert tok.apply_chat_template(msgs) == want
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    fallback = Tokenizer.from_dir(tmp_path)
    assert fallback.chat_template is None and fallback.apply_chat_template(msgs) == want
    assert fallback.encode_chat(msgs)[:1] == [257]


def test_custom_template(tmp_path):
    save_byte_tokenizer(tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert Tokenizer.from_dir(tmp_path).apply_chat_template([{"role": "user", "content": "x"}]) == "[user]x"


def test_bad_messages(tok):
    with pytest.raises(ValueError, match="role"):
        tok.apply_chat_template([{"content": "x"}])
