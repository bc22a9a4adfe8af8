"""Drives vLLM 0.33's real scheduler on a CPU-only machine, with no model and no tokenizer.

Tests and `benchmarks/vllm_replay.py` use it to compare vLLM's native scheduler with the plugin on the
same requests. The scheduler is built the way vLLM's own `tests/v1/core` build theirs: a `VllmConfig`
around a tiny local `config.json` (no hub access, `skip_tokenizer_init`) and a hand-written
`KVCacheConfig` (full attention, plus a Mamba group in align mode for a hybrid model). A stand-in for the
model runner advances every request whose prefill is complete by one sampled token.

With speculative decoding (`SchedulerSetup.spec_method`, `num_spec_tokens`) the scheduler is built
around vLLM's own `SpeculativeConfig` (ngram needs no draft weights; EAGLE-family methods get a tiny
local draft `config.json`), and the stand-in runner plays the speculative step as vLLM's engine does:
each verifying step accepts a seeded number of its draft tokens (0..N, the same draw for the same
request's j-th verifying step in every run, so native and plugin see one acceptance sequence) and
returns them plus the bonus token, and `update_from_output` rolls the rejected ones back
(`num_computed_tokens`, and the output placeholders under async scheduling); with sync scheduling the
drafter then proposes N draft tokens for every request in the batch (`update_draft_token_ids`, as the
engine's `post_step` does), with async scheduling the scheduler's own placeholders stand for them.
"""

from __future__ import annotations

import functools
import json
import os
import random
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field

# vLLM reads these when it is first imported: no CUDA platform probing, no hub look-ups.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from radixflow.integrations.vllm.compat import require_supported_vllm  # noqa: E402

require_supported_vllm()

import torch  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
)
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from radixflow.integrations.vllm.scheduler import (  # noqa: E402
    StateReadyAsyncScheduler,
    StateReadyScheduler,
)

SAMPLED_TOKEN = 1  # what the stand-in model "generates"; any id below the tiny vocabulary works
DRAFT_TOKEN = 2  # what the stand-in drafter proposes
# Methods the harness can build without weights: ngram needs no draft model; the EAGLE family gets a
# tiny local draft config (its scheduler-side semantics: N lookahead slots, a 1-token prefill lookahead,
# lookahead block hashes). MTP shares EAGLE's scheduler code paths but needs the target's MTP layers.
HARNESS_SPEC_METHODS = ("ngram", "eagle", "eagle3")
_TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 1,
    "num_key_value_heads": 1,
    "max_position_embeddings": 65536,
    "torch_dtype": "float32",
}


@dataclass(frozen=True)
class SchedulerSetup:
    """The budgets and cache shape of one scheduler (vLLM flag names)."""

    max_num_seqs: int = 16
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    num_gpu_blocks: int = 4096
    max_model_len: int = 16384
    hybrid: bool = True  # full attention + Mamba (align); False: full attention only
    plugin: bool = False
    async_scheduling: bool = False
    policy: str = "fcfs"  # vLLM's --scheduling-policy: "fcfs" or "priority"
    prefill_schedule_interval: int = 1  # vLLM's prefill cadence (1 = off)
    long_prefill_token_threshold: int = 0  # vLLM's per-request chunk cap when >1 request is eligible (0 = off)
    watermark: float = 0.0  # vLLM's --watermark: fraction of blocks kept free for waiting admissions
    spec_method: str = ""  # vLLM's --speculative-config method ("" = no speculative decoding)
    num_spec_tokens: int = 0  # its num_speculative_tokens (N)
    spec_seed: int = 0  # seeds the accepted-draft counts


@functools.cache
def _tiny_model_dir() -> tempfile.TemporaryDirectory:
    """The tiny model's directory, removed when the process exits (held here until then)."""
    tmp = tempfile.TemporaryDirectory(prefix="radixflow-vllm-model-")
    with open(os.path.join(tmp.name, "config.json"), "w") as f:
        json.dump(_TINY_CONFIG, f)
    return tmp


@functools.cache
def _model_config(max_model_len: int) -> ModelConfig:
    # Building a ModelConfig inspects the architecture (seconds); one per length is enough.
    path = _tiny_model_dir().name
    return ModelConfig(
        model=path, tokenizer=path, skip_tokenizer_init=True, seed=0, max_model_len=max_model_len
    )


@functools.cache
def _tiny_draft_dir() -> tempfile.TemporaryDirectory:
    tmp = tempfile.TemporaryDirectory(prefix="radixflow-vllm-eagle-draft-")
    with open(os.path.join(tmp.name, "config.json"), "w") as f:
        json.dump({**_TINY_CONFIG, "architectures": ["EagleLlamaForCausalLM"]}, f)
    return tmp


