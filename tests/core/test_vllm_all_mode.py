"""vLLM 0.29's `--mamba-cache-mode all` in `--snapshot-mode vllm-align` (a Mamba-2 model): no chunk is
cut, the state is kept at every block boundary a row crosses, and hits land on the block."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_scheduler_properties import workloads
from test_vllm_split import _Unit, run_align

from factories import small_config
from radixflow.core.branch import Branch
from radixflow.core.loop import run_trace
from radixflow.core.policies import get_arm
from radixflow.core.scheduler import Scheduler


def _run(branches, tokens: int = 1024, arm: str = "radix", mode: str = "all"):
    return run_align(branches, arm, tokens, vllm_version="0.29", mamba_cache_mode=mode)


def test_the_last_chunk_runs_whole_and_every_boundary_keeps_its_state():
    _, frags = _run([Branch("r", 0, tuple(range(1, 192)))])
    assert frags == [(("r", 0), 0, 191, [64, 128])]
    _, align = _run([Branch("r", 0, tuple(range(1, 192)))], mode="align")  # 0.29 align: cut, one state
    assert align == [(("r", 0), 0, 128, [128]), (("r", 0), 128, 63, [])]


def test_a_chunk_takes_what_the_budget_leaves_without_flooring_to_a_block():
    _, frags = _run([Branch("r", 0, tuple(range(1, 401)))], tokens=100)
    assert [f[1:] for f in frags] == [(0, 100, [64]), (100, 100, [128, 192]), (200, 100, [256]),
                                      (300, 100, [320, 384])]


def test_siblings_hit_the_block_and_wait_while_it_is_written():
    doc = tuple(range(1000, 1150))  # 150 shared tokens: blocks at 64 and 128
    later = [Branch("a", 0, doc + (1, 2, 3)), Branch("b", 0, doc + (4, 5, 6), arrival=1.0)]
    sched, frags = _run(later)
    assert next(x for x in sched.finished if x.request_id == "b").cached_tokens == 128
    assert [f[1:3] for f in frags if f[0] == ("b", 0)] == [(128, 25)]

    def together():
        return [Branch("a", 0, doc + (1, 2, 3)), Branch("b", 0, doc + (4, 5, 6)), Branch("c", 0, (7,) * 30)]

    # b's hit is a block a writes this round: vLLM defers it a step; prefix-stop leaves c behind it,
    # state-ready traversal runs c at once.
    sched, frags = _run(together())
    assert sched.blocked_total == 1
    assert [f[:3] for f in frags] == [(("a", 0), 0, 153), (("b", 0), 128, 25), (("c", 0), 0, 30)]
    sched, frags = _run(together(), arm="radixflow")
    assert [f[:3] for f in frags] == [(("a", 0), 0, 153), (("c", 0), 0, 30), (("b", 0), 128, 25)]
    assert sched.rounds[0].rows == 2


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.integers(1, 5), st.sampled_from([16, 32, 48, 100]), st.sampled_from([64, 4096]),
       st.sampled_from(["radix", "radix+flex", "radixflow"]))
def test_all_mode_finishes_everything_and_snapshots_only_block_boundaries(branches, rows, tokens, pages, arm):
    cfg = small_config(max_num_seqs=rows, max_num_batched_tokens=tokens, block_size=16, state_interval=16,
                       num_kv_pages=pages, snapshot_mode="vllm-align", vllm_version="0.29", mamba_cache_mode="all")
    sched = Scheduler(cfg, get_arm(arm), hybrid=True)

    def hook(s, batch):
        s.check_integrity()
        for f in batch.fragments:
            assert f.num_tokens >= 1
            # every state written but the row's working state sits on a block boundary the row crossed
            assert all((f.start + d) % 16 == 0 and f.start < f.start + d <= f.end for d, _ in f.state_out[:-1])

    run_trace(sched, _Unit(), branches, on_round=hook)
    assert len(sched.finished) == len(branches) and sched.holds_nothing()
