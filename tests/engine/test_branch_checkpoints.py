"""Branch-point checkpoints on the real engine (SPEC §14): a branch resumed from a snapshot captured
inside a chunk, at a depth that is neither a page nor an interval multiple, gives the logits of a
cold run and of transformers (each within fidelity.py's bound of the float64 truth)."""

from __future__ import annotations

import pytest
import torch
from engine_harness import drain

from fidelity import reference, set_threads
from radixflow.config import SchedulerConfig
from radixflow.engine.engine import Engine, EngineConfig
from radixflow.engine.loader import load_model
from radixflow.engine.models import RowInput
from radixflow.engine.sampling import SamplingParams

BLOCK, INTERVAL = 16, 64
DOC = 203  # not a multiple of the page (16) nor of the interval (64)
GREEDY = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)


@pytest.fixture(scope="module")
def setup(family):
    set_threads()
    name, directory, hf = family
    return name, directory, load_model(directory), hf


def _engine(directory, loaded, checkpoints="branch", caching=True):
    sc = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512, block_size=BLOCK, state_interval=INTERVAL,
                         enable_prefix_caching=caching, checkpoints=checkpoints)
    return Engine(EngineConfig(model=str(directory), scheduler=sc, kv_cache_memory=32 << 20, max_model_len=1024),
                  loaded=loaded, keep_logits=True)



def _ids(n, seed):
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_state_out_at_any_point_of_a_chunk(setup):
    """The model contract: a capture at any k in [1, n] inside one chunk resumes exactly (vs transformers)."""
    _, _, lm, hf = setup
    model = lm.model
    if not model.is_hybrid:
        pytest.skip("full attention has no state to capture")
    ids = _ids(150, 7)
    for k in (1, 37, 101, 150):
        cache = model.allocate_cache(32, BLOCK, 4)
        table = list(range(-(-150 // BLOCK)))
        model([RowInput(ids, 0, table, None, [(k, 1)], [])], cache)
        other = _ids(20, 8 + k)
        cont = list(range(20, 20 + -(-(k + 20) // BLOCK)))
        cache.copy_page(table[k // BLOCK], cont[k // BLOCK]) if k % BLOCK else None
        cont[: k // BLOCK] = table[: k // BLOCK]
        out = model([RowInput(other, k, cont, 1, [], [len(other) - 1])], cache)
        reference(hf, ids[:k] + other)[-1].check(out[0], f"resumed from a capture at {k}")


def test_siblings_resume_at_the_unaligned_branch_point(setup):
    name, directory, lm, hf = setup
    doc = _ids(DOC, 1)
    prompts = [doc + _ids(5 + i, 10 + i) for i in range(4)]

    cold = _engine(directory, lm, caching=False)
    for i, p in enumerate(prompts):
        cold.add([cold.make_branch(f"c{i}", 0, p, GREEDY)])
        drain(cold)
    cold_logits = {b.request_id: b.user_data.prompt_logits for b in cold.scheduler.finished}

    warm = _engine(directory, lm)
    warm.add([warm.make_branch("w", i, p, GREEDY) for i, p in enumerate(prompts)])
    drain(warm)
    done = sorted(warm.scheduler.finished, key=lambda b: b.index)
    if lm.model.is_hybrid:
        assert [b.cached_tokens for b in done] == [0, DOC, DOC, DOC], "siblings resume at the exact branch point"
        assert warm.scheduler.exact_checkpoints >= 1
    for b in done:
        ref = reference(hf, list(b.prompt))[-1]
        ref.check(cold_logits[f"c{b.index}"], f"{name} sibling {b.index}: a cold run")
        ref.check(b.user_data.prompt_logits, f"{name} sibling {b.index}")
    assert warm.scheduler.holds_nothing()


def test_next_turn_resumes_at_the_exact_end_of_the_last(setup):
    """A chat turn: the next request resumes at the token where the last branch stopped computing."""
    _, directory, lm, hf = setup
    eng = _engine(directory, lm)
    first = _ids(93, 3)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    eng.add([eng.make_branch("t1", 0, first, params)])
    drain(eng)
    b1 = eng.scheduler.finished[-1]
    history = list(b1.prompt) + b1.output
    computed = len(history) - 1  # the last sampled token never ran through the model
    second = history + _ids(9, 4)
    eng.add([eng.make_branch("t2", 0, second, GREEDY)])
    drain(eng)
    b2 = eng.scheduler.finished[-1]
    if lm.model.is_hybrid:
        assert computed % BLOCK and b2.cached_tokens == computed
    reference(hf, second)[-1].check(b2.user_data.prompt_logits, "the next turn")
    assert eng.scheduler.holds_nothing()