@functools.cache
def _speculative_config(method: str, num_spec_tokens: int, max_model_len: int) -> SpeculativeConfig:
    # vLLM's own config object, so the scheduler reads vLLM's own derived counts (lookahead slots,
    # prefill lookahead, hash lookahead, drafting slots). Building an EAGLE config reads the draft's
    # config.json (seconds): one per shape.
    if method not in HARNESS_SPEC_METHODS:
        raise ValueError(f"spec_method {method!r}: the CPU harness builds {', '.join(HARNESS_SPEC_METHODS)}")
    return SpeculativeConfig(
        method=method,
        model=None if method == "ngram" else _tiny_draft_dir().name,
        num_speculative_tokens=num_spec_tokens,
        target_model_config=_model_config(max_model_len),
        target_parallel_config=ParallelConfig(),
    )


def _kv_cache_config(setup: SchedulerSetup) -> KVCacheConfig:
    attention = FullAttentionSpec(
        block_size=setup.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    groups = [KVCacheGroupSpec(["attn"], attention)]
    if setup.hybrid:
        state = MambaSpec(
            block_size=setup.block_size,
            shapes=((1, 1),),
            dtypes=(torch.float32,),
            mamba_cache_mode="align",
        )
        groups.append(KVCacheGroupSpec(["mamba"], state))
    return KVCacheConfig(num_blocks=setup.num_gpu_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


def build_scheduler(setup: SchedulerSetup) -> Scheduler:
    """A fresh vLLM scheduler (native or plugin, sync or async) with its own empty block pool."""
    if bool(setup.spec_method) != (setup.num_spec_tokens > 0):
        raise ValueError("spec_method and num_spec_tokens > 0 go together")
    speculative_config = None
    if setup.spec_method:
        speculative_config = _speculative_config(setup.spec_method, setup.num_spec_tokens, setup.max_model_len)
    vllm_config = VllmConfig(
        model_config=_model_config(setup.max_model_len),
        scheduler_config=SchedulerConfig(
            max_num_seqs=setup.max_num_seqs,
            max_num_batched_tokens=setup.max_num_batched_tokens,
            max_model_len=setup.max_model_len,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
            watermark=setup.watermark,
            long_prefill_token_threshold=setup.long_prefill_token_threshold,
            policy=setup.policy,
            prefill_schedule_interval=setup.prefill_schedule_interval,
        ),
        cache_config=CacheConfig(
            block_size=setup.block_size,
            enable_prefix_caching=True,
            mamba_cache_mode="align" if setup.hybrid else "none",
        ),
        speculative_config=speculative_config,
    )
    vllm_config.cache_config.num_gpu_blocks = setup.num_gpu_blocks
    register_all_kvcache_specs(vllm_config)
    if setup.plugin:
        cls = StateReadyAsyncScheduler if setup.async_scheduling else StateReadyScheduler
    else:
        cls = AsyncScheduler if setup.async_scheduling else Scheduler
    scheduler = cls(
        vllm_config=vllm_config,
        kv_cache_config=_kv_cache_config(setup),
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=setup.block_size,
        hash_block_size=setup.block_size,
        log_stats=False,
    )
    # The stand-in runner's acceptance draws travel with the scheduler (a deep copy continues them).
    scheduler.radixflow_acceptance = Acceptance(setup.spec_seed, setup.num_spec_tokens)
    return scheduler


class Acceptance:
    """Seeded accepted-draft counts: a request's j-th verifying step accepts a uniform draw in 0..N,
    capped at the drafts it was scheduled with; the same (seed, request, j) always draws the same."""

    def __init__(self, seed: int, num_spec_tokens: int) -> None:
        self.seed = seed
        self.num_spec_tokens = num_spec_tokens
        self.steps: dict[str, int] = {}
        self.drafts = self.accepted_total = 0

    def accept(self, request_id: str, num_drafts: int) -> int:
        j = self.steps.get(request_id, 0)
        self.steps[request_id] = j + 1
        draw = random.Random(f"{self.seed}:{request_id}:{j}").randint(0, self.num_spec_tokens)
        self.drafts += num_drafts
        self.accepted_total += min(draw, num_drafts)
        return min(draw, num_drafts)


def hash_lookahead_tokens(scheduler: Scheduler) -> int:
    """The tokens past each block its hash covers for this scheduler (EAGLE-family speculative configs)."""
    return scheduler.vllm_config.num_hash_lookahead_tokens


@functools.cache
def _block_hasher(block_size: int, num_hash_lookahead_tokens: int = 0):
    init_none_hash(sha256)
    return get_request_block_hasher(block_size, sha256, num_hash_lookahead_tokens)


def make_request(
    request_id: str,
    prompt_token_ids: Sequence[int],
    block_size: int,
    max_tokens: int = 1,
    arrival: float = 0.0,
    cache_salt: str | None = None,
    priority: int = 0,
    hash_lookahead: int = 0,
) -> Request:
    """A vLLM request with the block hasher a scheduler of `block_size` expects.

    `cache_salt` is vLLM's per-tenant cache isolation; it plays the role of a trace's cache namespace.
    `hash_lookahead`: the scheduler's `hash_lookahead_tokens` (EAGLE-family speculative configs).
    """
    return Request(
        request_id=request_id,
        prompt_token_ids=list(prompt_token_ids),
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        pooling_params=None,
        arrival_time=arrival,
        priority=priority,
        cache_salt=cache_salt or None,
        block_hasher=_block_hasher(block_size, hash_lookahead),
    )


def stand_in_model_output(scheduler: Scheduler, output: SchedulerOutput) -> ModelRunnerOutput:
    """What a model runner would return: for each request past its prefill, its accepted draft tokens
    (a seeded draw, see `Acceptance`) and one sampled token; nothing for a prefill chunk."""
    req_ids = list(output.num_scheduled_tokens)
    acceptance = getattr(scheduler, "radixflow_acceptance", None)
    sampled = []
    for r in req_ids:
        if scheduler.requests[r].is_prefill_chunk:
            sampled.append([])
            continue
        drafts = output.scheduled_spec_decode_tokens.get(r, ())
        accepted = acceptance.accept(r, len(drafts)) if drafts and acceptance is not None else 0
        sampled.append([SAMPLED_TOKEN] * (1 + accepted))
    return ModelRunnerOutput(
        req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)}, sampled_token_ids=sampled
    )


