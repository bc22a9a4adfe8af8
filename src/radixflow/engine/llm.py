"""`radixflow.LLM`: the offline Python API, in the shape vLLM users know."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from radixflow.config import SchedulerConfig
from radixflow.core.branch import LogicalRequest
from radixflow.engine.engine import Engine, EngineConfig
from radixflow.engine.sampling import SamplingParams


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]
    text: str
    logprobs: list[float | None]
    top_logprobs: list[list[tuple[int, float]] | None]
    finish_reason: str | None
    cached_tokens: int


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[list[int]]
    outputs: list[CompletionOutput]
    latency: float


@dataclass
class ScoreOutput:
    """Next-token logprobs of each candidate continuation (one branch per candidate)."""

    candidates: list[str]
    next_token_logprobs: list[list[tuple[int, float]]]
    cached_tokens: list[int]
    handoff_rows: int = 0  # rows that ran as dependents of a same-forward producer (SPEC §15)


_SCHED_FLAGS = {"max_num_seqs", "max_num_batched_tokens", "block_size", "state_interval", "enable_prefix_caching",
                "checkpoints", "checkpoint_wait", "handoff", "handoff_max_levels", "eviction"}


class LLM:
    def __init__(self, model: str = "tiny-qwen3.5", policy: str = "radixflow", device: str = "cpu", **flags):
        sched = {k: flags.pop(k) for k in list(flags) if k in _SCHED_FLAGS}
        base = EngineConfig().scheduler
        cfg = EngineConfig(model=model, policy=policy, device=device,
                           scheduler=SchedulerConfig(**{**vars(base), **sched}), **flags)
        self.engine = Engine(cfg)
        self._ids = itertools.count()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def _encode(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        return list(prompt)

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 namespace: str = "") -> list[RequestOutput]:
        """One logical request per prompt (a string or a token-id list); returns them in order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        plist = params if isinstance(params, list) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(plist)} SamplingParams for {len(prompts)} prompts")
        reqs = []
        for prompt, p in zip(prompts, plist):
            rid = f"gen-{next(self._ids)}"
            reqs.append(self.engine.add([self.engine.make_branch(rid, 0, self._encode(prompt), p, namespace)]))
        self._drain()
        return [self._output(r) for r in reqs]

    def score(self, document, candidates: list, logprobs: int = 5, namespace: str = "") -> ScoreOutput:
        """The multi-candidate shape: one request, one branch per (document + candidate)."""
        if not candidates:
            raise ValueError("score() needs at least one candidate")
        doc = self._encode(document)
        rid = f"score-{next(self._ids)}"
        p = SamplingParams(temperature=0.0, max_tokens=1, logprobs=logprobs, ignore_eos=True)
        branches = [self.engine.make_branch(rid, i, doc + self._encode(c), p, namespace)
                    for i, c in enumerate(candidates)]
        req = self.engine.add(branches)
        handed = self.engine.handoff_rows
        self._drain()
        return ScoreOutput([c if isinstance(c, str) else str(c) for c in candidates],
                           [b.user_data.top_logprobs[0] or [] for b in req.branches],
                           [b.cached_tokens or 0 for b in req.branches], self.engine.handoff_rows - handed)

    def _drain(self) -> None:
        eng = self.engine
        while eng.has_unfinished:
            batch, _ = eng.step()
            if not batch:
                deadline = eng.idle_until()
                if deadline is None:
                    raise RuntimeError("engine stuck: work left but nothing schedulable")
                eng.now = max(eng.now, deadline)

    def _output(self, req: LogicalRequest) -> RequestOutput:
        outs = []
        for b in req.branches:
            st = b.user_data
            outs.append(CompletionOutput(b.index, list(b.output), self.tokenizer.decode(list(b.output)),
                                         list(st.logprobs), list(st.top_logprobs), b.finish_reason,
                                         b.cached_tokens or 0))
        return RequestOutput(req.request_id, [list(b.prompt) for b in req.branches], outs, req.latency or 0.0)
