"""The simulator runs an attention-free hybrid (Mamba-2 + MLP only): its KV pages hold no bytes."""

from __future__ import annotations

import dataclasses

import pytest

from radixflow.config import SchedulerConfig
from radixflow.core.policies import get_arm
from radixflow.sim.cost_model import get_gpu, pool_sizes
from radixflow.sim.runner import SimSetup, run_arm
from radixflow.spec.model_spec import get_spec
from radixflow.workloads.figure1 import FIGURE1_BUDGETS, figure1_records
from radixflow.workloads.trace import branch_from_record


@pytest.fixture
def attention_free():
    spec = get_spec("nemotron-nano-9b-v2")
    layers = tuple("mlp" if k == "attention" else k for k in spec.layers)
    return dataclasses.replace(spec, layers=layers)


def test_pool_sizes_without_kv_bytes(attention_free):
    assert attention_free.kv_bytes_per_token == 0
    pages, slots = pool_sizes(attention_free, get_gpu("a800"), 16)
    assert pages > 0 and slots > 0


@pytest.mark.parametrize("unified", [True, False])
def test_simulate_attention_free(attention_free, unified):
    config = SchedulerConfig(**FIGURE1_BUDGETS)
    setup = SimSetup(attention_free, get_gpu("a800"), config, state_fraction=None if unified else 0.5, check=True)
    branches = [branch_from_record(r, "figure1", attention_free.vocab_size) for r in figure1_records()]
    measures, _ = run_arm(setup, get_arm("radixflow"), [branches])
    assert measures.rounds > 0
    assert measures.reuse_rate > 0  # the consumers still resume from their producers' states
