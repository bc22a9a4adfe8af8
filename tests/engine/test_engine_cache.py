"""The engine over the shared scheduler: prefix-cache hits give the logits of cold runs (both within
fidelity.py's bound of transformers' float64 truth), and memory pressure evicts without losing or
corrupting a request."""

from __future__ import annotations

import random

import pytest
import torch
from engine_harness import drain

from fidelity import reference, set_threads
from radixflow.config import SchedulerConfig
from radixflow.core.branch import Branch
from radixflow.engine.engine import Engine, EngineConfig
from radixflow.engine.loader import load_model
from radixflow.engine.sampling import SamplingParams
from radixflow.engine.tiny import resolve_model

MODELS = ("tiny-qwen3.5", "tiny-nemotron-h", "tiny-qwen3")


@pytest.fixture(scope="module", params=MODELS)
def loaded(request):
    set_threads()
    return request.param, load_model(resolve_model(request.param))


def _engine(name, loaded, policy="radixflow", caching=True, memory=64 << 20, S=8, T=512, max_len=1024,
            handoff="auto"):
    sc = SchedulerConfig(max_num_seqs=S, max_num_batched_tokens=T, block_size=16, state_interval=64,
                         enable_prefix_caching=caching, handoff=handoff)
    return Engine(EngineConfig(model=name, policy=policy, scheduler=sc, kv_cache_memory=memory, max_model_len=max_len),
                  loaded=loaded, keep_logits=True)



def _prompt(rng, n):
    return [rng.randrange(256) for _ in range(n)]


@pytest.mark.parametrize("handoff", ["off", "auto"])
def test_hit_gives_the_same_logits_as_cold(loaded, handoff):
    from transformers import AutoModelForCausalLM

    name, lm = loaded
    rng = random.Random(0)
    doc = _prompt(rng, 200)
    tails = [_prompt(rng, 7 + i) for i in range(4)]
    greedy = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)

    cold = _engine(name, lm, caching=False)
    cold_logits = []
    for i, t in enumerate(tails):
        cold.add([cold.make_branch(f"c{i}", 0, doc + t, greedy)])
        drain(cold)
    cold_logits = [b.user_data.prompt_logits for b in cold.scheduler.finished]

    warm = _engine(name, lm, handoff=handoff)
    warm.add([warm.make_branch("w", i, doc + t, greedy) for i, t in enumerate(tails)])
    rounds = drain(warm)
    hits = sorted(warm.scheduler.finished, key=lambda b: b.index)
    assert sum(b.cached_tokens for b in hits) >= 3 * 192, "siblings must resume from the shared document"
    if name == "tiny-qwen3":
        # Full attention: siblings read the producer's pages in the same round they are written.
        first = rounds[0]
        assert first.num_rows == 4 and sum(1 for f in first.fragments if f.start > 0) == 3
    elif handoff == "off":  # the siblings wait a round and resume from the published snapshot
        assert warm.scheduler.blocked_total > 0 and len(rounds) >= 2
    else:  # the default: they run in the producer's forward as its dependents (SPEC §15)
        assert warm.handoff_rows == 3 and warm.scheduler.blocked_total == 0
    hf = AutoModelForCausalLM.from_pretrained(resolve_model(name), dtype=torch.float32).eval()
    for b, cold_b in zip(hits, cold_logits):
        ref = reference(hf, list(b.prompt))[-1]
        ref.check(cold_b, f"{name} branch {b.index}: a cold run")
        ref.check(b.user_data.prompt_logits, f"{name} branch {b.index}: a hit (handoff {handoff})")
    assert warm.scheduler.holds_nothing()


def _workload(rng, n_groups=5):
    reqs = []
    for _ in range(n_groups):
        doc = _prompt(rng, rng.randint(100, 300))
        reqs.append([doc + _prompt(rng, rng.randint(3, 12)) for _ in range(3)])
    return reqs


def _run(eng: Engine, reqs, max_tokens=6) -> dict:
    p = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for r, prompts in enumerate(reqs):
        eng.add([eng.make_branch(f"r{r}", i, pr, p) for i, pr in enumerate(prompts)])
    drain(eng)
    assert eng.scheduler.holds_nothing()
    return {b.key: list(b.output) for b in eng.scheduler.finished}


