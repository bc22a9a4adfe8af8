"""A hybrid with no attention layer (Nemotron-H of Mamba-2 and MLP blocks only) runs in the engine.

Its KV pages hold no bytes: they only index positions for the prefix tree, and the whole memory
budget goes to state slots. Greedy output must equal transformers' on the same weights.
"""

from __future__ import annotations

import pytest
import torch

from fidelity import reference, set_threads
from radixflow import LLM, SamplingParams
from radixflow.engine.memory import pool_sizes
from radixflow.engine.models import RowInput

LAYERS = ["linear_attention", "mlp", "linear_attention", "mlp", "linear_attention"]


@pytest.fixture(scope="module")
def attention_free(tmp_path_factory, hf_model_factory, hf_configs):
    d = tmp_path_factory.mktemp("attention_free")
    hf = hf_model_factory({**hf_configs["nemotron_h"], "layers_block_type": LAYERS}, d)
    return d, hf


def hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    """transformers' greedy tokens (use_cache=False: its cache wants an attention layer to count length)."""
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(hf(torch.tensor([seq]), use_cache=False).logits[0, -1].argmax()))
    return seq[len(prompt):]


def test_pool_sizes_without_kv_bytes():
    pages, slots = pool_sizes(64 << 20, 0, 1 << 20, 16, 512, 4, hybrid=True)
    assert slots == 64                  # the whole budget: no page costs a byte
    assert pages == 32 * 64             # every slot's branch can reach max_model_len


def test_engine_greedy_matches_transformers(attention_free):
    d, hf = attention_free
    set_threads()
    llm = LLM(str(d), kv_cache_memory=16 << 20, max_model_len=512, max_num_seqs=4, state_interval=16)
    model = llm.engine.loaded.model
    assert model.is_hybrid and model.cache_layout().num_kv_layers == 0 and llm.engine.cache.k == []
    doc = torch.randint(0, 256, (80,), generator=torch.Generator().manual_seed(3)).tolist()
    prompts = [doc + [65, 66], doc + [67]]
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    first = llm.generate([prompts[0]], greedy)[0]
    second = llm.generate([prompts[1]], greedy)[0]   # resumes from the first request's snapshots
    assert first.outputs[0].token_ids == hf_greedy(hf, prompts[0], 6)
    assert second.outputs[0].token_ids == hf_greedy(hf, prompts[1], 6)
    assert second.outputs[0].cached_tokens >= 64
    s = llm.engine.scheduler
    s.check_integrity()
    assert s.holds_nothing()


def test_forward_resume_equals_transformers(attention_free):
    from radixflow.engine.loader import load_model

    d, hf = attention_free
    m = load_model(d).model
    ids = torch.randint(0, 256, (90,), generator=torch.Generator().manual_seed(4)).tolist()
    cache = m.allocate_cache(8, 16, 2)
    m([RowInput(ids[:40], 0, list(range(6)), None, [(40, 1)], [])], cache)
    out = m([RowInput(ids[40:], 40, list(range(6)), 1, [], list(range(50)))], cache)
    reference(hf, ids)[40:].check(out, "resumed at 40")
