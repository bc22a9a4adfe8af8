"""`radixflow bench` on the real engine: a small overloaded multi-candidate trace."""

import json

import pytest
import torch

from radixflow.cli import main


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _bench(tmp_path, model, policy, *extra):
    # --state-interval 16 (= one page): every shared prefix holds a boundary, so a sibling is Blocked
    # on its producer under both rules. With a coarser interval, a document shorter than the interval
    # has no boundary, siblings may start cold in the producer's round, and only a sibling scanned
    # after the producer finished finds its end-of-branch snapshot: reuse then depends on timing.
    out = tmp_path / f"{model}.json"
    assert main(["bench", "--model", model, "--policy", policy, "--questions", "16", "--article-scale", "0.04",
                 "--stream", "cold", "--order", "forward", "--rate", "200", "--max-num-batched-tokens", "2048",
                 "--kv-cache-memory", "64MiB", "--max-model-len", "1024", "--state-interval", "16",
                 "--json", str(out), *extra]) == 0
    return {a["policy"]: a for a in json.loads(out.read_text())["arms"]}


def test_hybrid_bench_fewer_rounds_same_reuse_same_tokens(tmp_path):
    # state-ready against prefix-stop on the wait path (--handoff off): under the default auto the
    # Blocked siblings run as dependents under either rule (test_bench_compares_handoff_modes_on_one_trace)
    arms = _bench(tmp_path, "tiny-qwen3.5", "radix,radixflow", "--handoff", "off")
    a, b = arms["radix"], arms["radixflow"]
    assert b["rounds"] < a["rounds"]
    assert abs(a["reuse_rate"] - b["reuse_rate"]) <= 0.03
    assert b["first_token_agreement"] >= 99.0
    ci = b["cost_identity"]
    assert ci["delta_host"] == pytest.approx(ci["round_gain"] - ci["cost_drift"], abs=1e-9)
    assert a["host_time"] > 0 and b["blocked_deferrals"] > 0


def test_full_attention_traversal_changes_nothing_beyond_admission(tmp_path):
    # every request at t=0 (--rate 0): with arrivals spread over wall-clock time, how many arrive before a
    # round depends on how fast the machine ran the rounds before it (5 vs 6 rounds seen on a loaded CPU)
    arms = _bench(tmp_path, "tiny-qwen3", "radix+flex,radixflow", "--rate", "0")
    a, b = arms["radix+flex"], arms["radixflow"]
    assert a["blocked_deferrals"] == b["blocked_deferrals"] == 0
    assert (a["rounds"], a["fragments"], a["tokens"]) == (b["rounds"], b["fragments"], b["tokens"])
    assert b["first_token_agreement"] == 100.0


@pytest.mark.parametrize("model", ["tiny-qwen3.5", "tiny-nemotron-h"])
def test_bench_compares_handoff_modes_on_one_trace(tmp_path, model):
    """--handoff-compare off,auto: the siblings Blocked under off run as dependent rows under auto, in no
    more rounds, with the same reuse and first tokens, and the extra levels' time measured."""
    arms = _bench(tmp_path, model, "radixflow", "--handoff-compare", "off,auto")
    off, auto = arms["radixflow handoff=off"], arms["radixflow handoff=auto"]
    assert off["handoff_rows"] == 0 and off["blocked_deferrals"] > 0
    # dependents of multi-token producers run folded into their scans (no level timed): only those of a
    # 1-token producer open a level, so the levels' time may be 0
    # max_levels is the engine's count: 1 where every producer was a multi-token row (all folded)
    assert auto["handoff_rows"] > 0 and auto["max_levels"] in (1, 2) and 0 <= auto["handoff_time"] < auto["host_time"]
    assert (auto["max_levels"] == 2) == (auto["handoff_time"] > 0)
    assert 0 <= auto["handoff_fold_time"] < auto["host_time"] and auto["handoff_fold_calls"] >= 0
    assert auto["handoff_fold_share"] == pytest.approx(auto["handoff_fold_time"] / auto["host_time"])
    # the fold is predicted and measured in every forward that folded (its calls and state copies),
    # each forward's prediction logged beside its measurement
    folds = auto["fold_prediction"]["forwards"]
    assert folds == len(auto["fold_log"]) and auto["fold_prediction"]["calls"] == auto["handoff_fold_calls"]
    assert (auto["handoff_fold_time"] > 0) == (auto["handoff_fold_measured"] > 0) == (folds > 0)
    assert auto["handoff_fold_time"] == pytest.approx(sum(p for p, *_ in auto["fold_log"]))
    assert auto["handoff_fold_measured"] == pytest.approx(sum(m for _, m, *_ in auto["fold_log"]))
    assert auto["rounds"] <= off["rounds"]
    # reuse_rate is in percent; under auto a sibling arriving (by host time, --rate) while its producer runs
    # becomes a dependent at d, one arriving after it finished hits the end snapshot: which one depends on
    # the machine's speed and moved reuse by ~0.6 points here, so the bound is in points, not 0.03
    assert auto["reuse_rate"] == pytest.approx(off["reuse_rate"], abs=2.0)
    assert auto["first_token_agreement"] == 100.0
    # the levels' cost gross and marginal: the marginal is the gross less the rows priced at level 0
    assert "handoff_marginal_time" not in off
    assert auto["handoff_level0_equivalent"] >= 0
    assert auto["handoff_marginal_time"] == pytest.approx(auto["handoff_time"] - auto["handoff_level0_equivalent"])
    assert auto["handoff_gross_share"] == pytest.approx(auto["handoff_time"] / auto["host_time"])
    assert auto["handoff_marginal_share"] == pytest.approx(auto["handoff_marginal_time"] / auto["host_time"])
    assert set(auto["handoff_level0_fit"]) == {"base", "decode_row", "prefill_row", "prefill_token", "longest_token"}


def test_bench_handoff_compare_refuses_bad_modes_and_handoff_beside_it(tmp_path, capsys):
    assert main(["bench", "--handoff-compare", "off,sometimes"]) == 2
    assert "argument --handoff-compare: unknown mode(s) sometimes" in capsys.readouterr().err
    assert main(["bench", "--handoff-compare", "off,on", "--handoff", "on"]) == 2
    assert "--handoff on" in capsys.readouterr().err


def test_bench_frees_each_parts_pools_before_the_next(tmp_path, monkeypatch):
    """Every workload part's engine builds its own KV / state pools: the previous part's must be gone
    by then (at real size, two 6 GiB pools alive at once took `bench` to 18 GB)."""
    import weakref

    from radixflow.engine import engine as engine_mod

    caches = []

    class Tracked(engine_mod.Engine):
        def __init__(self, *args, **kwargs):
            alive = sum(r() is not None for r in caches)
            assert alive == 0, f"{alive} earlier part's cache(s) still alive at the next Engine"
            super().__init__(*args, **kwargs)
            caches.append(weakref.ref(self.executor.cache))

    monkeypatch.setattr(engine_mod, "Engine", Tracked)
    arms = _bench(tmp_path, "tiny-qwen3.5", "radix", "--handoff-compare", "off,auto")
    assert set(arms) == {"radix handoff=off", "radix handoff=auto"}
    assert len(caches) == 2   # one engine per (arm, part): two arms of one part here
