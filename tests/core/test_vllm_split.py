"""`--snapshot-mode vllm-align`: vLLM 0.33's prefill split (core/vllm_split.py) and what the scheduler
does with it (rows, captures, junction stops)."""

from __future__ import annotations

from factories import make_branches
from radixflow.config import SchedulerConfig
from radixflow.core.batch import ExecResult, Sample
from radixflow.core.branch import Branch
from radixflow.core.loop import run_trace
from radixflow.core.policies import get_arm
from radixflow.core.scheduler import Scheduler
from radixflow.core.vllm_split import aligned_split, internal_checkpoint

B = 64


def test_last_chunk_is_cut_at_the_last_block_boundary_without_internal_checkpoints():
    # 0 -> 191 tokens prompt: vLLM stops at (N-1)//B*B = 128; the 63-token tail runs next step.
    assert aligned_split(0, 191, 191, 191, B, 8192, exports=False) == 128
    assert aligned_split(128, 63, 191, 191, B, 8192, exports=False) == 63
    # A prompt of exactly 3 blocks still leaves its last token: the cut is at 128, not 192.
    assert aligned_split(0, 192, 192, 192, B, 8192, exports=False) == 128


def test_internal_checkpoint_keeps_the_chunk_whole_and_saves_the_boundary():
    assert aligned_split(0, 191, 191, 191, B, 8192, exports=True) == 191
    assert internal_checkpoint(0, 191, 191, 191, B, exports=True) == 128
    # Too short a chunk to hold a checkpoint column (vLLM's is_mamba_prefill_checkpoint_valid): cut instead.
    assert internal_checkpoint(128, 191, 191, 191, B, exports=True) is None
    assert internal_checkpoint(0, 191, 191, 191, B, exports=False) is None


def test_non_final_chunks_end_on_block_boundaries_and_junctions_stop_a_chunk():
    assert aligned_split(0, 100, 400, 400, B, 100, exports=False) == 64  # token budget 100
    assert aligned_split(0, 40, 400, 400, B, 8192, exports=False) == 0  # 40 left: not a block, the row waits
    assert aligned_split(0, 40, 400, 400, B, 40, exports=False) == 40  # a block wider than T advances sub-block
    assert aligned_split(0, 400, 400, 400, B, 8192, exports=True, junction=256) == 256
    assert aligned_split(1, 5, 400, 400, B, 8192, exports=False) == 0  # a non-final chunk cannot end mid-block
    assert aligned_split(32, 100, 400, 400, B, 8192, exports=False) == 32  # mid-block start: to the boundary
    assert aligned_split(400, 1, 400, 401, B, 8192, exports=False) == 1  # decode is never split


class _Unit:
    def execute(self, batch):
        return ExecResult(0.01, {i: Sample(7) for i, f in enumerate(batch.fragments) if f.samples})


def _run(branches, internal: bool, arm="radix", unit: int = 0):
    return run_align(branches, arm, internal_checkpoint=internal, prefix_match_unit=unit)


def run_align(branches, arm: str = "radix", tokens: int = 1024, **config):
    """Runs `branches` in vllm-align mode on B-token blocks; check_integrity() after every round.
    Returns the scheduler and every row as (key, start, tokens, depths of its state captures). The rows
    are vLLM's: `--handoff off` unless `config` says otherwise (vLLM's scheduler cannot hand off)."""
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=tokens, block_size=B, state_interval=B,
                          snapshot_mode="vllm-align", num_kv_pages=512, num_state_slots=256,
                          **{"handoff": "off", **config})
    sched = Scheduler(cfg, get_arm(arm), hybrid=True)
    frags = []

    def hook(s, batch):
        s.check_integrity()
        frags.extend((f.branch.key, f.start, f.num_tokens, [d + f.start for d, _ in f.state_out[:-1]])
                     for f in batch.fragments)

    run_trace(sched, _Unit(), branches, on_round=hook)
    return sched, frags


def test_scheduler_cuts_the_tail_or_exports_the_checkpoint():
    prompt = tuple(range(1, 192))
    _, cut = _run([Branch("r", 0, prompt)], internal=False)
    assert cut == [(("r", 0), 0, 128, [128]), (("r", 0), 128, 63, [])]
    _, whole = _run([Branch("r", 0, prompt)], internal=True)
    assert whole == [(("r", 0), 0, 191, [128])]


def test_siblings_stop_at_the_junction_and_resume_there():
    # Four branches share a 300-token document (prompts 326, 326, 320, 324). The first runs to its last
    # boundary 320 (its own state: past the document) and its tail. The second, in the same round, hits
    # the first's pending KV to 256 but no state: vLLM stops its chunk at that junction so the state at
    # 256 is cached; the last two start from 256 a round later. Every branch takes two rows or more.
    sched, frags = _run(make_branches(1, 300, tail=20), internal=False)
    assert sorted((b.key[1], b.cached_tokens) for b in sched.finished) == [(0, 0), (1, 0), (2, 256), (3, 256)]
    assert frags[:2] == [(("r0", 0), 0, 320, [320]), (("r0", 1), 0, 256, [256])]
    assert len(frags) == 8


def test_a_prefix_match_unit_that_does_not_divide_the_block_is_refused():
    import pytest

    cfg = SchedulerConfig(block_size=B, state_interval=B, snapshot_mode="vllm-align", prefix_match_unit=24)
    with pytest.raises(ValueError, match="--prefix-match-unit 24 must divide the 64-token block"):
        Scheduler(cfg, get_arm("radix"), hybrid=True)
    with pytest.raises(ValueError, match="--prefix-match-unit 16: .* only with --snapshot-mode vllm-align"):
        SchedulerConfig(prefix_match_unit=16).validate()
