"""Branch-point checkpoints (SPEC §14) in the scheduler: exact resumes, bounded memory, misses by cause."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factories import make_branches, small_config, wait_config
from radixflow.core.batch import Batch, ExecResult, Sample
from radixflow.core.branch import Branch
from radixflow.core.policies import get_arm
from radixflow.core.scheduler import Scheduler
from radixflow.workloads.trace import Segment, tokens_of


class _Exec:
    def execute(self, batch: Batch) -> ExecResult:
        return ExecResult(0.01, {i: Sample(3 + f.end % 7) for i, f in enumerate(batch.fragments) if f.samples})


def _run(branches, cfg, arm="radixflow", hybrid=True):
    s = Scheduler(cfg, get_arm(arm), hybrid)
    order = sorted(branches, key=lambda b: b.arrival)
    now, i = 0.0, 0
    while i < len(order) or s.has_unfinished:
        while i < len(order) and order[i].arrival <= now:
            s.add(order[i])
            i += 1
        deadline = s.admit(now)
        batch = s.schedule(now)
        if not batch:
            now = max(now, min(t for t in (order[i].arrival if i < len(order) else None, deadline)
                               if t is not None))
            continue
        now += 0.01
        s.complete(batch, _Exec().execute(batch), now)
        s.check_integrity()
        _snapshots_sit_on_present_kv(s)
    return s


def _snapshots_sit_on_present_kv(s: Scheduler) -> None:
    idx = s.index
    live = set(idx._iter_nodes()) | set(idx._roots.values())
    free_pages, free_slots = idx.pages.free_ids(), idx.slots.free_ids()
    for snap in [*idx._tails, *(n.snapshot for n in idx._snap_nodes)]:
        node = snap.node
        assert node in live, "a snapshot outlived its node"
        assert snap.slot not in free_slots
        assert all(p not in free_pages for n in node.path() for p in n.pages), "snapshot without its KV path"
        if snap.tail:
            assert snap.tail_page not in free_pages and snap.depth == node.depth + len(snap.tail)


def test_siblings_resume_at_the_exact_branch_point_inside_a_page():
    # doc of 22 tokens with 4-token pages and a 16-token interval: the branch point is unaligned.
    branches = make_branches(3, doc_len=22, tail=3)
    s = _run(branches, small_config(checkpoints="branch"))
    by_req = {}
    for b in s.finished:
        by_req.setdefault(b.request_id, []).append(b)
    for group in by_req.values():
        hits = sorted(b.cached_tokens for b in group)
        assert hits[0] == 0 and hits[1:] == [22, 22, 22], hits
    assert s.exact_checkpoints >= 3
    assert s.holds_nothing()


def test_boundary_mode_resumes_only_on_the_grid():
    s = _run(make_branches(2, doc_len=22, tail=3), wait_config(checkpoints="boundary"))
    assert all(b.cached_tokens % 16 == 0 for b in s.finished)
    assert s.exact_checkpoints == 0 and s.index.num_tails == 0
    # with hand-off, a dependent reads its producer's live state: it starts at the last page both share
    s = _run(make_branches(2, doc_len=22, tail=3), small_config(checkpoints="boundary"))
    assert [b.cached_tokens for b in s.finished if b.index] == [20] * 6
    assert s.exact_checkpoints == 0 and s.index.num_tails == 0


def test_a_finished_branch_leaves_its_exact_end():
    first = Branch("t1", 0, tokens_of([Segment("hist", 30)]), "chat", 0.0, max_new_tokens=3)
    s = Scheduler(small_config(checkpoints="branch"), get_arm("radix"), True)
    _feed(s, [first])
    history = first.tokens[: first.num_computed_tokens]
    assert len(history) == 32 and first.num_computed_tokens == 32  # 30 prompt + 2 of 3 sampled tokens
    second = Branch("t2", 0, tuple(first.tokens) + tokens_of([Segment("user2", 5)]), "chat", 1.0)
    _feed(s, [second])
    assert second.cached_tokens == 32
    third = Branch("t3", 0, tokens_of([Segment("hist", 30)]) + tokens_of([Segment("x", 3)]), "chat", 2.0)
    _feed(s, [third])
    assert third.cached_tokens == 30  # the first prompt's exact end (it generated more than one token)


def _feed(s, branches):
    now = max([0.0] + [b.arrival for b in branches])
    for b in branches:
        s.add(b)
    while s.has_unfinished:
        s.admit(now)
        batch = s.schedule(now)
        if not batch:
            now = s.next_deadline or now + 0.01
            continue
        now += 0.01
        s.complete(batch, _Exec().execute(batch), now)
        s.check_integrity()


def test_tails_go_with_their_node_and_are_evictable():
    s = _run(make_branches(4, doc_len=22, tail=3), small_config(checkpoints="branch"))
    assert s.index.num_tails > 0
    s.index.reset()  # evicts every unlocked page and snapshot
    assert s.index.num_tails == 0 and s.index.num_snapshots == 0
    assert s.slots.num_free == s.slots.capacity and s.pages.num_free == s.pages.capacity
    s.check_integrity()


def test_removing_a_leaf_frees_its_tails():
    s = _run(make_branches(1, doc_len=22, tail=3), small_config(checkpoints="branch"))
    tails = list(s.index._tails)
    node = next(t.node for t in tails if not t.node.is_root)
    while node.children:
        node = next(iter(node.children.values()))
    on_leaf = list(node.tails)
    free_before = s.slots.num_free
    s.index._remove_leaf(node)
    assert all(t not in s.index._tails for t in on_leaf)
    assert s.slots.num_free == free_before + len(on_leaf) + (0 if node.snapshot is None else 1)
    s.check_integrity()


def test_misses_add_up_to_the_prompt():
    branches = make_branches(4, doc_len=40, tail=6, same_doc=True)
    for mode in ("boundary", "branch"):
        s = _run([Branch(b.request_id, b.index, b.prompt, b.namespace, b.arrival) for b in branches],
                 small_config(checkpoints=mode, num_state_slots=6))
        for b in s.finished:
            m = b.misses
            assert m.ready_hit == b.cached_tokens and m.identity_hit >= m.ready_hit
            assert m.ready_hit + m.checkpoint_missing + m.evicted + m.no_shared_prefix == m.prompt == b.prompt_len


def test_evicted_snapshot_is_blamed_on_eviction():
    cfg = small_config(checkpoints="branch")
    s = Scheduler(cfg, get_arm("radix"), True)
    a = Branch("a", 0, tokens_of([Segment("doc", 40)]), "n", 0.0)
    _feed(s, [a])
    s.index.evict_snapshots(s.slots.capacity)  # the state goes, the KV pages stay
    b = Branch("b", 0, tokens_of([Segment("doc", 40), Segment("q", 5)]), "n", 1.0)
    _feed(s, [b])
    assert b.cached_tokens == 0 and b.misses.evicted == 40 and b.misses.checkpoint_missing == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 4), st.integers(1, 40), st.integers(1, 8), st.sampled_from([6, 12, 64]),
       st.sampled_from([0, 600]), st.sampled_from(["radix", "radixflow"]))
def test_bounded_memory_and_nothing_held_after_drain(groups, doc, tail, slots, budget, arm):
    branches = make_branches(groups, doc_len=doc, tail=tail, arrival_gap=0.005)
    cfg = small_config(checkpoints="branch", num_state_slots=slots, num_kv_pages=120,
                       cache_memory_bytes=budget, kv_page_bytes=10 if budget else 0,
                       state_slot_bytes=40 if budget else 0, max_num_batched_tokens=48)
    s = _run(branches, cfg, arm)
    assert len(s.finished) == len(branches)
    assert s.holds_nothing()
    assert s.index.num_snapshots <= slots


def _hits(s):
    by_req = {}
    for b in s.finished:
        by_req.setdefault(b.request_id, []).append(b)
    return {r: sorted(b.cached_tokens for b in g) for r, g in sorted(by_req.items())}


def test_a_wait_is_taken_only_where_it_adds_no_round():
    from radixflow.core.checkpoints import BranchPoints

    bp = BranchPoints(block_size=4, interval=32, min_wait=8)
    assert not bp.worth_waiting(0, 20, next_round_sure=False)  # shorter than one interval: recompute now
    assert bp.worth_waiting(0, 20, next_round_sure=True)  # round t+1 runs anyway: free
    assert bp.worth_waiting(24, 40, next_round_sure=False)  # crosses the state boundary at 32: boundary mode waits too
    assert not bp.worth_waiting(34, 40, next_round_sure=True)  # saves less than min_wait
    n = BranchPoints(block_size=4, interval=32, min_wait=8, always_wait=16)  # --checkpoint-wait 16
    assert n.worth_waiting(0, 20, next_round_sure=False) and not n.worth_waiting(0, 12, next_round_sure=False)


def test_siblings_of_a_question_shorter_than_a_block_run_in_the_producers_round():
    # 22-token document, 3-10-token candidates, 32-token interval: nothing to wait for in boundary mode.
    def branches():
        return make_branches(2, doc_len=22, tail=3, same_doc=True, arrival_gap=1.0)

    grid = _run(branches(), wait_config(checkpoints="branch", state_interval=32))
    assert len(grid.rounds) == 2 and grid.blocked_total == 0
    # The producer's checkpoint is still taken: the next question on the document resumes there.
    assert _hits(grid) == {"r0": [0, 0, 0, 0], "r1": [22, 22, 22, 22]}
    boundary = _run(branches(), wait_config(checkpoints="boundary", state_interval=32))
    assert len(boundary.rounds) == 2 and _hits(boundary) == {"r0": [0] * 4, "r1": [0] * 4}
    wait = _run(branches(), wait_config(checkpoints="branch", state_interval=32, checkpoint_wait="1"))
    assert len(wait.rounds) == 3 and _hits(wait) == {"r0": [0, 22, 22, 22], "r1": [22, 22, 22, 22]}
    for s in (grid, boundary, wait):
        assert s.holds_nothing()


def test_siblings_wait_for_free_when_the_producer_runs_on():
    # The producer decodes two more tokens: round t+1 runs anyway, so its siblings resume at the branch point.
    branches = [Branch(b.request_id, b.index, b.prompt, b.namespace, b.arrival, max_new_tokens=3)
                for b in make_branches(1, doc_len=20, tail=3)]
    s = _run(branches, wait_config(checkpoints="branch", state_interval=32))
    assert _hits(s) == {"r0": [0, 20, 20, 20]}
    assert s.blocked_total == 3 and s.holds_nothing()


def test_checkpoint_wait_must_be_grid_or_a_token_count():
    import pytest

    for bad in ("0", "-4", "often"):
        with pytest.raises(ValueError, match="--checkpoint-wait"):
            small_config(checkpoint_wait=bad).validate()


def _questions(arrivals=(0.0, 5.0)):
    """Two questions on one 100-token document, four candidates each; the second arrives after the first."""
    out = []
    for q, t in enumerate(arrivals):
        for i in range(4):
            toks = tokens_of([Segment("doc", 100), Segment(f"q{q}", 10), Segment(f"q{q}c{i}", 5 + i)])
            out.append(Branch(f"q{q}", i, toks, "ns", t, max_new_tokens=1))
    return out


def test_tail_checkpoints_let_a_later_question_resume_near_the_document_end():
    # 4-token pages, a 64-token interval: without tail checkpoints the second question's first branch resumes
    # at the interval boundary (64) below the document's end (100); with a 64-token tail window the first
    # question's rows snapshot every 4 blocks (16 tokens) of their last 64, so it resumes at 96
    firsts = {}
    for tail in (0, 64):
        s = _run(_questions(), small_config(state_interval=64, checkpoints="branch", tail_checkpoints=tail))
        firsts[tail] = min(b.cached_tokens for b in s.finished if b.request_id == "q1")
        assert s.holds_nothing()
    assert firsts == {0: 64, 64: 96}


def test_tail_checkpoints_are_refused_outside_branch_mode():
    import argparse

    import pytest

    from radixflow.commands.common import scheduler_config
    from radixflow.commands.flags import add_scheduler_flags, remember_defaults

    p = argparse.ArgumentParser()
    add_scheduler_flags(p)
    remember_defaults(p)
    with pytest.raises(ValueError, match="--tail-checkpoints 256: read only with --checkpoints branch"):
        scheduler_config(p.parse_args(["--tail-checkpoints", "256", "--checkpoints", "boundary"]))
    cfg = scheduler_config(p.parse_args(["--tail-checkpoints", "256", "--checkpoints", "branch"]))
    assert cfg.tail_checkpoints == 256
