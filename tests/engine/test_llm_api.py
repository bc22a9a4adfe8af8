"""The offline Python API: radixflow.LLM generate / score."""

import math

import pytest

from fidelity import set_threads
from radixflow import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm():
    set_threads()
    return LLM("tiny-qwen3.5", policy="radixflow", kv_cache_memory=64 << 20, max_num_seqs=8,
               max_num_batched_tokens=512, state_interval=64)


def test_generate_greedy_seeded_and_lengths(llm):
    greedy = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    a, b = llm.generate(["hello world", "hello world"], greedy)
    assert a.outputs[0].token_ids == b.outputs[0].token_ids and len(a.outputs[0].token_ids) == 5
    assert a.outputs[0].finish_reason == "length"
    seeded = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, seed=7, max_tokens=6, ignore_eos=True)
    x = llm.generate("once upon", seeded)[0].outputs[0].token_ids
    y = llm.generate("once upon", seeded)[0].outputs[0].token_ids
    assert x == y


def test_stop_token_and_logprobs(llm):
    first = llm.generate("abc", SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))[0].outputs[0]
    stop = first.token_ids[0]
    out = llm.generate("abc", SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[stop], logprobs=3))[0]
    o = out.outputs[0]
    assert o.token_ids == [stop] and o.finish_reason == "stop"
    assert len(o.top_logprobs[0]) == 3 and o.logprobs[0] <= 0
    assert math.isclose(o.logprobs[0], o.top_logprobs[0][0][1], abs_tol=1e-5)  # greedy = the top token


def test_score_is_one_request_whose_candidates_share_the_document(llm):
    doc = "The document says the sky is blue and the grass is green. " * 6
    res = llm.score(doc, [" blue", " red", " green", " pink"], logprobs=4)
    assert len(res.next_token_logprobs) == 4 and all(len(x) == 4 for x in res.next_token_logprobs)
    assert sorted(res.cached_tokens)[1:] == [res.cached_tokens[1]] * 3 and max(res.cached_tokens) >= 256
    s = llm.engine.scheduler
    s.check_integrity()
    assert s.holds_nothing()


def test_bad_params_name_the_field():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="unknown policy"):
        LLM("tiny-qwen3", policy="fastest")


def test_checkpoints_reach_the_scheduler():
    llm = LLM("tiny-qwen3.5", kv_cache_memory=16 << 20, max_num_seqs=4, max_num_batched_tokens=256,
              state_interval=64, checkpoints="branch")
    assert llm.engine.scheduler_config.checkpoints == "branch"
    assert llm.engine.scheduler.branch_points is not None
    with pytest.raises(ValueError, match="checkpoint mode"):
        LLM("tiny-qwen3.5", kv_cache_memory=16 << 20, checkpoints="sometimes")
    waits = LLM("tiny-qwen3.5", kv_cache_memory=16 << 20, max_num_seqs=4, max_num_batched_tokens=256,
                state_interval=64, checkpoints="branch", checkpoint_wait="64")
    assert waits.engine.scheduler.branch_points.always_wait == 64


def test_eviction_reaches_the_cache_and_a_bad_name_is_refused():
    llm = LLM("tiny-qwen3.5", kv_cache_memory=16 << 20, max_num_seqs=4, max_num_batched_tokens=256,
              state_interval=64, eviction="adaptive")
    assert llm.engine.scheduler_config.eviction == "adaptive"
    assert type(llm.engine.scheduler.index.eviction).__name__ == "Adaptive"
    out = llm.generate([list(range(5, 70)), list(range(5, 60)) + [3]], SamplingParams(max_tokens=2, ignore_eos=True))
    assert [len(o.outputs[0].token_ids) for o in out] == [2, 2]
    llm.engine.scheduler.check_integrity()
    with pytest.raises(ValueError, match="eviction"):
        LLM("tiny-qwen3.5", kv_cache_memory=16 << 20, eviction="fifo")
