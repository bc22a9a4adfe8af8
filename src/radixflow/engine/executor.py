"""The real executor: one batched model forward per round, then sampling; measures c(B) on the host,
and the part of it spent in the recurrent levels of dependent rows (SPEC §15, `ExecResult.handoff_time`).

Levels are the engine's (engine/models/batch.py `row_levels`): a dependent of a multi-token producer is
folded into its producer's scan (no level of its own; what it adds, the scan calls of folded rows only
and the state copies at the fold points, is predicted before each forward by the calibration's fold fit
(engine/calibration.py `fold_fit`: `fold_time`) and, while the engine calibrates, timed inside the
scans (`fold_measured`, `fold_wall`)), a dependent of a 1-token producer runs in a separate level, timed
by `LevelClock`."""

from __future__ import annotations

import time

import torch

from radixflow.core.batch import Batch, ExecResult, Sample
from radixflow.engine.models.batch import row_levels
from radixflow.engine.models.cache import ModelCache, RowInput
from radixflow.engine.models.level_clock import LevelClock
from radixflow.engine.sampling import (
    RowContext,
    Sampler,
    SamplingParams,
    first_stop,
    make_generator,
    top_logprobs,
)
from radixflow.engine.structured import GrammarState

GREEDY = SamplingParams(temperature=0.0, max_tokens=1)


class RequestState:
    """Executor-private data a branch carries (`Branch.user_data`): sampling params and generator."""

    def __init__(self, params: SamplingParams, device: str | torch.device = "cpu",
                 stop_token_ids: frozenset[int] = frozenset()) -> None:
        self.params = params
        self.generator = make_generator(params, device) if not params.greedy else None
        self.grammar = GrammarState(params.grammar) if params.grammar is not None else None
        self.stop_token_ids = stop_token_ids  # what min_tokens suppresses (EOS unless ignored + stop ids)
        self.logprobs: list[float | None] = []
        self.top_logprobs: list[list[tuple[int, float]] | None] = []
        self.prompt_logits: torch.Tensor | None = None
        # position q >= 1 -> (logprob of prompt[q], its rank, top-k pairs), filled as prefill runs
        self.prompt_logprobs: dict[int, tuple[float, int, list[tuple[int, float]]]] = {}


def _row_levels(batch: Batch) -> list[int]:
    """The engine's recurrent level of each row (folded dependents share their producer's)."""
    if all(f.after is None for f in batch.fragments):
        return [0] * len(batch.fragments)
    return row_levels([f.after for f in batch.fragments], [f.num_tokens for f in batch.fragments])