def propose_drafts(scheduler: Scheduler, output: SchedulerOutput) -> None:
    """Sync scheduling with speculative decoding: the drafter's N tokens for every request of the
    executed batch, handed to the scheduler as vLLM's engine does after `update_from_output` (the
    scheduler drops them for prefill chunks and finished requests). Async scheduling uses the
    scheduler's placeholders instead."""
    n = scheduler.num_spec_tokens
    if not n or isinstance(scheduler, AsyncScheduler) or not output.total_num_scheduled_tokens:
        return
    req_ids = list(output.num_scheduled_tokens)
    scheduler.update_draft_token_ids(DraftTokenIds(req_ids, [[DRAFT_TOKEN] * n for _ in req_ids]))


@dataclass
class StepRecord:
    """One `schedule()` call: tokens per scheduled request and the prefix hit of newly admitted ones."""

    num_scheduled_tokens: dict[str, int]
    new_hits: dict[str, int] = field(default_factory=dict)
    deferred: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return len(self.num_scheduled_tokens)

    @property
    def tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())


def run_step(scheduler: Scheduler) -> StepRecord:
    """Schedule once, run the stand-in model, feed its output back; return what was scheduled."""
    output = scheduler.schedule()
    record = StepRecord(
        num_scheduled_tokens=dict(output.num_scheduled_tokens),
        new_hits={r.req_id: r.num_computed_tokens for r in output.scheduled_new_reqs},
        deferred=list(getattr(scheduler, "blocked_last_step", [])),
    )
    scheduler.update_from_output(output, stand_in_model_output(scheduler, output))
    propose_drafts(scheduler, output)
    return record


class InFlightDriver:
    """Drives a scheduler the way vLLM's engine loop does with async scheduling: step t+1 is scheduled
    before step t's output is fed back (`depth` steps in flight). The stand-in output of a step is
    fixed when the step is scheduled, as a real runner's would be."""

    def __init__(self, scheduler: Scheduler, depth: int = 2) -> None:
        self.scheduler = scheduler
        self.depth = depth
        self._in_flight: list[tuple[SchedulerOutput, ModelRunnerOutput]] = []

    @property
    def busy(self) -> bool:
        return self.scheduler.has_requests() or bool(self._in_flight)

    def step(self) -> StepRecord | None:
        """Schedule one step (when there is anything to schedule) and feed back the oldest output once
        `depth` steps are in flight or nothing more can be scheduled; the scheduled step's record."""
        record = None
        if self.scheduler.has_requests():
            output = self.scheduler.schedule()
            record = StepRecord(
                num_scheduled_tokens=dict(output.num_scheduled_tokens),
                new_hits={r.req_id: r.num_computed_tokens for r in output.scheduled_new_reqs},
                deferred=list(getattr(self.scheduler, "blocked_last_step", [])),
            )
            if output.total_num_scheduled_tokens:
                self._in_flight.append((output, stand_in_model_output(self.scheduler, output)))
            else:
                self.scheduler.update_from_output(output, stand_in_model_output(self.scheduler, output))
        if self._in_flight and (len(self._in_flight) >= self.depth or record is None or not record.rows):
            output, model_output = self._in_flight.pop(0)
            self.scheduler.update_from_output(output, model_output)
            propose_drafts(self.scheduler, output)
        return record


def count_free_blocks(scheduler: Scheduler) -> int:
    return scheduler.kv_cache_manager.block_pool.get_num_free_blocks()


def usable_blocks(scheduler: Scheduler) -> int:
    """Blocks a request can ever hold: the pool minus vLLM's reserved null block."""
    return scheduler.kv_cache_manager.block_pool.num_gpu_blocks - 1