def test_memory_pressure_evicts_but_outputs_match(loaded):
    name, lm = loaded
    reqs = _workload(random.Random(1))
    roomy = _run(_engine(name, lm), reqs)
    probe = _engine(name, lm)
    page_bytes = probe.cache.kv_bytes_per_token * 16
    slot_bytes = probe.cache.state_bytes_per_slot if probe.scheduler.hybrid else 0
    # Enough for the longest branch and a little more: the cache must evict (and may preempt).
    tight_memory = 40 * page_bytes + (8 * slot_bytes if slot_bytes else 0)
    tight = _engine(name, lm, memory=int(tight_memory / 0.7) if slot_bytes else tight_memory, max_len=400)
    out = _run(tight, reqs)
    assert out == roomy
    idx = tight.scheduler.index
    assert idx.evicted_pages + idx.evicted_snapshots + tight.scheduler.preemptions > 0


@pytest.mark.parametrize("handoff", ["off", "on", "auto"])
def test_arms_agree_on_tokens_and_reuse(loaded, handoff):
    """Both arms give the same tokens. Reuse and rounds are compared where the decisions do not read a
    clock: under `auto` the engine prices hand-off / wait / recompute from its own measured costs
    (engine/calibration.py), so a recompute (fewer cached tokens) can be the cheaper choice on one
    machine and not on another."""
    name, lm = loaded
    reqs = _workload(random.Random(2), n_groups=4)
    a = _engine(name, lm, policy="radix", handoff=handoff)
    b = _engine(name, lm, policy="radixflow", handoff=handoff)
    out_a, out_b = _run(a, reqs, 1), _run(b, reqs, 1)
    assert out_a == out_b
    if handoff == "auto":
        return
    reuse = [sum(x.cached_tokens for x in e.scheduler.finished) for e in (a, b)]
    assert reuse[0] == reuse[1]
    assert len(b.scheduler.rounds) <= len(a.scheduler.rounds)


def test_bad_input_is_refused_with_a_clear_error(loaded):
    name, lm = loaded
    eng = _engine(name, lm)
    p = SamplingParams(temperature=0, max_tokens=4)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        eng.make_branch("x", 0, [10**6], p)
    with pytest.raises(ValueError, match="exceeds max_model_len"):
        eng.make_branch("x", 0, [1] * 1022, p)
    with pytest.raises(ValueError, match="too small|holds"):
        _engine(name, lm, memory=4096)
    assert isinstance(eng.make_branch("x", 0, [1, 2], p), Branch)
    # A request is accepted whole or not at all: a failing second branch leaves nothing behind.
    ok = eng.make_branch("y", 0, [1, 2, 3], p)
    huge = Branch("y", 1, tuple([1] * 10), max_new_tokens=10**7)
    with pytest.raises(ValueError, match="KV pages"):
        eng.add([ok, huge])
    assert not eng.scheduler.has_unfinished and "y" not in eng.requests


def test_a_pool_too_small_for_a_full_round_is_said(loaded):
    """A hybrid pool with fewer state slots than --max-num-seqs rows need (a running slot and a capture
    each) runs, but says so, naming --kv-cache-memory and what lets every row run; a roomy one is silent."""
    import warnings

    name, lm = loaded
    probe = _engine(name, lm)
    if not probe.scheduler.hybrid:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            _engine(name, lm, memory=1 << 20, max_len=64)
        assert not [w for w in seen if "state slots" in str(w.message)]
        return
    slot = probe.cache.state_bytes_per_slot
    page_bytes = probe.cache.kv_bytes_per_token * 16
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        tight = _engine(name, lm, memory=int(64 * page_bytes + 6 * slot / 0.3), max_len=256)
    said = [str(w.message) for w in seen if "state slots" in str(w.message)]
    assert tight.scheduler_config.num_state_slots < 16 and len(said) == 1
    assert "--kv-cache-memory" in said[0] and "--max-num-seqs 8" in said[0]
    need = int(said[0].split("--kv-cache-memory ")[1].split("MiB")[0]) << 20
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        roomy = _engine(name, lm, memory=need, max_len=256)
    assert roomy.scheduler_config.num_state_slots >= 16
    assert not [w for w in seen if "state slots" in str(w.message)]
