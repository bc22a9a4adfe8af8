from radixflow.config import SchedulerConfig
from radixflow.core.policies import get_arm
from radixflow.sim.cost_model import get_gpu
from radixflow.sim.runner import SimSetup, run_arm
from radixflow.spec import get_spec
from radixflow.workloads.figure1 import FIGURE1_BUDGETS, figure1_records
from radixflow.workloads.trace import branch_from_record


def _run(arm: str, model: str = "qwen3.5-0.8b", handoff: str = "off"):
    """The paper's Figure 1 runs the wait path (`--handoff off`): its 6 / 4 rounds are the paper's."""
    brs = [branch_from_record(r) for r in figure1_records()]
    setup = SimSetup(get_spec(model), get_gpu("a800"), SchedulerConfig(**FIGURE1_BUDGETS, handoff=handoff),
                     check=True)
    return run_arm(setup, get_arm(arm), [brs])


def test_figure1_prefix_stop_six_rounds_nine_empty():
    m, _ = _run("radix")
    assert (m.fragments, m.tokens, m.rounds, m.empty_slots, m.lower_bound) == (15, 12970, 6, 9, 4)


def test_figure1_state_ready_reaches_lower_bound():
    m, runs = _run("radixflow")
    assert (m.fragments, m.tokens, m.rounds, m.empty_slots, m.lower_bound) == (15, 12970, 4, 1, 4)
    assert m.dependency_depth == 2
    assert runs[0].scheduler.holds_nothing()


def test_figure1_full_attention_has_no_blocked_and_no_gain():
    a, _ = _run("radix", "qwen3-8b")
    b, _ = _run("radixflow", "qwen3-8b")
    assert a.blocked_deferrals == b.blocked_deferrals == 0
    assert a.rounds == b.rounds


def test_merged_latency_percentiles_pool_the_requests():
    from radixflow.core.metrics import ArmMeasures, merge, percentile

    def part(lat):
        skip = ("policy", "latencies", "lower_bound", "misses")
        base = {f: 0 for f in ArmMeasures.__dataclass_fields__ if f not in skip}
        return ArmMeasures(policy="x", lower_bound=None, **{**base, "requests": len(lat), "rounds": 1,
                                                             "tokens": 1, "max_num_seqs": 1}, latencies=lat)

    a, b = part([1.0] * 19 + [100.0]), part([2.0] * 20)
    m = merge("x", [a, b])
    pooled = a.latencies + b.latencies
    assert m.latency_p95 == percentile(pooled, 0.95) and m.latency_mean == sum(pooled) / 40
    assert "latencies" not in m.to_dict()


def test_figure1_with_handoff_on_both_arms_reach_the_lower_bound():
    """SPEC §15: each consumer runs beside its producer, so even prefix-stop meets the bound, nothing Blocked."""
    for arm in ("radix", "radixflow"):
        m, _ = _run(arm, handoff="on")
        assert (m.fragments, m.tokens, m.rounds, m.blocked_deferrals) == (15, 12970, 4, 0)
        assert m.rounds == m.lower_bound
