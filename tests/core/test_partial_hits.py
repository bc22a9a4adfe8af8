"""`--prefix-match-unit U` below the block in `--snapshot-mode vllm-align` (core/partial_hits.py,
core/vllm_split.py): vLLM 0.33's tail-boundary stop, its checkpoint at U granularity, partial hits on
the prompt's last hash boundary and the copy-on-write deferral when the producer runs on."""

from __future__ import annotations

from test_vllm_split import B, _run

from radixflow.core.branch import Branch
from radixflow.core.vllm_split import aligned_split, internal_checkpoint, tail_boundary

U = 16


def test_the_last_chunk_also_stops_at_the_prompts_last_hash_boundary():
    # 191 tokens: the block stop at 128, then vLLM's tail_boundary ⌊190/16⌋·16 = 176, then the tail.
    assert aligned_split(0, 191, 191, 191, B, 8192, exports=False, unit=U) == 128
    assert aligned_split(128, 63, 191, 191, B, 8192, exports=False, unit=U) == 48
    assert aligned_split(176, 15, 191, 191, B, 8192, exports=False, unit=U) == 15
    # A prompt shorter than one block gets two rows, where U = B gives it one.
    assert aligned_split(0, 40, 40, 40, B, 8192, exports=False, unit=U) == 32
    assert aligned_split(0, 40, 40, 40, B, 8192, exports=False) == 40
    assert tail_boundary(40, B, U) == 32 and tail_boundary(40, B, B) == tail_boundary(40, B, None) == 0


def test_an_exported_checkpoint_sits_at_the_hash_boundary_and_needs_a_column_before_the_last():
    assert aligned_split(0, 191, 191, 191, B, 8192, exports=True, unit=U) == 191
    assert internal_checkpoint(0, 191, 191, 191, B, exports=True, unit=U) == 176
    # From a block boundary, the chunk must reach past one more block (is_mamba_prefill_checkpoint_valid:
    # checkpoint column cdiv(end, B) − 2 after the initial state's): 128 → 200 can, 128 → 180 cannot.
    assert internal_checkpoint(128, 200, 200, 200, B, exports=True, unit=U) == 192
    assert aligned_split(128, 72, 200, 200, B, 8192, exports=True, unit=U) == 72
    assert internal_checkpoint(128, 180, 180, 180, B, exports=True, unit=U) is None
    assert aligned_split(128, 52, 180, 180, B, 8192, exports=True, unit=U) == 48  # cut as without export
    assert aligned_split(0, 40, 40, 40, B, 8192, exports=True, unit=U) == 32  # inside one block: cut too


def test_the_scheduler_stops_at_the_tail_and_caches_the_state_there():
    sched, frags = _run([Branch("r", 0, tuple(range(1, 192)))], internal=False, unit=U)
    assert [f[:3] for f in frags] == [(("r", 0), 0, 128), (("r", 0), 128, 48), (("r", 0), 176, 15)]
    assert sorted(t.depth for t in sched.index._tails) == [176]
    _, whole = _run([Branch("r", 0, tuple(range(1, 192)))], internal=True, unit=U)
    # One row; its only saved state is the exported checkpoint (176, no longer the block boundary 128).
    assert whole == [(("r", 0), 0, 191, [176])]


def _pair(gap: float):
    doc = tuple(range(1000, 1050))  # 50 shared tokens, under one block; both prompts' last hash boundary: 48
    return [Branch("a", 0, doc + (1, 2, 3)), Branch("b", 0, doc + (4, 5, 6, 7, 8), arrival=gap)]


def test_a_later_branch_hits_the_partial_tail():
    sched, frags = _run(_pair(gap=1.0), internal=False, unit=U)
    b = next(x for x in sched.finished if x.request_id == "b")
    assert b.cached_tokens == 48
    assert [f[1:3] for f in frags if f[0] == ("b", 0)] == [(48, 7)]
    _, default = _run(_pair(gap=1.0), internal=False)
    assert [f[1:3] for f in default if f[0] == ("b", 0)] == [(0, 55)]  # U = B: no hit inside the block


def test_a_sibling_waits_while_the_tail_is_written_and_while_its_producer_runs_on():
    # Round 1: a computes [0, 48) and caches 48 (pending: b is Blocked). Round 2: a runs on from 48, so
    # vLLM copies that state out in this step and defers hits on it again. Round 3: b starts at 48.
    sched, frags = _run(_pair(gap=0.0), internal=False, unit=U)
    assert [f[:3] for f in frags] == [(("a", 0), 0, 48), (("a", 0), 48, 5), (("b", 0), 48, 7)]
    assert sched.blocked_total == 2
