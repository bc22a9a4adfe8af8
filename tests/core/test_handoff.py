"""In-forward state hand-off in the scheduler (SPEC §15): dependent rows, levels, the auto rule."""

from __future__ import annotations

import copy
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factories import make_branches, small_config
from radixflow.core.batch import Batch, ExecResult, Sample
from radixflow.core.branch import Branch
from radixflow.core.handoff import RECOMPUTE, WAIT, HandoffCosts, choose, levels_of
from radixflow.core.lookup import BlockedGroups
from radixflow.core.policies import ARMS, get_arm
from radixflow.core.scheduler import Scheduler
from radixflow.workloads.trace import Segment, tokens_of


class _Exec:
    def execute(self, batch: Batch) -> ExecResult:
        return ExecResult(0.004 + 0.0001 * batch.num_tokens,
                          {i: Sample(7 + f.end % 5) for i, f in enumerate(batch.fragments) if f.samples})


def _fresh(branches):
    return [Branch(b.request_id, b.index, b.prompt, b.namespace, b.arrival, b.max_new_tokens, priority=b.priority)
            for b in branches]


def _frag_key(f):
    return (f.branch.uid, f.start, f.num_tokens, tuple(f.page_table), f.state_in, tuple(f.state_out),
            f.samples, f.first, tuple(f.copies_before), tuple(f.copies_after), f.after)


def assert_dependents_sound(s: Scheduler, batch: Batch) -> None:
    """A dependent reads only a state its producer computes in this forward (SPEC §15), on tokens both share."""
    bs, levels = s.block_size, levels_of(batch)
    for i, f in enumerate(batch.fragments):
        if f.after is None:
            continue
        assert 0 <= f.after < i, "a producer comes before its dependent"
        p = batch.fragments[f.after]
        assert p.start < f.start <= p.end, f"row {i} starts outside its producer's fragment"
        # the producer's state at d is its state after the tokens both rows share: d is a capture of the
        # producer's row (its Blocked boundary, an exact branch point) or a page boundary the row passes
        assert f.branch.tokens[: f.start] == p.branch.tokens[: f.start], "a dependent's tokens below d differ"
        assert f.start % bs == 0 or f.start - p.start in {n for n, _ in p.state_out}, "d is no capture nor page"
        assert levels[i] < s.config.handoff_max_levels, "more levels than --handoff-max-levels"
        assert f.first and f.state_in is None
        k = f.start // bs
        tree = {pg for n in s.index._iter_nodes() for pg in n.pages}
        for mine, theirs in zip(f.page_table[:k], p.page_table[:k], strict=True):
            # the producer's page, or the tree's copy of it where the producer keeps a private duplicate
            assert mine == theirs or (theirs in p.branch.sched.private and mine in tree), "a page below d"
        if f.start % bs:
            # the dependent's own (private, or adopted by the tree when its row fills it first)
            assert f.page_table[k] not in p.page_table, "the page d cuts is the dependent's own"


def _drive(branches, cfg, arm="radixflow", hybrid=True, per_round=None, costs=None):
    s = Scheduler(cfg, get_arm(arm), hybrid, handoff_costs=costs)
    order = sorted(branches, key=lambda b: b.arrival)
    now, i = 0.0, 0
    due: list[tuple[Branch, int]] = []  # admitted past D under the claim's (b) the round before: done by now
    for _ in range(10_000):
        if not (i < len(order) or s.has_unfinished):
            break
        while i < len(order) and order[i].arrival <= now:
            s.add(order[i])
            i += 1
        deadline = s.admit(now)
        if per_round is not None:
            per_round(s, now)
        batch = s.schedule(now)
        if not batch:
            nxt = [t for t in (order[i].arrival if i < len(order) else None, deadline) if t is not None]
            assert nxt, "scheduler stuck with work left"
            now = max(now, min(nxt))
            continue
        assert batch.num_rows <= cfg.max_num_seqs and batch.num_tokens <= cfg.max_num_batched_tokens
        assert len({f.branch.uid for f in batch.fragments}) == batch.num_rows
        assert_dependents_sound(s, batch)
        firsts = {f.branch.uid: f.start for f in batch.fragments if f.after is not None}
        res = _Exec().execute(batch)
        now += res.host_time
        s.complete(batch, res, now)
        s.check_integrity()
        # SPEC §12 with dependents placed past D: a (b) admission finishes by the end of round t+1, and
        # what was admitted past D leaves D's rows free at t+1.
        for b, preemptions in due:
            assert b.is_finished or b.num_preemptions > preemptions, "a (b) admission outlived round t+1"
        claims = s.claims
        due = [(b, b.num_preemptions) for b in claims.passed_b] if claims is not None else []
        if claims is not None and claims.reserved_rows:
            assert len(s.running) + claims.reserved_deferred <= cfg.max_num_seqs, "a deferred branch lost its row"
        for b in (*s.running, *s.finished):
            if b.uid in firsts and b.misses is not None and b.num_fragments == 1:
                assert b.cached_tokens == b.misses.ready_hit == firsts[b.uid], "a hand-off's ready hit is d"
    else:
        raise AssertionError("did not finish")
    return s