class EngineExecutor:
    def __init__(self, model, cache: ModelCache, tokenizer=None, keep_logits: bool = False) -> None:
        self.model = model
        self.cache = cache
        self.tokenizer = tokenizer
        self.sampler = Sampler()
        self.keep_logits = keep_logits  # tests: keep each sampling row's logits on its branch
        self.device = cache.device
        self.scan_costs = None  # measured scan costs: each recurrent level picks its chunk (engine/calibration.py)
        self.calibration = None  # HandoffCalibration fed with this executor's timings (None: not measured)
        self.fold_calls = 0      # scan calls the folded dependents added, over all forwards
        # what the fold added, predicted from the fits of earlier forwards (without a calibration: the
        # calls priced at the probe's `ScanCosts.per_step`), and as measured inside the scans
        self.fold_time = 0.0
        self.fold_measured = 0.0  # LevelClock.fold_measured (thread CPU time on one scan thread)
        self.fold_wall = 0.0      # the same segments on the host clock

    def execute(self, batch: Batch) -> ExecResult:
        cal = self.calibration  # the levels' predictions are the scheduler's side: made before the clock starts
        levels = self._levels(batch) if cal is not None else {}
        predicted = {k: cal.predict_level(*v) for k, v in levels.items()} if cal is not None and cal.ready else {}
        t0 = time.perf_counter()
        rows = []
        sampling = []  # (fragment index, row of `logits`)
        prompt_rows = []  # (fragment index, first row of `logits`, local positions)
        n_logits = 0
        for i, f in enumerate(batch.fragments):
            at = self._prompt_positions(f)
            if at:
                prompt_rows.append((i, n_logits, at))
            if f.samples and (not at or at[-1] != f.num_tokens - 1):
                at = at + [f.num_tokens - 1]
            if f.samples:
                sampling.append((i, n_logits + len(at) - 1))
            n_logits += len(at)
            rows.append(RowInput(list(f.token_ids), f.start, f.page_table, f.state_in, list(f.state_out), at,
                                 f.after))
        for f in batch.fragments:  # a resume inside a page starts from a copy of that page's K/V
            for src, dst in f.copies_before:
                self.cache.copy_page(src, dst)
        clock = LevelClock(self.device, time_fold=cal is not None)
        logits = self.model(rows, self.cache, clock, self.scan_costs)
        for f in batch.fragments:  # an exact-depth checkpoint keeps its own copy of the partial page
            for src, dst in f.copies_after:
                self.cache.copy_page(src, dst)
        for i, first, at in prompt_rows:
            self._record_prompt_logprobs(batch.fragments[i], logits[first:first + len(at)], at)
        samples: dict[int, Sample] = {}
        if sampling:
            branches = [batch.fragments[i].branch for i, _ in sampling]
            states = [self._state(b) for b in branches]
            contexts = [RowContext(b.prompt, b.output, st.stop_token_ids, st.grammar)
                        for b, st in zip(branches, states)]
            rows_logits = logits[[r for _, r in sampling]]
            out = self.sampler(rows_logits, [s.params for s in states], [s.generator for s in states], contexts)
            for j, (i, _) in enumerate(sampling):
                b, st, token = branches[j], states[j], out.token_ids[j]
                st.logprobs.append(out.logprobs[j])
                st.top_logprobs.append(out.top_logprobs[j])
                if self.keep_logits and st.prompt_logits is None:
                    st.prompt_logits = rows_logits[j].clone()
                reason = self._stop_string(b, token, st.params)
                if st.grammar is not None:
                    st.grammar.accept(token)
                    if st.grammar.terminated:
                        reason = reason or "stop"
                samples[i] = Sample(token, out.logprobs[j], out.top_logprobs[j], reason)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        host = time.perf_counter() - t0
        measured = clock.by_level
        self.fold_calls += clock.fold_calls
        if cal is not None:
            if clock.fold_copies:  # folded dependents ran: their price (the fits of earlier rounds) and time
                price = cal.predict_fold(clock.fold_calls, clock.fold_rows, clock.fold_copied)
                fold = clock.fold_measured
                wall = clock.fold_wall
                cal.observe_fold(clock.fold_calls, clock.fold_rows, clock.fold_copied, fold, price, wall)
                self.fold_time += price
                self.fold_measured += fold
                self.fold_wall += wall
            for k, (r, n, longest) in levels.items():
                cal.observe_level(r, n, longest, measured.get(k, 0.0), predicted.get(k))
            if getattr(self.model, "is_hybrid", False):
                parts = self._level_parts(batch)
                cal.observe_base(*parts.get(0, (0, 0, 0, 0)), clock.base)
                for k in levels:  # priced by level 0's fit (remade every BASE_REFIT rounds)
                    ones, r, n, _ = parts[k]
                    cal.record_level(ones, r, n, measured.get(k, 0.0))
            cal.observe_round(len(batch.fragments), batch.num_tokens, host - sum(measured.values()), host)
        else:
            self.fold_time += clock.fold_seconds
        ran = max(_row_levels(batch), default=0) + 1 if getattr(self.model, "is_hybrid", False) else 1
        return ExecResult(host, samples, handoff_time=sum(measured.values()), levels=ran)

    @staticmethod
    def _levels(batch: Batch) -> dict[int, tuple[int, int, int]]:
        """Rows, tokens and longest row of each extra level (depth >= 1) of the batch's dependent rows."""
        out: dict[int, tuple[int, int, int]] = {}
        if all(f.after is None for f in batch.fragments):
            return out
        for f, k in zip(batch.fragments, _row_levels(batch)):
            if k:
                r, n, longest = out.get(k, (0, 0, 0))
                out[k] = (r + 1, n + f.num_tokens, max(longest, f.num_tokens))
        return out

    @staticmethod
    def _level_parts(batch: Batch) -> dict[int, tuple[int, int, int, int]]:
        """Per level depth (0 included): 1-token rows, longer rows, their tokens, the longest row."""
        out: dict[int, tuple[int, int, int, int]] = {}
        for f, k in zip(batch.fragments, _row_levels(batch)):
            ones, r, n, longest = out.get(k, (0, 0, 0, 0))
            t = f.num_tokens
            out[k] = (ones + (t == 1), r + (t > 1), n + (t if t > 1 else 0), max(longest, t))
        return out

    def _prompt_positions(self, f) -> list[int]:
        """Local positions whose logits score the next prompt token, for branches asking for prompt
        logprobs (positions already scored, e.g. before a preemption, are not asked again)."""
        st = f.branch.user_data
        if st is None or st.params.prompt_logprobs is None:
            return []
        last = min(f.end, f.branch.prompt_len - 1)  # position prompt_len - 1 predicts the output
        return [p - f.start for p in range(f.start, last) if p + 1 not in st.prompt_logprobs]

    def _record_prompt_logprobs(self, f, logits: torch.Tensor, at: list[int]) -> None:
        st = f.branch.user_data
        k = st.params.prompt_logprobs
        logp = logits.float().log_softmax(-1)
        prompt = f.branch.prompt
        for row, j in enumerate(at):
            q = f.start + j + 1
            if q < len(prompt):
                lp = logp[row, prompt[q]]
                rank = int((logp[row] > lp).sum()) + 1
                st.prompt_logprobs[q] = (float(lp), rank, top_logprobs(logp[row], k))

    def _state(self, branch) -> RequestState:
        if branch.user_data is None:
            branch.user_data = RequestState(GREEDY, self.device)
        return branch.user_data

    def _stop_string(self, branch, token: int, params: SamplingParams) -> str | None:
        if not params.stop or self.tokenizer is None or len(branch.output) + 1 < params.min_tokens:
            return None
        out = list(branch.output) + [token]
        text = self.tokenizer.decode(out, params.skip_special_tokens)
        floor = len(self.tokenizer.decode(out[:params.min_tokens - 1], params.skip_special_tokens)) \
            if params.min_tokens > 1 else 0
        return "stop" if first_stop(text, params.stop, floor) else None
