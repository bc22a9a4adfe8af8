"""Helpers for the vLLM plugin tests: load the CPU harness (or skip / fail), and make request sets."""

from __future__ import annotations

import copy
import os
import random
import sys
from dataclasses import dataclass

import pytest

from radixflow.integrations.vllm.compat import SUPPORTED_VLLM_VERSION


def load_harness():
    """The vLLM CPU harness module; without a usable vLLM: skip, or fail when RADIXFLOW_REQUIRE_VLLM=1."""
    try:
        from radixflow.integrations.vllm import cpu_harness
    except ImportError as exc:
        reason = f"vLLM {SUPPORTED_VLLM_VERSION} is not usable here ({exc}); run scripts/install_vllm.sh"
        if os.environ.get("RADIXFLOW_REQUIRE_VLLM") == "1":
            pytest.fail(f"RADIXFLOW_REQUIRE_VLLM=1 but {reason}", pytrace=False)
        pytest.skip(reason, allow_module_level=True)
    return cpu_harness


@dataclass(frozen=True)
class PromptSpec:
    """One request to add: its id and prompt token ids."""

    request_id: str
    tokens: tuple[int, ...]


def producer_consumer_unrelated(block_size: int) -> list[PromptSpec]:
    """r0 (producer), r1 sharing r0's 4-block prefix, r2 sharing nothing, in that queue order."""
    doc = tuple(range(1, 4 * block_size + 1))
    return [
        PromptSpec("r0", doc + (100,) * 5),
        PromptSpec("r1", doc + (200,) * 5),
        PromptSpec("r2", tuple(range(300, 300 + 2 * block_size + 8))),
    ]


def random_groups(rng: random.Random, block_size: int, max_groups: int = 6) -> list[PromptSpec]:
    """Groups of branches sharing a document (multi-candidate shaped), interleaved, in random order."""
    specs = []
    for g in range(rng.randint(1, max_groups)):
        doc_len = rng.randint(1, 6) * block_size + rng.randint(0, block_size - 1)
        doc = tuple(rng.randrange(2, 30000) for _ in range(doc_len))
        for b in range(rng.randint(1, 4)):
            tail = tuple(rng.randrange(2, 30000) for _ in range(rng.randint(1, 2 * block_size)))
            specs.append(PromptSpec(f"g{g}b{b}", doc + tail))
    rng.shuffle(specs)
    return specs


def add_all(harness, scheduler, specs: list[PromptSpec], block_size: int, max_tokens: int = 1) -> dict:
    """Add every request in order; return the Request objects by id (they outlive the scheduler's map)."""
    requests = {}
    for spec in specs:
        request = harness.make_request(spec.request_id, spec.tokens, block_size, max_tokens=max_tokens)
        scheduler.add_request(request)
        requests[spec.request_id] = request
    return requests


def native_view(scheduler):
    """A deep copy of a plugin scheduler with the rule switched off: native vLLM from the same state."""
    # The structured-output manager holds a thread pool and the config is shared, read-only state.
    shared = {id(scheduler.structured_output_manager): scheduler.structured_output_manager,
              id(scheduler.vllm_config): scheduler.vllm_config}
    # The block pool's free list is a linked list: copying it recurses once per block.
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 40 * scheduler.kv_cache_manager.block_pool.num_gpu_blocks))
    try:
        clone = copy.deepcopy(scheduler, shared)
    finally:
        sys.setrecursionlimit(limit)
    clone.state_ready = False
    return clone


def run_to_completion(harness, scheduler, max_steps: int = 500) -> list:
    """Step until nothing is left; the StepRecords of the non-empty steps."""
    records = []
    for _ in range(max_steps):
        if not scheduler.has_requests():
            return records
        record = harness.run_step(scheduler)
        if record.rows:
            records.append(record)
    raise AssertionError(f"scheduler still has requests after {max_steps} steps")
