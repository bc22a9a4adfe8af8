"""Tokenizers: a byte-level tokenizer for the tiny models, and a wrapper over any `tokenizer.json`.

The byte-level tokenizer has one token per byte (ids 0..255, so any text round-trips) plus special
tokens. `Tokenizer` wraps a `tokenizers.Tokenizer` with the bits the engine needs: encode/decode,
end-of-sequence ids, and the chat template (the directory's Jinja template when it has one, else
ChatML: `<|im_start|>{role}\\n{content}<|im_end|>\\n` per message, then `<|im_start|>assistant\\n`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
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


_CHAR_TO_BYTE = {c: b for b, c in _bytes_to_unicode().items()}
_BATCH = 256  # texts per call into the Rust tokenizer: the GIL is retaken between calls


class PromptTooLong(ValueError):
    def __init__(self, index: int, tokens: int | None, limit: int, chars: int = 0) -> None:
        if tokens is not None:
            super().__init__(f"the prompt is {tokens} tokens, more than max_model_len {limit}")
        else:
            super().__init__(f"the prompt ({chars} characters) is longer than max_model_len {limit} tokens")
        self.index = index


class Tokenizer:
    """Encode/decode and chat formatting over a `tokenizer.json`."""

    def __init__(self, tok: HFTokenizer, chat_template: str | None = None,
                 eos_tokens: tuple[str, ...] = ()) -> None:
        self._tok = tok
        self.chat_template = chat_template
        self._added: dict | None = None  # id -> AddedToken, built on first use
        self._cover: int | None = None  # see _max_token_chars
        self._byte_level = False
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

    def encode(self, text: str, add_special_tokens: bool = False, limit: int | None = None) -> list[int]:
        """Token ids of `text`; `add_special_tokens` applies the tokenizer's post-processor (BOS...);
        with `limit`, a `PromptTooLong` instead of a list longer than it."""
        return self.encode_batch([text], limit, add_special_tokens)[0]

    def encode_batch(self, texts: list[str], limit: int | None = None,
                     add_special_tokens: bool = False) -> list[list[int]]:
        """Token ids of each text. The Rust tokenizer runs with the GIL released (its batch calls
        do; its `encode` does not), a slice at a time, so other threads keep running; the fast
        variant skips character offsets, which nobody reads (and which take time to free). With `limit`,
        a `PromptTooLong` naming the first text longer than it; a text with more characters than
        `limit` tokens could ever cover is refused without being tokenized."""
        return list(self.iter_encode(texts, limit, add_special_tokens))

    def iter_encode(self, texts: list[str], limit: int | None = None,
                    add_special_tokens: bool = False) -> Iterator[list[int]]:
        """`encode_batch` one text at a time (a caller keeping 100k prompts can store them compactly)."""
        cover = self._max_token_chars()
        for start in range(0, len(texts), _BATCH):
            chunk = texts[start:start + _BATCH]
            if limit is not None and cover is not None:
                for i, t in enumerate(chunk):
                    if len(t) > limit * cover:
                        raise PromptTooLong(start + i, None, limit, len(t))
            for i, enc in enumerate(self._tok.encode_batch_fast(chunk, add_special_tokens=add_special_tokens)):
                if limit is not None and len(enc) > limit:
                    raise PromptTooLong(start + i, len(enc), limit)
                yield enc.ids

    def _max_token_chars(self) -> int | None:
        """The most text characters one token can stand for (tokens >= characters / this), or None
        when a normalizer may shrink the text before tokenizing."""
        if self._cover is None:
            if self._tok.normalizer is not None:
                self._cover = 0
            else:
                pieces = self._tok.get_vocab(with_added_tokens=True)
                self._cover = max((len(p.encode("utf-8")) for p in pieces), default=1)
        return self._cover or None

    def is_special(self, token_id: int) -> bool:
        """A special added token (decode(..., skip_special_tokens=True) leaves it out)."""
        self._index_added()
        t = self._added.get(token_id)
        return t is not None and t.special

    def _index_added(self) -> None:
        if self._added is None:
            self._added = dict(self._tok.get_added_tokens_decoder())
            self._byte_level = b'"ByteLevel"' in self._tok.decoder.__getstate__() if self._tok.decoder else False

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for: a byte-level piece maps back through GPT-2's byte table,
        a byte-fallback piece `<0xNN>` is that byte, an added token is its text."""
        self._index_added()
        if token_id in self._added:
            return self._added[token_id].content.encode("utf-8")
        piece = self._tok.id_to_token(token_id)
        if piece is None:  # a model id the tokenizer has no piece for (model vocab > tokenizer vocab)
            return b""
        if self._byte_level and all(c in _CHAR_TO_BYTE for c in piece):
            return bytes(_CHAR_TO_BYTE[c] for c in piece)
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)])
        return piece.replace("\u2581", " ").encode("utf-8")  # SentencePiece's word marker is a space

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