@st.composite
def workloads(draw):
    n_docs = draw(st.integers(1, 3))
    doc_lens = [draw(st.integers(1, 80)) for _ in range(n_docs)]
    branches, t = [], 0.0
    for q in range(draw(st.integers(1, 6))):
        d = draw(st.integers(0, n_docs - 1))
        for i in range(draw(st.integers(1, 4))):
            toks = tokens_of([Segment(f"d{d}", doc_lens[d]), Segment(f"t{q}.{i}", draw(st.integers(1, 20)))],
                             vocab=50)
            branches.append(Branch(f"q{q}", i, toks, namespace="a", arrival=t,
                                   max_new_tokens=draw(st.integers(1, 3)), priority=draw(st.sampled_from([0, 0, 1]))))
        t += draw(st.sampled_from([0.0, 0.0, 0.001, 0.01]))
    return branches


budgets = st.fixed_dictionaries({
    "max_num_seqs": st.integers(1, 6),
    "max_num_batched_tokens": st.sampled_from([16, 32, 64, 256]),
    "num_kv_pages": st.sampled_from([64, 200, 4096]),
    "num_state_slots": st.sampled_from([8, 16, 512]),
    "cache_memory_bytes": st.sampled_from([0, 0, 3000]),
    "kv_page_bytes": st.just(10),
    "state_slot_bytes": st.just(40),
    "snapshot_mode": st.sampled_from(["every-boundary", "chunk-end"]),
    "checkpoints": st.sampled_from(["boundary", "branch"]),
    "handoff": st.sampled_from(["on", "auto"]),
    "handoff_max_levels": st.integers(1, 3),
})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), budgets, st.sampled_from(list(ARMS)))
def test_every_round_is_feasible_sound_and_intact_with_handoff(branches, budget, arm):
    costs = HandoffCosts(level=0.002, token=0.0001, round=0.02) if budget["handoff"] == "auto" else None
    s = _drive(branches, small_config(**budget), arm, costs=costs)
    assert len(s.finished) == len(branches) and s.holds_nothing()


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), budgets)
def test_prefix_stop_within_state_ready_within_handoff(branches, budget):
    """With the same C_t and order: prefix-stop ⊆ state-ready, and state-ready ⊆ hand-off wherever the
    hand-off scan was not ended by Other (a dependent takes rows and tokens a later Ready branch may
    then miss). Blocked groups recognised by one key decide as a lookup per branch, with hand-off on."""
    cfg = small_config(**budget)
    checked = []

    def compare(s: Scheduler, now: float) -> None:
        runs = {}
        for name, arm, handoff in (("ps", "radix", False), ("sr", "radixflow", False), ("ho", "radixflow", True)):
            c = copy.deepcopy(s)
            c.arm, c.handoff = get_arm(arm), handoff
            runs[name] = c.schedule(now)
        sel = {k: {f.branch.uid for f in b.fragments} for k, b in runs.items()}
        assert sel["ps"] <= sel["sr"]
        if runs["ho"].stop_reason is None:
            assert sel["sr"] <= sel["ho"], "hand-off left out a branch state-ready selected"
        full = copy.deepcopy(s)
        full.group_shortcut = False
        with mock.patch.object(BlockedGroups, "find", lambda self, b: None):
            b_full = full.schedule(now)
        b_ho = copy.deepcopy(s).schedule(now)
        assert [_frag_key(f) for f in b_full.fragments] == [_frag_key(f) for f in b_ho.fragments]
        checked.append(sum(f.after is not None for f in b_ho.fragments))

    _drive(_fresh(branches), cfg, per_round=compare)
    assert checked


def _one_round(branches, **kw):
    s = Scheduler(small_config(**kw), get_arm("radixflow"), hybrid=True)
    for b in branches:
        s.add(b)
    s.admit(1.0)
    return s, s.schedule(1.0)


