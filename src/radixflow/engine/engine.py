"""The real engine: the shared scheduler core driving a model through EngineExecutor.

`Engine.step()` runs one round (admission, schedule, execute, complete); `LLM` and the server are
thin layers over it. Time is a virtual clock advanced by measured host time (bench), or the caller's
wall clock (server).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import torch

from radixflow.config import DTYPES, SchedulerConfig
from radixflow.core.batch import Batch
from radixflow.core.branch import Branch, LogicalRequest
from radixflow.core.policies import get_arm
from radixflow.core.scheduler import Scheduler
from radixflow.engine.calibration.probes import WarmUp
from radixflow.engine.calibration.store import ProbeStore
from radixflow.engine.executor import EngineExecutor, RequestState
from radixflow.engine.loader import LoadedModel, load_model
from radixflow.engine.memory import PoolPlan, plan_pools
from radixflow.engine.models.cache import RowInput
from radixflow.engine.sampling import SamplingParams
from radixflow.engine.tiny import resolve_model


@dataclass
class EngineConfig:
    model: str = "tiny-qwen3.5"
    policy: str = "radixflow"
    device: str = "cpu"
    dtype: str = "float32"
    scheduler: SchedulerConfig = field(default_factory=lambda: SchedulerConfig(
        max_num_seqs=16, max_num_batched_tokens=2048, block_size=16, state_interval=64))
    kv_cache_memory: int | None = None  # bytes; default: a fraction of host/GPU memory
    memory_fraction: float = 0.05
    state_memory_fraction: float = 0.3
    max_model_len: int = 8192
    seed: int = 0
    # the warm-up probes (engine/calibration/probes.py WarmUp): "eager" runs them before the engine is
    # built; "lazy" builds it with their safe defaults and leaves them to `warm_step` (the server, between
    # requests). probe_cache: a directory where their results are kept (calibration/store.py); None: none
    warmup: str = "eager"
    probe_cache: str | None = None
    available_memory: int | None = None  # bytes the default pool sizing may assume free; None: read at build


_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _dtype(name: str) -> torch.dtype:
    """The torch dtype of one of config.DTYPES' names (the CLI's `--dtype` and `LLM(dtype=...)`)."""
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose from {', '.join(DTYPES)}")
    return _TORCH_DTYPES[DTYPES[name]]


class Engine:
    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None, keep_logits: bool = False):
        self.config = config
        if config.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError("--device cuda asked for, but torch sees no CUDA device")
        device = torch.device(config.device)
        torch.manual_seed(config.seed)
        self.startup: list[tuple[str, float]] = []  # (phase, seconds) of building this engine
        t0 = time.perf_counter()
        self.loaded = loaded or load_model(resolve_model(config.model), device, _dtype(config.dtype))
        if loaded is None:
            t0 = self._phase("load weights", t0)
        model = self.loaded.model
        if model.prepare_weights():
            t0 = self._phase("pack weights for oneDNN (fused projections)", t0)
        sc = config.scheduler
        layout_cache = model.allocate_cache(1, sc.block_size, 1)
        kv_tok, st_bytes = layout_cache.kv_bytes_per_token, layout_cache.state_bytes_per_slot
        del layout_cache
        self.pools: PoolPlan = plan_pools(config, device, kv_tok, st_bytes, model.is_hybrid,
                                          config.available_memory)
        if self.pools.warning:
            warnings.warn(self.pools.warning, stacklevel=2)
        pages, slots = self.pools.pages, self.pools.slots
        sc = SchedulerConfig(**{**vars(sc), "num_kv_pages": pages, "num_state_slots": max(slots, 0)})
        self.scheduler_config = sc
        self.cache = model.allocate_cache(pages, sc.block_size, max(slots, 1) if model.is_hybrid else 0)
        self.cache.touch()
        t0 = self._phase("allocate and touch KV pages and state slots", t0)
        self.executor = EngineExecutor(model, self.cache, self.loaded.tokenizer, keep_logits)
        self.scheduler = Scheduler(sc, get_arm(config.policy), model.is_hybrid)
        self.warmup: WarmUp | None = None
        # lazy warm-up: a first forward (the model fuses its projections and touches its weights) runs
        # when the server is first idle, not in the first request; eager builds leave it to the probes
        self._first_forward = config.warmup == "lazy"
        if model.is_hybrid:  # the engine's own costs: scan chunks always, `auto`'s rule when it decides
            if config.warmup not in ("eager", "lazy"):
                raise ValueError(f"warmup must be 'eager' or 'lazy', got {config.warmup!r}")
            store = ProbeStore(config.probe_cache) if config.probe_cache else None
            # measured and predicted with --handoff on or auto; `auto` decides by it
            self.warmup = WarmUp(model, self.loaded.path, sc.block_size, sc.state_interval, sc.handoff != "off",
                                 store)
            if config.warmup == "eager":
                self.warmup.run()
            self._install_warmup()
            if sc.handoff == "auto":
                self.scheduler.handoff_source = self.executor.calibration
            self._phase("probes (" + self.warmup_state() + ")", t0)
        self.now = 0.0
        self.handoff_rows = 0      # rows run as dependents of a same-forward producer (SPEC §15)
        self.handoff_time = 0.0    # seconds measured in their extra recurrent levels
        self.requests: dict[str, LogicalRequest] = {}
        self._grammar_compiler = None

    def _phase(self, name: str, t0: float) -> float:
        t = time.perf_counter()
        self.startup.append((name, t - t0))
        return t

    def _install_warmup(self) -> None:
        w = self.warmup
        self.executor.scan_costs = w.scan
        if w.cal is not None:
            self.executor.calibration = w.cal
            w.cal.scan = w.scan  # prices a folded hand-off

    @property
    def warming(self) -> bool:
        """True while warm-up work is left (`warmup="lazy"`): the first forward, probes."""
        return self._first_forward or (self.warmup is not None and not self.warmup.done)

    def warm_step(self) -> bool:
        """Runs one step of the warm-up left (the first forward, then a scan layout or a synthetic forward
        of the probes still missing) and installs what finished; False once none is left. Between rounds
        only: it uses the model."""
        if self._first_forward:
            t0 = time.perf_counter()
            model = self.loaded.model
            scratch = model.allocate_cache(1, self.scheduler_config.block_size, 1 if model.is_hybrid else 0)
            model([RowInput([0], 0, [0], None, [], [0])], scratch)
            self._first_forward = False
            self.startup.append(("first forward (after ready)", time.perf_counter() - t0))
            return self.warming
        if not self.warming:
            return False
        more = self.warmup.step()
        self._install_warmup()
        return more

    def warmup_state(self) -> str:
        """Where each probe's results came from: 'scan cached on disk, rounds probed 3.1 s', ..."""
        w = self.warmup
        if w is None:
            return "none: no recurrent layer"
        words = {"memory": "from an earlier engine", "disk": "from the probe cache"}
        parts = []
        for k in ("scan", "rounds"):
            if k == "rounds" and w.cal is None:
                continue
            src = w.source.get(k)
            parts.append(f"{k} {words[src]}" if src in words else f"{k} probed {w.seconds[k]:.1f} s" if src
                         else f"{k} pending")
        return ", ".join(parts)

    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    @property
    def vocab_size(self) -> int:
        return self.loaded.model.vocab_size

    def make_branch(self, request_id: str, index: int, prompt: list[int], params: SamplingParams,
                    namespace: str = "", arrival: float | None = None, priority: int = 0) -> Branch:
        self.check_prompt(prompt, params.max_tokens)
        params.check_vocab(self.vocab_size)
        stops = set(params.stop_token_ids)
        if not params.ignore_eos:
            stops.update(self.loaded.model.eos_token_ids)
        if params.prompt_logprobs is not None:
            # every prompt position must run through the model: no prefix hit, not even a sibling's
            namespace = f"{namespace}\x00prompt_logprobs:{request_id}/{index}"
        b = Branch(request_id, index, tuple(prompt), namespace, self.now if arrival is None else arrival,
                   params.max_tokens, frozenset(stops))
        b.priority = priority
        b.user_data = RequestState(params, self.cache.device, frozenset(stops))
        return b

    def check_prompt(self, prompt: list[int], max_tokens: int) -> None:
        """ValueError if the prompt is empty, holds an id outside the vocabulary, or does not fit
        max_model_len with `max_tokens` more."""
        if not prompt:
            raise ValueError("empty prompt")
        vocab = self.vocab_size
        if not 0 <= min(prompt) <= max(prompt) < vocab:
            bad = next(t for t in prompt if not 0 <= t < vocab)
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab})")
        if len(prompt) + max_tokens > self.config.max_model_len:
            raise ValueError(f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceeds "
                             f"max_model_len {self.config.max_model_len}")

    @property
    def grammar_compiler(self):
        """xgrammar over this model's tokenizer and vocabulary, built on first use."""
        if self._grammar_compiler is None:
            from radixflow.engine.structured import GrammarCompiler

            self._grammar_compiler = GrammarCompiler(self.tokenizer, self.vocab_size)
        return self._grammar_compiler

    def add(self, branches: list[Branch]) -> LogicalRequest:
        req = LogicalRequest(branches[0].request_id, branches, min(b.arrival for b in branches))
        if req.request_id in self.requests:
            raise ValueError(f"request id {req.request_id!r} is already in flight")
        added = []
        try:
            for b in branches:
                self.scheduler.add(b)
                added.append(b)
        except ValueError:
            for b in added:  # all branches of a request are accepted, or none
                self.scheduler.abort(b)
            raise
        self.requests[req.request_id] = req
        return req

    def abort(self, request_id: str) -> None:
        req = self.requests.pop(request_id, None)
        if req is not None:
            for b in req.branches:
                self.scheduler.abort(b)

    def step(self, now: float | None = None) -> tuple[Batch, list[LogicalRequest]]:
        """One round; returns the batch run (maybe empty) and the requests that finished."""
        if now is not None:
            self.now = max(self.now, now)
        self.scheduler.admit(self.now)
        batch = self.scheduler.schedule(self.now)
        if not batch:
            return batch, []
        result = self.executor.execute(batch)
        self.handoff_rows += sum(f.after is not None for f in batch.fragments)
        self.handoff_time += result.handoff_time
        self.now = self.now + result.host_time if now is None else max(self.now, now + result.host_time)
        self.scheduler.complete(batch, result, self.now)
        finished = []
        for rid in {f.branch.request_id for f in batch.fragments}:
            req = self.requests.get(rid)
            if req is not None and req.finished:
                finished.append(self.requests.pop(rid))
        return batch, finished

    def idle_until(self) -> float | None:
        return self.scheduler.next_deadline

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished
