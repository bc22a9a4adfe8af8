"""Tokenizers: a byte-level tokenizer for the tiny models, and a wrapper over any `tokenizer.json`.

The byte-level tokenizer has one token per byte (ids 0..255, so any text round-trips) plus special
tokens. `Tokenizer` wraps a `tokenizers.Tokenizer` with the bits the engine needs: encode/decode,
end-of-sequence ids, and the chat template (the directory's Jinja template when it has one, else
ChatML: `<|im_start|>{role}\\n{content}<|im_end|>\\n` per message, then `<|im_start|>assistant\\n`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_byte_tokenizer(special_tokens: tuple[str, ...] = SPECIAL_TOKENS) -> HFTokenizer:
    """256 byte tokens (id = byte value) followed by the special tokens, no merges."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_to_char = _bytes_to_unicode()
    vocab = {byte_to_char[b]: b for b in range(256)}
    assert set(vocab) == set(alphabet)
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(special_tokens))
    return tok


def save_byte_tokenizer(directory: Path, eos_token: str = "<|im_end|>") -> None:
    """Write tokenizer.json and tokenizer_config.json (with the ChatML template) into `directory`."""
    build_byte_tokenizer().save(str(directory / "tokenizer.json"))
    cfg = {"eos_token": eos_token, "pad_token": "<|endoftext|>", "chat_template": CHATML_TEMPLATE,
           "model_max_length": 32768, "tokenizer_class": "PreTrainedTokenizerFast"}
    (directory / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))


def _bytes_to_unicode() -> dict[int, str]:
    """The GPT-2 byte -> printable character map that the ByteLevel pre-tokenizer uses."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


class Tokenizer:
    """Encode/decode and chat formatting over a `tokenizer.json`."""

    def __init__(self, tok: HFTokenizer, chat_template: str | None = None,
                 eos_tokens: tuple[str, ...] = ()) -> None:
        self._tok = tok
        self.chat_template = chat_template
        ids = [tok.token_to_id(t) for t in eos_tokens]
        self.eos_token_ids: tuple[int, ...] = tuple(i for i in ids if i is not None)

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        f = path / "tokenizer.json"
        if not f.is_file():
            raise FileNotFoundError(f"{path} has no tokenizer.json")
        cfg: dict[str, Any] = {}
        if (path / "tokenizer_config.json").is_file():
            cfg = json.loads((path / "tokenizer_config.json").read_text())
        template = cfg.get("chat_template")
        if template is None and (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text()
        eos = cfg.get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        names = tuple(t for t in (eos, "<|im_end|>", "<|endoftext|>") if t)
        return cls(HFTokenizer.from_file(str(f)), template, tuple(dict.fromkeys(names)))

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def backend(self) -> HFTokenizer:
        """The wrapped `tokenizers.Tokenizer` (structured output reads its vocabulary)."""
        return self._tok

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; `add_special_tokens` applies the tokenizer's post-processor (BOS...)."""
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True,
                            template: str | None = None, continue_final_message: bool = False,
                            **kwargs: Any) -> str:
        """Render messages ({'role', 'content'}) with `template`, the directory's template, or ChatML.

        `continue_final_message` leaves the last message open (the text ends with its content, as
        transformers does it) so the model continues it; `kwargs` are extra template variables."""
        for i, m in enumerate(messages):
            if "role" not in m or "content" not in m:
                raise ValueError(f"message {i} needs 'role' and 'content' keys, got {sorted(m)}")
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
        compiled = _compile(template or self.chat_template or CHATML_TEMPLATE)
        variables = {"eos_token": self._tok.id_to_token(self.eos_token_id or 0), **kwargs}
        text = compiled.render(**variables, messages=messages, add_generation_prompt=add_generation_prompt)
        if continue_final_message:
            final = str(messages[-1]["content"]).strip()
            cut = text.rfind(final)
            if not final or cut < 0:
                raise ValueError("continue_final_message: the rendered prompt does not contain the final "
                                 "message's content")
            text = text[:cut + len(final)]
        return text

    def encode_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True,
                    add_special_tokens: bool = False, **kwargs: Any) -> list[int]:
        return self.encode(self.apply_chat_template(messages, add_generation_prompt, **kwargs),
                           add_special_tokens)


def _compile(source: str):
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # only needed for chat formatting

    def raise_exception(msg: str) -> None:
        raise ValueError(f"chat template: {msg}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)
