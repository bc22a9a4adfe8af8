"""Choosing next tokens from logits: sampling parameters (validated) and a per-row sampler.

The per-row pipeline follows vLLM's v1 sampler, in its order:
1. the structured-output grammar mask (tokens the grammar forbids are -inf),
2. `allowed_token_ids` (everything else is -inf), then `bad_words`,
3. `min_tokens`: the row's stop tokens are -inf until it has `min_tokens` output tokens,
4. `logit_bias` (added to the logits),
5. penalties, vLLM's formulas: `repetition_penalty` r divides a positive logit and multiplies a
   negative one for every token seen in the prompt or the output; `frequency_penalty` f and
   `presence_penalty` p give `logit -= f * count_in_output + p * (count_in_output > 0)`,
6. greedy (argmax) when temperature < 1e-5 (as vLLM); otherwise logits / temperature, `min_p` (drop tokens whose
   probability is below min_p × the top probability), top-k, top-p (nucleus), then one draw from the
   row's own `torch.Generator` (seeded rows are reproducible whatever else is in the batch).

A row whose settings mask every token falls back to the grammar mask alone, else the raw logits.
Reported logprobs are those of the model's distribution (log-softmax of the raw logits), not of the
modified one, as vLLM reports them by default.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

GREEDY_BELOW = 1e-5  # as vLLM: a smaller temperature is greedy (logits / 1e-300 overflow to inf, then NaN)


@dataclass
class SamplingParams:
    """Per-request sampling settings. `max_new_tokens` is an alias of `max_tokens`."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                     # 0 (or -1) = no top-k cut
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0                # stop tokens are suppressed until this many tokens are out
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None        # k: also return the top-k logprobs (0 = only the chosen token's)
    logprob_token_ids: list[int] | None = None  # report these tokens' logprobs instead of the top-k
    prompt_logprobs: int | None = None  # k: logprob of every prompt token (and its top-k); -1 = all
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    allowed_token_ids: list[int] | None = None
    bad_words_token_ids: list[list[int]] = field(default_factory=list)  # tokenized bad words
    skip_special_tokens: bool = True
    grammar: object = None             # a compiled grammar (engine/structured.py), or None
    max_new_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens is not None:
            self.max_tokens = self.max_new_tokens
        self.max_new_tokens = self.max_tokens
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self._validate()

    def _validate(self) -> None:
        ids = lambda xs: all(isinstance(t, int) and t >= 0 for t in xs)  # noqa: E731
        checks = [
            ("temperature", self.temperature >= 0, "must be >= 0"),
            ("top_p", 0 < self.top_p <= 1, "must be in (0, 1]"),
            ("top_k", self.top_k == -1 or self.top_k >= 0, "must be -1, 0 (disabled) or a positive count"),
            ("min_p", 0 <= self.min_p <= 1, "must be in [0, 1]"),
            ("max_tokens", isinstance(self.max_tokens, int) and self.max_tokens >= 1, "must be an int >= 1"),
            ("min_tokens", isinstance(self.min_tokens, int) and 0 <= self.min_tokens <= self.max_tokens,
             "must be an int in [0, max_tokens]"),
            ("logprobs", self.logprobs is None or 0 <= self.logprobs <= 20, "must be None or in [0, 20]"),
            ("prompt_logprobs", self.prompt_logprobs is None or self.prompt_logprobs >= -1,
             "must be None, -1 (all) or >= 0"),
            ("logprob_token_ids", self.logprob_token_ids is None or ids(self.logprob_token_ids),
             "must be non-negative ints"),
            ("presence_penalty", -2 <= self.presence_penalty <= 2, "must be in [-2, 2]"),
            ("frequency_penalty", -2 <= self.frequency_penalty <= 2, "must be in [-2, 2]"),
            ("repetition_penalty", self.repetition_penalty > 0, "must be > 0"),
            ("logit_bias", ids(self.logit_bias), "keys must be non-negative token ids"),
            ("allowed_token_ids", self.allowed_token_ids is None or (self.allowed_token_ids and
                                                                     ids(self.allowed_token_ids)),
             "must be None or a non-empty list of token ids"),
            ("bad_words_token_ids", all(w and ids(w) for w in self.bad_words_token_ids),
             "must be non-empty token-id lists"),
            ("stop_token_ids", ids(self.stop_token_ids), "must be non-negative ints"),
            ("stop", all(isinstance(s, str) and s for s in self.stop), "must be non-empty strings"),
        ]
        for name, ok, why in checks:
            if not ok:
                raise ValueError(f"SamplingParams.{name} {why}, got {getattr(self, name)!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    def check_vocab(self, vocab_size: int) -> None:
        """Every token id the params name lies in [0, vocab_size) (ValueError naming the field)."""
        fields = {"logit_bias": list(self.logit_bias), "allowed_token_ids": self.allowed_token_ids or [],
                  "stop_token_ids": self.stop_token_ids, "logprob_token_ids": self.logprob_token_ids or [],
                  "bad_words": [t for w in self.bad_words_token_ids for t in w]}
        for name, tokens in fields.items():
            bad = [t for t in tokens if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(f"SamplingParams.{name}: token id {bad[0]} is outside the vocabulary "
                                 f"[0, {vocab_size})")


def first_stop(text: str, stops: list[str], floor: int = 0) -> tuple[int, str] | None:
    """The earliest stop string in `text` that ends past character `floor` (min_tokens: a stop
    string inside the first min_tokens - 1 tokens' text does not count), as (index, string)."""
    hits = [(i, s) for s in stops if (i := text.find(s, max(0, floor - len(s) + 1))) >= 0]
    return min(hits, key=lambda h: h[0]) if hits else None


def make_generator(params: SamplingParams, device: str | torch.device = "cpu") -> torch.Generator:
    """The row's generator: seeded from `params.seed`, else from fresh OS entropy."""
    gen = torch.Generator(device=device)
    if params.seed is not None:
        gen.manual_seed(params.seed)
    else:
        gen.seed()
    return gen


@dataclass
class RowContext:
    """What a row's processors read besides the logits: the branch's tokens, its stop tokens (masked
    by `min_tokens`) and its grammar matcher (`engine/structured.py`, or None)."""

    prompt: Sequence[int] = ()
    output: Sequence[int] = ()
    stop_token_ids: frozenset[int] = frozenset()
    grammar: object = None


@dataclass
class SampleOutput:
    """Per row: chosen token, its logprob (when asked) and the top-k (token, logprob) pairs."""

    token_ids: list[int]
    logprobs: list[float | None]
    top_logprobs: list[list[tuple[int, float]] | None]


def apply_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Logits with everything below the k-th largest set to -inf (ties at the k-th kept)."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches p (at least one)."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    before = probs.cumsum(-1) - probs          # mass of strictly more likely tokens
    drop_sorted = before >= p
    drop_sorted[..., 0] = False  # the most likely token stays even when p rounds to 0 in float32
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def apply_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times the most likely token's."""
    if min_p <= 0:
        return logits
    probs = logits.softmax(-1)
    return logits.masked_fill(probs < min_p * probs.max(-1, keepdim=True).values, float("-inf"))


def apply_penalties(row: torch.Tensor, p: SamplingParams, prompt: Sequence[int],
                    output: Sequence[int]) -> torch.Tensor:
    """vLLM's repetition, frequency and presence penalties on one row of logits."""
    vocab = row.shape[-1]
    counts = torch.bincount(torch.tensor(list(output), dtype=torch.long), minlength=vocab)[:vocab]
    counts = counts.to(row.device, row.dtype)
    if p.repetition_penalty != 1:
        seen = counts > 0
        if prompt:
            seen[torch.tensor(list(prompt), dtype=torch.long, device=row.device)] = True
        r = p.repetition_penalty
        row = torch.where(seen, torch.where(row > 0, row / r, row * r), row)
    return row - p.frequency_penalty * counts - p.presence_penalty * (counts > 0).to(row.dtype)


def banned_bad_words(bad_words: list[list[int]], output: Sequence[int]) -> list[int]:
    """Last tokens of the bad words whose other tokens end the output (vLLM's rule)."""
    out = []
    for w in bad_words:
        head = w[:-1]
        if not head or (len(output) >= len(head) and list(output[len(output) - len(head):]) == head):
            out.append(w[-1])
    return out


def process_row(row: torch.Tensor, p: SamplingParams, ctx: RowContext) -> torch.Tensor:
    """Steps 1-5 of the pipeline (module docstring): the logits the row samples from."""
    neg = float("-inf")
    if ctx.grammar is not None:
        row = ctx.grammar.mask(row)
    if p.allowed_token_ids is not None:
        keep = torch.zeros_like(row, dtype=torch.bool)
        keep[torch.tensor(p.allowed_token_ids, dtype=torch.long, device=row.device)] = True
        row = row.masked_fill(~keep, neg)
    if p.bad_words_token_ids:
        banned = banned_bad_words(p.bad_words_token_ids, ctx.output)
        if banned:
            row = row.index_fill(0, torch.tensor(banned, dtype=torch.long, device=row.device), neg)
    if len(ctx.output) < p.min_tokens and ctx.stop_token_ids:
        stops = [t for t in ctx.stop_token_ids if t < row.shape[-1]]
        row = row.index_fill(0, torch.tensor(stops, dtype=torch.long, device=row.device), neg)
    if p.logit_bias:
        ids = torch.tensor(list(p.logit_bias), dtype=torch.long, device=row.device)
        bias = torch.tensor(list(p.logit_bias.values()), dtype=row.dtype, device=row.device)
        row = row.index_add(0, ids, bias)
    if p.has_penalties:
        row = apply_penalties(row, p, ctx.prompt, ctx.output)
    return row


def _fallback(row: torch.Tensor, ctx: RowContext) -> torch.Tensor:
    """When the row's own settings mask every token (say `allowed_token_ids` = only EOS with
    `min_tokens`, or a completed grammar that allows only EOS), the grammar alone decides, else the
    raw logits: one request's contradiction must not fail the whole batch."""
    if ctx.grammar is not None:
        masked = ctx.grammar.mask(row)
        if bool(torch.isfinite(masked).any()):
            return masked
    return row


def _needs_processing(p: SamplingParams, ctx: RowContext) -> bool:
    return (ctx.grammar is not None or p.allowed_token_ids is not None or bool(p.bad_words_token_ids)
            or (p.min_tokens > 0 and len(ctx.output) < p.min_tokens) or bool(p.logit_bias) or p.has_penalties)


class Sampler:
    """Picks one token per row of a [n, vocab] logits tensor."""

    def __call__(self, logits: torch.Tensor, params: list[SamplingParams],
                 generators: list[torch.Generator | None] | None = None,
                 contexts: list[RowContext] | None = None) -> SampleOutput:
        if logits.dim() != 2 or logits.shape[0] != len(params):
            raise ValueError(f"logits {tuple(logits.shape)} do not match {len(params)} rows of params")
        gens = generators or [None] * len(params)
        ctxs = contexts or [RowContext()] * len(params)
        logits = logits.float()
        plain = [not _needs_processing(p, c) for p, c in zip(params, ctxs)]
        # rows sampling their raw logits greedily: one argmax over all of them (per row, the first maximum,
        # as a row's own argmax); the finiteness check is skipped for raw rows, whose fallback is themselves
        argmax = [i for i, p in enumerate(params) if plain[i] and p.greedy]
        chosen: list[int] = [0] * len(params)
        if argmax:
            picked = (logits if len(argmax) == len(params) else logits[argmax]).argmax(-1).tolist()
            for i, t in zip(argmax, picked):
                chosen[i] = t
        for i, p in enumerate(params):
            if plain[i] and p.greedy:
                continue
            row = logits[i] if plain[i] else process_row(logits[i], p, ctxs[i])
            if not plain[i] and not bool(torch.isfinite(row).any()):
                row = _fallback(logits[i], ctxs[i])
            chosen[i] = self._choose(row, p, gens[i])
        out = SampleOutput(chosen, [None] * len(params), [None] * len(params))
        if any(p.logprobs is not None for p in params):
            self._add_logprobs(out, logits, params)
        return out

    @staticmethod
    def _choose(row: torch.Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
        if p.greedy:
            return int(row.argmax())
        masked = apply_top_p(apply_top_k(apply_min_p(row / p.temperature, p.min_p), p.top_k), p.top_p)
        return int(torch.multinomial(masked.softmax(-1), 1, generator=gen))

    @staticmethod
    def _add_logprobs(out: SampleOutput, logits: torch.Tensor, params: list[SamplingParams]) -> None:
        rows = [i for i, p in enumerate(params) if p.logprobs is not None]   # row-wise: only the rows asking
        logp = (logits if len(rows) == len(params) else logits[rows]).log_softmax(-1)
        for j, i in enumerate(rows):
            p = params[i]
            out.logprobs[i] = float(logp[j, out.token_ids[i]])
            out.top_logprobs[i] = top_logprobs(logp[j], p.logprobs, p.logprob_token_ids)


def top_logprobs(logp: torch.Tensor, k: int, token_ids: list[int] | None = None) -> list[tuple[int, float]]:
    """The (token, logprob) pairs to report: the named tokens, else the k most likely (k = -1: all)."""
    if token_ids:
        return [(t, float(logp[t])) for t in token_ids]
    if k == 0:
        return []
    if k == 1:   # the most likely alone: an argmax reads the row once (topk: ~2x its time at 248k tokens)
        t = int(logp.argmax())
        return [(t, float(logp[t]))]
    k = logp.shape[-1] if k < 0 else min(k, logp.shape[-1])
    vals, ids = torch.topk(logp, k)
    return list(zip(ids.tolist(), vals.tolist()))
