"""A handful of the never-loses sweep's configs (all of them: benchmarks/sim_sweep.py)."""

import pytest

from radixflow.sim.sweep import check, configs, run_config, workload

PICKED = [("decode-kv80", 0), ("tight-chunkend-kv80", 2), ("priority-kv100", 0), ("poisson5", 1),
          ("long-doc-kv160", 0), ("burst-1tok-s8", 0)]
BY_KEY = {(c.name, c.seed): c for c in configs()}


def test_the_sweep_has_every_kind_and_enough_configs():
    cs = configs()
    assert len(cs) >= 24
    assert len({(c.name, c.seed) for c in cs}) == len(cs)
    assert any(c.priorities > 1 for c in cs) and any(c.rate > 0 for c in cs)
    assert any(c.doc_len[0] > c.max_num_batched_tokens for c in cs)
    assert any(c.output_len == (1, 1) for c in cs) and any(c.num_kv_pages <= 100 for c in cs)


@pytest.mark.parametrize("key", PICKED, ids=[f"{n}-{s}" for n, s in PICKED])
def test_radixflow_never_loses_to_radix(key):
    res = run_config(BY_KEY[key], check=True)  # --handoff off: the claim's wait path (SPEC §12)
    assert check(res) == []
    if key[0].startswith(("decode-kv80", "long-doc")):
        assert res["radix"].preemptions > 0, "the KV-tight config no longer preempts: it tests nothing"
    assert res["radixflow"].deferrals > 0, "nothing was Blocked: the config does not exercise the claim"


@pytest.mark.parametrize("key", PICKED, ids=[f"{n}-{s}" for n, s in PICKED])
def test_radixflow_never_loses_to_radix_with_handoff_auto(key):
    """The default: the same bounds hold with dependents (SPEC §15)."""
    assert check(run_config(BY_KEY[key], check=True, handoff="auto")) == []


def test_the_burst_keeps_its_round_reduction():
    res = run_config(BY_KEY[("burst-1tok", 0)])  # the wait path: with hand-off both arms take 16 rounds
    assert res["radixflow"].rounds <= 0.6 * res["radix"].rounds


def test_priorities_reach_the_branches():
    c = BY_KEY[("priority-kv100", 0)]
    assert len({b.priority for b in workload(c)}) > 1
