"""c(B): the terms add up to the charged time, and the LM head is paid once per row."""

from __future__ import annotations

import pytest

from radixflow.core.batch import Batch, Fragment
from radixflow.core.branch import Branch
from radixflow.sim.cost_model import CallCost, CostModel, get_gpu
from radixflow.spec import get_spec


def batch(*lengths: int, start: int = 0) -> Batch:
    frags = []
    for i, n in enumerate(lengths):
        b = Branch(f"r{i}", 0, tuple(range(start + n)), "ns", 0.0, 1)
        frags.append(Fragment(b, start, n, page_table=[]))
    return Batch(0, frags)


@pytest.mark.parametrize("model", ["qwen3.5-0.8b", "qwen3.5-27b", "nemotron-nano-9b-v2", "qwen3-8b"])
def test_terms_add_up_to_the_call_time(model):
    cm = CostModel(get_spec(model), get_gpu("a800"))
    for b in (batch(17), batch(4096, 300, 12), batch(512, 512, start=2048)):
        t = cm.terms(b)
        assert isinstance(t, CallCost) and all(x >= 0 for x in t)
        assert cm.call_time(b) == pytest.approx(t.total) and t.total == sum(t)
    assert cm.call_time(Batch(0)) == 0.0 and cm.terms(Batch(0)).total == 0.0


def test_lm_head_is_paid_once_per_row_not_per_token():
    spec, gpu = get_spec("qwen3.5-27b"), get_gpu("a800")
    cm = CostModel(spec, gpu)
    one, two = cm.terms(batch(8192)), cm.terms(batch(4096, 4096))
    assert one.dense_or_traffic > one.host  # compute-bound: the dense term is the FLOPs one
    head = 2 * spec.vocab_size * spec.hidden_size / (gpu.bf16_flops * cm.k.dense_efficiency)
    # the same tokens in two rows: one more LM head, nothing else in the dense term
    assert two.dense_or_traffic - one.dense_or_traffic == pytest.approx(head, rel=1e-9)
    body = (spec.flops_per_token - 2 * spec.vocab_size * spec.hidden_size) * 8192
    assert one.dense_or_traffic == pytest.approx((body + 2 * spec.vocab_size * spec.hidden_size)
                                                 / (gpu.bf16_flops * cm.k.dense_efficiency))


def test_more_rows_and_more_tokens_cost_more():
    cm = CostModel(get_spec("qwen3.5-4b"), get_gpu("a800"))
    assert cm.call_time(batch(1000, 1000)) > cm.call_time(batch(1000))
    assert cm.call_time(batch(4000)) > cm.call_time(batch(2000))
    assert cm.call_time(batch(100, start=4000)) > cm.call_time(batch(100))  # attention over the context
