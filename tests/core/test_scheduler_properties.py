"""Property tests of the scheduler's guarantees (SPEC §5) over random workloads and budgets. The batch
comparisons (prefix-stop ⊆ state-ready, Blocked groups) are the wait path's (`--handoff off`); with
dependents they are restated in test_handoff.py."""

import copy
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_handoff import assert_dependents_sound

from factories import small_config, wait_config
from radixflow.core.batch import Batch, ExecResult, Outcome, Sample
from radixflow.core.branch import Branch
from radixflow.core.lookup import BlockedGroups
from radixflow.core.policies import ARMS, get_arm
from radixflow.core.scheduler import Scheduler
from radixflow.workloads.trace import Segment, tokens_of


@st.composite
def workloads(draw):
    n_docs = draw(st.integers(1, 4))
    doc_lens = [draw(st.integers(1, 80)) for _ in range(n_docs)]
    n = draw(st.integers(1, 14))
    branches = []
    t = 0.0
    for i in range(n):
        d = draw(st.integers(0, n_docs - 1))
        tail = draw(st.integers(1, 30))
        toks = tokens_of([Segment(f"d{d}", doc_lens[d]), Segment(f"t{i}", tail)], vocab=50)
        t += draw(st.sampled_from([0.0, 0.0, 0.001, 0.01]))
        branches.append(Branch(f"q{i // 2}", i % 2, toks, namespace=draw(st.sampled_from(["a", "b"])),
                               arrival=t, max_new_tokens=draw(st.integers(1, 3)),
                               priority=draw(st.sampled_from([0, 0, 0, 1]))))
    return branches


budgets = st.fixed_dictionaries({
    "max_num_seqs": st.integers(1, 5),
    "max_num_batched_tokens": st.sampled_from([16, 32, 48, 100]),
    "num_kv_pages": st.sampled_from([64, 200, 4096]),
    "num_state_slots": st.sampled_from([8, 16, 512]),
    # 0: separate pools; else pages (10 B) and slots (40 B) share one byte budget (vLLM's hybrid pool)
    "cache_memory_bytes": st.sampled_from([0, 0, 700, 3000]),
    "kv_page_bytes": st.just(10),
    "state_slot_bytes": st.just(40),
    "snapshot_mode": st.sampled_from(["every-boundary", "chunk-end"]),
    "checkpoints": st.sampled_from(["boundary", "branch"]),
})


class _Exec:
    def execute(self, batch: Batch) -> ExecResult:
        return ExecResult(0.004 + 0.0001 * batch.num_tokens,
                          {i: Sample(7 + f.end % 5) for i, f in enumerate(batch.fragments) if f.samples})


def _fresh(branches):
    return [Branch(b.request_id, b.index, b.prompt, b.namespace, b.arrival, b.max_new_tokens, priority=b.priority)
            for b in branches]


def _frag_key(f):
    return (f.branch.uid, f.start, f.num_tokens, tuple(f.page_table), f.state_in, tuple(f.state_out),
            f.samples, f.first, tuple(f.copies_before), tuple(f.copies_after))


def _assert_feasible(s: Scheduler, batch: Batch) -> None:
    cfg = s.config
    assert batch.num_rows <= cfg.max_num_seqs
    assert batch.num_tokens <= cfg.max_num_batched_tokens
    keys = [f.branch.uid for f in batch.fragments]
    assert len(keys) == len(set(keys)), "a branch placed twice in one round"
    for f in batch.fragments:
        b = f.branch
        assert f.num_tokens >= 1 and f.end <= b.num_tokens
        assert len(f.page_table) * cfg.block_size >= f.end
        if s.hybrid and f.end < b.num_tokens:
            assert f.end % cfg.state_interval == 0, "non-final hybrid chunk not on a state boundary"
        crosses = f.end // cfg.state_interval > f.start // cfg.state_interval
        if s.hybrid and cfg.snapshot_mode == "chunk-end" and crosses:
            assert f.end % cfg.state_interval == 0, "chunk-end mode: a chunk crossing a boundary must end on it"
        if s.hybrid and f.start > 0 and f.first and f.after is None:  # a dependent reads its producer's
            assert f.state_in is not None, "hybrid row resumed without a state"
    assert_dependents_sound(s, batch)


