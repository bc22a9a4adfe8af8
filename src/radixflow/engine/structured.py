"""Structured output with xgrammar: a constraint (JSON schema, any JSON, regex, choice, EBNF) is
compiled once per request into a grammar over the model's vocabulary; each branch keeps its own
matcher, whose token bitmask the sampler applies to the branch's row before anything else.

`GrammarSpec` is the constraint as the server parsed it; `GrammarCompiler` (one per engine: it holds
the vocabulary, xgrammar caches compiled grammars) turns it into a `CompiledGrammar`;
`GrammarState` is one branch's matcher: `mask(row)` before sampling, `accept(token)` after.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

import torch

GrammarKind = Literal["json_schema", "json_object", "regex", "choice", "grammar"]


@dataclass(frozen=True)
class GrammarSpec:
    """One structured-output constraint. `value`: the schema (JSON text), the regex, the choices
    (a JSON list) or the EBNF grammar; unused for `json_object`."""

    kind: GrammarKind
    value: str = ""
    any_whitespace: bool = True  # JSON: allow free whitespace between tokens (vLLM's default)

    @classmethod
    def choice(cls, choices: list[str]) -> GrammarSpec:
        if not choices or not all(isinstance(c, str) for c in choices):
            raise ValueError("choice must be a non-empty list of strings")
        return cls("choice", json.dumps(choices))


@dataclass(frozen=True)
class CompiledGrammar:
    spec: GrammarSpec
    compiled: object  # xgrammar.CompiledGrammar
    vocab_size: int


class GrammarCompiler:
    """Compiles specs for one tokenizer and model vocabulary (size of the logits row)."""

    def __init__(self, tokenizer, vocab_size: int) -> None:
        import xgrammar as xgr  # imported on first structured request only

        self._xgr = xgr
        self.vocab_size = vocab_size
        hf = tokenizer.backend
        encoded = [""] * vocab_size
        for token, i in hf.get_vocab(with_added_tokens=True).items():
            if i < vocab_size:
                encoded[i] = token
        meta = xgr.TokenizerInfo._detect_metadata_from_hf(hf.to_str())
        info = xgr.TokenizerInfo(encoded, vocab_type=meta["vocab_type"], vocab_size=vocab_size,
                                 stop_token_ids=list(tokenizer.eos_token_ids) or None,
                                 add_prefix_space=meta["add_prefix_space"])
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """The compiled grammar; ValueError naming the problem for a bad schema, regex or grammar."""
        c = self._compiler
        try:
            # compact separators when free whitespace is off, as vLLM's xgrammar backend does
            seps = None if spec.any_whitespace else (",", ":")
            if spec.kind in ("json_schema", "json_object"):
                schema = spec.value if spec.kind == "json_schema" else '{"type": "object"}'  # vLLM's json_object
                g = c.compile_json_schema(schema, any_whitespace=spec.any_whitespace, separators=seps)
            elif spec.kind == "regex":
                g = c.compile_regex(spec.value)
            elif spec.kind == "choice":
                alts = " | ".join(_ebnf_string(s) for s in json.loads(spec.value))
                g = c.compile_grammar(f"root ::= {alts}")
            elif spec.kind == "grammar":
                g = c.compile_grammar(spec.value)
            else:
                raise ValueError(f"unknown grammar kind {spec.kind!r}")
        except (RuntimeError, ValueError, TypeError) as e:
            raise ValueError(f"{spec.kind}: xgrammar cannot compile it: {_first_line(e)}") from e
        return CompiledGrammar(spec, g, self.vocab_size)


class GrammarState:
    """One branch's matcher over a compiled grammar."""

    def __init__(self, grammar: CompiledGrammar) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self.matcher = xgr.GrammarMatcher(grammar.compiled)
        self.bitmask = xgr.allocate_token_bitmask(1, grammar.vocab_size)

    @property
    def terminated(self) -> bool:
        """The grammar is complete and its stop token was accepted: nothing may follow."""
        return self.matcher.is_terminated()

    def mask(self, row: torch.Tensor) -> torch.Tensor:
        """The row with every token the grammar does not allow next set to -inf."""
        self.matcher.fill_next_token_bitmask(self.bitmask, 0)
        out = row.clone() if row.device.type == "cpu" else row.cpu()
        self._xgr.apply_token_bitmask_inplace(out, self.bitmask)
        return out.to(row.device)

    def accept(self, token: int) -> None:
        if not self.matcher.accept_token(token):
            raise RuntimeError(f"grammar matcher rejected token {token} that its own mask allowed")


def _ebnf_string(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)  # JSON escapes (\" \\ \n) are EBNF string escapes too


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