def test_siblings_run_beside_their_producer_in_one_forward():
    # 4 branches on a 40-token document, 16-token interval: the producer snapshots at 16 and 32.
    branches = make_branches(1, doc_len=40, tail=3)
    _, off = _one_round(_fresh(branches), handoff="off")
    s, on = _one_round(_fresh(branches), handoff="on")
    assert off.num_rows == 1 and off.deferred == 3
    assert on.num_rows == 4 and on.deferred == 0
    assert [f.after for f in on.fragments] == [None, 0, 0, 0]
    # the dependents start where the shared document ends (its last page, 40), not at the Blocked
    # boundary 32: a wait would resume there too (the producer's end-of-prompt checkpoint)
    assert all(f.start == 40 for f in on.fragments[1:])
    assert s.rounds[-1].handoff_rows == 3 and s.rounds[-1].levels == 2
    assert_dependents_sound(s, on)


def test_rows_short_of_slots_keep_their_deepest_boundaries_under_handoff():
    # two producers on two 120-token documents (16-token interval) in one round, with slots for two of
    # the second row's boundaries: under hand-off it keeps its deepest (where its siblings and next turn
    # resume), `off` keeps the first two that found a slot, as before (its decisions are pinned)
    def kept(mode):
        s, batch = _one_round(_fresh(make_branches(2, doc_len=120, branches_per_group=1, tail=3)),
                              handoff=mode, num_state_slots=12)
        assert batch.num_rows == 2
        second = batch.fragments[1]
        depths = sorted(n.snapshot.depth for n in s.index._snap_nodes if n.snapshot.producer == second.branch.uid)
        # each capture is in the row's state_out at its offset, ascending, with the slot the tree holds
        outs = [(n, slot) for n, slot in second.state_out if slot != second.branch.sched.working]
        assert [n + second.start for n, _ in outs] == depths
        for n, slot in outs:
            assert s.index.node_after(second.branch.sched.hashes, (n + second.start) // 4).snapshot.slot == slot
        s.complete(batch, _Exec().execute(batch), 1.1)
        s.check_integrity()
        return second.end, depths

    end, off = kept("off")
    assert (end, off) == (112, [16, 32])
    assert kept("on") == (112, [96, 112]) and kept("auto") == (112, [96, 112])


def test_a_dependent_at_an_exact_branch_point_inside_a_page():
    branches = make_branches(1, doc_len=22, tail=3)  # branch point 22: inside page 5 (4-token pages)
    s, batch = _one_round(_fresh(branches), handoff="on", checkpoints="branch")
    deps = [f for f in batch.fragments if f.after is not None]
    assert deps and all(f.start == 22 for f in deps)
    assert_dependents_sound(s, batch)
    s.complete(batch, _Exec().execute(batch), 1.1)
    s.check_integrity()
    assert all(b.cached_tokens == 22 for b in s.running if b.index)


def test_one_level_means_no_handoff_and_levels_chain():
    """A chain: each branch extends the previous one's prompt, so each is Blocked on the one before."""
    base = [Segment("doc", 20)]
    chain = []
    for i in range(3):
        base = [*base, Segment(f"seg{i}", 16)]
        chain.append(Branch(f"c{i}", 0, tokens_of(base), namespace="ns"))
    _, one = _one_round(_fresh(chain), handoff="on", handoff_max_levels=1, max_num_batched_tokens=512)
    assert [f.after for f in one.fragments] == [None]
    _, two = _one_round(_fresh(chain), handoff="on", handoff_max_levels=2, max_num_batched_tokens=512)
    assert [f.after for f in two.fragments] == [None, 0]
    s, three = _one_round(_fresh(chain), handoff="on", handoff_max_levels=3, max_num_batched_tokens=512)
    assert [f.after for f in three.fragments] == [None, 0, 1]
    assert levels_of(three) == [0, 1, 2] and s.rounds[-1].levels == 3
    assert_dependents_sound(s, three)


def test_auto_weighs_level_recompute_and_wait():
    costs = HandoffCosts(level=0.010, token=0.0001, round=0.040)
    assert choose(costs, True, 500, True) == "handoff"  # 10 ms < 50 ms recompute, < 40 ms wait
    assert choose(costs, True, 50, False) == RECOMPUTE  # 5 ms < 10 ms level, < 80 ms (two rounds)
    assert choose(costs, True, 50, False, spent=0.006) == "handoff"  # ski rental: 5 + 6 ms paid >= the level
    assert choose(costs, False, 50, False) == "handoff"  # the level already runs: free
    assert choose(HandoffCosts(level=0.050, token=0.001, round=0.040), True, 500, True) == WAIT
    assert choose(HandoffCosts(level=0.050, token=0.001, round=0.040), True, 500, False) == "handoff"
    assert choose(None, True, 1, True) == "handoff"


def test_auto_recomputes_a_short_gap_and_hands_off_a_long_one():
    branches = make_branches(1, doc_len=40, tail=3)
    dear = HandoffCosts(level=1.0, token=0.0001, round=10.0)  # a level dearer than 32 tokens
    s = Scheduler(small_config(handoff="auto"), get_arm("radixflow"), True, handoff_costs=dear)
    for b in _fresh(branches):
        s.add(b)
    s.admit(1.0)
    batch = s.schedule(1.0)
    assert batch.num_rows == 4 and all(f.after is None for f in batch.fragments)
    assert [f.start for f in batch.fragments] == [0, 0, 0, 0]  # recompute from the published state (none)
    cheap = HandoffCosts(level=0.0001, token=0.0001, round=10.0)
    s = Scheduler(small_config(handoff="auto"), get_arm("radixflow"), True, handoff_costs=cheap)
    for b in _fresh(branches):
        s.add(b)
    s.admit(1.0)
    assert [f.after for f in s.schedule(1.0).fragments] == [None, 0, 0, 0]


def test_full_attention_and_off_never_hand_off():
    branches = make_branches(2, doc_len=40, tail=3)
    for hybrid, handoff in ((False, "on"), (True, "off")):
        s = _drive(_fresh(branches), small_config(handoff=handoff), hybrid=hybrid)
        assert s.handoff_rows == 0 and all(r.levels == 1 for r in s.rounds)


def test_chained_producers_take_ceil_d_over_l_rounds():
    from radixflow.workloads.chained import chained_records
    from radixflow.workloads.trace import branch_from_record

    recs = chained_records(documents=2, questions=6, document_len=40, segment_len=16)
    for mode, levels, rounds in (("off", 1, 6), ("on", 2, 3), ("on", 3, 2), ("on", 6, 1)):
        branches = [branch_from_record(r) for r in recs]
        s = _drive(branches, small_config(max_num_seqs=16, max_num_batched_tokens=1024, handoff=mode,
                                          handoff_max_levels=levels))
        assert len(s.rounds) == rounds == -(-s.max_level // levels), (mode, levels, len(s.rounds))
        assert s.max_level == 6 and s.holds_nothing()


def test_chained_records_refuse_bad_shapes():
    import pytest

    from radixflow.workloads.chained import chained_records

    with pytest.raises(ValueError, match="must be >= 1"):
        chained_records(questions=0)


vllm_budgets = st.fixed_dictionaries({
    "max_num_seqs": st.integers(1, 6),
    "max_num_batched_tokens": st.sampled_from([16, 32, 64]),
    "block_size": st.just(8),
    "state_interval": st.just(8),
    "snapshot_mode": st.just("vllm-align"),
    "internal_checkpoint": st.booleans(),
    "prefix_match_unit": st.sampled_from([0, 4]),
    "checkpoints": st.sampled_from(["boundary", "branch"]),
    "num_kv_pages": st.sampled_from([40, 4096]),
    "num_state_slots": st.sampled_from([10, 512]),
    "handoff": st.sampled_from(["on", "auto"]),
    "handoff_max_levels": st.integers(2, 3),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), vllm_budgets)
def test_handoff_in_the_vllm_faithful_mode_is_sound(branches, budget):
    costs = HandoffCosts(level=0.002, token=0.0001, round=0.02) if budget["handoff"] == "auto" else None
    s = _drive(branches, small_config(**budget), costs=costs)
    assert len(s.finished) == len(branches) and s.holds_nothing()


def test_vllm_align_siblings_hand_off_at_the_producers_block():
    branches = make_branches(1, doc_len=40, tail=3)
    kw = dict(block_size=8, state_interval=8, snapshot_mode="vllm-align", handoff="on")
    s, batch = _one_round(_fresh(branches), **kw)
    # The first branch's chunk ends at its last block boundary (48), past the document: no state at 40.
    # The second stops at the junction 40 (vLLM's shared-prefix stop) and writes it; the other two hand off.
    assert [(f.start, f.end, f.after) for f in batch.fragments] == [(0, 48, None), (0, 40, None), (40, 43, 1),
                                                                    (40, 47, 1)]
    assert_dependents_sound(s, batch)
