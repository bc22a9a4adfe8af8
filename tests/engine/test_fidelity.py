"""The fidelity helper itself (tests/fidelity.py): its float64 truth is float64 all the way, and its
check fails outside the bound."""

from __future__ import annotations

import pytest
import torch
from handoff_cases import cold_logits, ids

from fidelity import float64_mode, reference
from radixflow.engine.loader import load_model
from radixflow.engine.tiny import ensure_tiny_model


def test_float64_mode_widens_every_named_float_dtype():
    x = torch.ones(3)
    with float64_mode():
        assert x.float().dtype == torch.float64 and x.to(torch.float32).dtype == torch.float64
        assert x.bfloat16().dtype == torch.float64 and torch.zeros(2).dtype == torch.float64
        assert torch.softmax(x, -1, dtype=torch.float32).dtype == torch.float64
        assert torch.arange(3).dtype == torch.int64  # integers untouched
    assert torch.zeros(2).dtype == torch.float32     # and the default restored


@pytest.mark.parametrize("name", ["tiny-qwen3.5", "tiny-nemotron-h"])
def test_the_truth_is_float64_in_two_implementations(name, tmp_path):
    """transformers and our engine, each run in float64_mode, agree to ~1e-14 (fp32 differs by ~1e-5):
    nothing in either forward still rounds to fp32, so the truth is no fp32 result itself."""
    from transformers import AutoModelForCausalLM

    path = ensure_tiny_model(name, cache_dir=tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompt = ids(70, 4)
    ref = reference(hf, prompt)
    model = load_model(path, dtype=torch.float64).model
    with float64_mode():
        ours64 = cold_logits(model, prompt)
    assert ours64.dtype == torch.float64
    assert float((ours64 - ref.truth).abs().max()) < 1e-10
    assert ref.own_error > 1e-7  # the fp32 forward is measurably not the truth


def test_check_fails_outside_the_bound(tmp_path):
    from transformers import AutoModelForCausalLM

    path = ensure_tiny_model("tiny-qwen3", cache_dir=tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ref = reference(hf, ids(20, 1))
    assert ref.check(ref.theirs) <= 1 / ref.factor + 1e-9  # transformers' fp32 itself: 1/FACTOR of the bound
    off = ref.truth + 1.01 * ref.bound
    with pytest.raises(AssertionError, match="> bound"):
        ref.check(off, "shifted")
