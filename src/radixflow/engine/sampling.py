"""Choosing next tokens from logits: sampling parameters (validated) and a per-row sampler.

Greedy when temperature < 1e-5. Otherwise logits / temperature, then top-k, then top-p (nucleus),
then one draw from the row's own `torch.Generator` (seeded rows are reproducible whatever else is
in the batch). Reported logprobs are those of the model's distribution (log-softmax of the raw
logits), not of the temperature/top-k/top-p-modified one, as OpenAI-style APIs report them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

GREEDY_BELOW = 1e-5  # as vLLM: a smaller temperature is greedy (logits / 1e-300 overflow to inf, then NaN)


@dataclass
class SamplingParams:
    """Per-request sampling settings. `max_new_tokens` is an alias of `max_tokens`."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                     # 0 (or -1) = no top-k cut
    seed: int | None = None
    max_tokens: int = 16
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None        # k: also return the top-k logprobs (0 = only the chosen token's)
    max_new_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens is not None:
            self.max_tokens = self.max_new_tokens
        self.max_new_tokens = self.max_tokens
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self._validate()

    def _validate(self) -> None:
        checks = [
            ("temperature", self.temperature >= 0, "must be >= 0"),
            ("top_p", 0 < self.top_p <= 1, "must be in (0, 1]"),
            ("top_k", self.top_k == -1 or self.top_k >= 0, "must be -1, 0 (disabled) or a positive count"),
            ("max_tokens", isinstance(self.max_tokens, int) and self.max_tokens >= 1, "must be an int >= 1"),
            ("logprobs", self.logprobs is None or 0 <= self.logprobs <= 20, "must be None or in [0, 20]"),
            ("stop_token_ids", all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
             "must be non-negative ints"),
            ("stop", all(isinstance(s, str) and s for s in self.stop), "must be non-empty strings"),
        ]
        for name, ok, why in checks:
            if not ok:
                raise ValueError(f"SamplingParams.{name} {why}, got {getattr(self, name)!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


def make_generator(params: SamplingParams, device: str | torch.device = "cpu") -> torch.Generator:
    """The row's generator: seeded from `params.seed`, else from fresh OS entropy."""
    gen = torch.Generator(device=device)
    if params.seed is not None:
        gen.manual_seed(params.seed)
    else:
        gen.seed()
    return gen


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


class Sampler:
    """Picks one token per row of a [n, vocab] logits tensor."""

    def __call__(self, logits: torch.Tensor, params: list[SamplingParams],
                 generators: list[torch.Generator | None] | None = None) -> SampleOutput:
        if logits.dim() != 2 or logits.shape[0] != len(params):
            raise ValueError(f"logits {tuple(logits.shape)} do not match {len(params)} rows of params")
        gens = generators or [None] * len(params)
        logits = logits.float()
        chosen = [self._choose(logits[i], params[i], gens[i]) for i in range(len(params))]
        out = SampleOutput(chosen, [None] * len(params), [None] * len(params))
        if any(p.logprobs is not None for p in params):
            self._add_logprobs(out, logits, params)
        return out

    @staticmethod
    def _choose(row: torch.Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
        if p.greedy:
            return int(row.argmax())
        masked = apply_top_p(apply_top_k(row / p.temperature, p.top_k), p.top_p)
        return int(torch.multinomial(masked.softmax(-1), 1, generator=gen))

    @staticmethod
    def _add_logprobs(out: SampleOutput, logits: torch.Tensor, params: list[SamplingParams]) -> None:
        logp = logits.log_softmax(-1)
        for i, p in enumerate(params):
            if p.logprobs is None:
                continue
            out.logprobs[i] = float(logp[i, out.token_ids[i]])
            if p.logprobs > 0:
                vals, ids = torch.topk(logp[i], p.logprobs)
                out.top_logprobs[i] = list(zip(ids.tolist(), vals.tolist()))
            else:
                out.top_logprobs[i] = []
