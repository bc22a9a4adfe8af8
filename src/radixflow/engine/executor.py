"""The real executor: one batched model forward per round, then sampling; measures c(B) on the host."""

from __future__ import annotations

import time

import torch

from radixflow.core.batch import Batch, ExecResult, Sample
from radixflow.engine.models.cache import ModelCache, RowInput
from radixflow.engine.sampling import Sampler, SamplingParams, make_generator

GREEDY = SamplingParams(temperature=0.0, max_tokens=1)


class RequestState:
    """Executor-private data a branch carries (`Branch.user_data`): sampling params and generator."""

    def __init__(self, params: SamplingParams, device: str | torch.device = "cpu") -> None:
        self.params = params
        self.generator = make_generator(params, device) if not params.greedy else None
        self.logprobs: list[float | None] = []
        self.top_logprobs: list[list[tuple[int, float]] | None] = []
        self.prompt_logits: torch.Tensor | None = None


class EngineExecutor:
    def __init__(self, model, cache: ModelCache, tokenizer=None, keep_logits: bool = False) -> None:
        self.model = model
        self.cache = cache
        self.tokenizer = tokenizer
        self.sampler = Sampler()
        self.keep_logits = keep_logits  # tests: keep each sampling row's logits on its branch
        self.device = cache.device

    def execute(self, batch: Batch) -> ExecResult:
        t0 = time.perf_counter()
        rows = []
        sampling = []
        for i, f in enumerate(batch.fragments):
            rows.append(RowInput(list(f.token_ids), f.start, f.page_table, f.state_in, list(f.state_out),
                                 [f.num_tokens - 1] if f.samples else []))
            if f.samples:
                sampling.append(i)
        for f in batch.fragments:  # a resume inside a page starts from a copy of that page's K/V
            for src, dst in f.copies_before:
                self.cache.copy_page(src, dst)
        logits = self.model(rows, self.cache)
        for f in batch.fragments:  # an exact-depth checkpoint keeps its own copy of the partial page
            for src, dst in f.copies_after:
                self.cache.copy_page(src, dst)
        samples: dict[int, Sample] = {}
        if sampling:
            states = [self._state(batch.fragments[i].branch) for i in sampling]
            out = self.sampler(logits, [s.params for s in states], [s.generator for s in states])
            for j, i in enumerate(sampling):
                b = batch.fragments[i].branch
                st = states[j]
                st.logprobs.append(out.logprobs[j])
                st.top_logprobs.append(out.top_logprobs[j])
                if self.keep_logits and st.prompt_logits is None:
                    st.prompt_logits = logits[j].clone()
                samples[i] = Sample(out.token_ids[j], out.logprobs[j], out.top_logprobs[j],
                                    self._stop_string(b, out.token_ids[j], st.params))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return ExecResult(time.perf_counter() - t0, samples)

    def _state(self, branch) -> RequestState:
        if branch.user_data is None:
            branch.user_data = RequestState(GREEDY, self.device)
        return branch.user_data

    def _stop_string(self, branch, token: int, params: SamplingParams) -> str | None:
        if not params.stop or self.tokenizer is None:
            return None
        text = self.tokenizer.decode(list(branch.output) + [token])
        return "stop" if any(s in text for s in params.stop) else None