def _drive(branches, arm, cfg, hybrid, per_round=None):
    s = Scheduler(cfg, get_arm(arm), hybrid)
    order = sorted(branches, key=lambda b: b.arrival)
    now, i = 0.0, 0
    ex = _Exec()
    due: list[tuple[Branch, int]] = []  # admitted past D under (b) the round before: done by now
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
        _assert_feasible(s, batch)
        res = ex.execute(batch)
        now += res.host_time
        s.complete(batch, res, now)
        s.check_integrity()
        for b, preemptions in due:
            assert b.is_finished or b.num_preemptions > preemptions, "a (b) admission outlived round t+1"
        claims = s.claims
        due = [(b, b.num_preemptions) for b in claims.passed_b] if claims is not None else []
        if claims is not None and claims.reserved_rows:
            # Something that stays was admitted past D_t: the rows D_t had then are still free at t+1.
            assert len(s.running) + claims.reserved_deferred <= cfg.max_num_seqs, "a deferred branch lost its row"
    else:
        raise AssertionError("did not finish")
    return s


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), budgets, st.sampled_from(list(ARMS)), st.booleans(), st.sampled_from(["off", "auto"]))
def test_every_branch_finishes_once_and_nothing_is_held(branches, budget, arm, hybrid, handoff):
    s = _drive(branches, arm, small_config(**budget, handoff=handoff), hybrid)
    assert len(s.finished) == len(branches)
    assert len({b.uid for b in s.finished}) == len(branches)
    assert all(b.finish_reason in ("length", "stop") for b in s.finished)
    assert s.holds_nothing()
    if not hybrid:
        assert s.blocked_total == 0, "full-attention models never see Blocked"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), budgets, st.booleans())
def test_prefix_stop_batch_is_subset_of_state_ready_and_no_avoidable_bubble(branches, budget, hybrid):
    cfg = wait_config(**budget)
    checked = []

    def compare(s: Scheduler, now: float) -> None:
        ps = copy.deepcopy(s)
        ps.arm = get_arm("radix")
        sr = copy.deepcopy(s)
        sr.arm = get_arm("radixflow")
        b_ps = ps.schedule(now)
        b_sr = sr.schedule(now)
        sel_ps = {f.branch.uid for f in b_ps.fragments}
        sel_sr = {f.branch.uid for f in b_sr.fragments}
        assert sel_ps <= sel_sr, "prefix-stop selected a branch state-ready did not"
        if b_sr.stop_reason is None and b_sr.num_rows < cfg.max_num_seqs:
            rows = cfg.max_num_seqs - b_sr.num_rows
            tokens = cfg.max_num_batched_tokens - b_sr.num_tokens
            for b in sr.waiting:
                # Rows held back for D_t's reservation (SPEC §12) are not a bubble.
                outcome, _, _ = sr._check(b, rows, tokens, claims=sr.claims)
                assert outcome is not Outcome.READY, "avoidable bubble: a Ready branch was left out"
        # Blocked groups recognised by one key (and walked in runs) decide exactly as a lookup per
        # branch would: the same rows, fragments, pages and state slots.
        full = copy.deepcopy(s)
        full.arm = get_arm("radixflow")
        full.group_shortcut = False
        with mock.patch.object(BlockedGroups, "find", lambda self, b: None):
            b_full = full.schedule(now)
        assert [_frag_key(f) for f in b_full.fragments] == [_frag_key(f) for f in b_sr.fragments]
        assert (b_full.deferred, b_full.stop_reason) == (b_sr.deferred, b_sr.stop_reason)
        assert ([(b.blocked_rounds, b.blocked_tokens) for b in full.waiting]
                == [(b.blocked_rounds, b.blocked_tokens) for b in sr.waiting])
        checked.append(len(sel_sr) - len(sel_ps))

    _drive(_fresh(branches), "radixflow", cfg, hybrid, per_round=compare)
    assert checked


def test_group_runs_decide_as_a_lookup_per_branch_on_a_fan_and_groups():
    """The scan-cost shapes (benchmarks/scheduler_scan.py, small): one document shared by 60
    branches (every one Blocked behind the first producer, walked as one run once the claims are
    closed) and groups of 4; the shortcut on and off give the same batches round after round."""
    doc, fan, groups = Segment("doc", 96), [], []
    for i in range(60):
        fan.append(Branch(f"f{i}", 0, tokens_of([doc, Segment(f"t{i}", 8)]), max_new_tokens=2))
        groups.append(Branch(f"g{i}", 0, tokens_of([Segment(f"doc{i // 4}", 96), Segment(f"u{i}", 8)])))
    cfg = wait_config(max_num_seqs=4, max_num_batched_tokens=256, block_size=4, state_interval=16)
    for branches, long_run in ((fan, 40), (groups, 3)):
        runs = []
        for shortcut in (True, False):
            s = Scheduler(cfg, get_arm("radixflow"), hybrid=True)
            s.group_shortcut = shortcut
            for b in _fresh(branches):
                s.add(b)
            s.admit(0.0)
            trace = []
            while s.has_unfinished:
                batch = s.schedule(1.0)
                trace.append(([_frag_key(f) for f in batch.fragments], batch.deferred, batch.stop_reason))
                s.complete(batch, _Exec().execute(batch), 1.0)
                s.check_integrity()
            runs.append((trace, [(b.blocked_rounds, b.blocked_tokens, b.misses) for b in s.finished]))
        assert runs[0] == runs[1]
        assert max(t[1] for t in runs[0][0]) >= long_run, "the shape did not defer a long run"
        assert sum(1 for _, saved, _ in runs[0][1] if saved) > 1, "no member recorded what its wait saved"
