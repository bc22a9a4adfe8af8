"""A deferred branch keeps its claim across rounds (SPEC §12), and the waiting queue keeps priority order.
The claim is the wait path's: its tests run `--handoff off` (factories.wait_config), so the consumer
is Blocked, not handed off (SPEC §15); the priority tests run the default."""

import pytest

from factories import small_config, wait_config
from radixflow.core.batch import ExecResult, Sample
from radixflow.core.branch import Branch
from radixflow.core.claims import Claims, finishes_next, finishes_now
from radixflow.core.policies import Arm, Immediate, PrefixStop, StateReady, get_arm
from radixflow.core.scheduler import Scheduler
from radixflow.workloads.trace import Segment, tokens_of

STATE_READY = Arm("state-ready", Immediate(), StateReady())
PREFIX_STOP = Arm("prefix-stop", Immediate(), PrefixStop())


def _run(s: Scheduler, branches: list[Branch], max_rounds: int = 500) -> dict[str, int]:
    """Drives `s` until every branch finished; returns each branch's first round (request_id -> round)."""
    for b in branches:
        s.add(b)
    first: dict[str, int] = {}
    for _ in range(max_rounds):
        if not s.has_unfinished:
            return first
        s.admit(1.0)
        batch = s.schedule(1.0)
        for f in batch.fragments:
            first.setdefault(f.branch.request_id, batch.round)
        s.complete(batch, ExecResult(0.01, {i: Sample(3) for i, f in enumerate(batch.fragments) if f.samples}), 1.0)
        s.check_integrity()
    raise AssertionError("did not finish")


def _pcd(priority: bool) -> list[Branch]:
    """P shares a 64-token document with C and decodes 40 tokens; C needs 1 token; D is unrelated
    (40 tokens), last in FCFS order or, under priority, first to arrive but of the lowest priority."""
    doc = Segment("doc", 64)
    p = Branch("P", 0, tokens_of([doc, Segment("p", 8)]), max_new_tokens=40)
    c = Branch("C", 0, tokens_of([doc, Segment("c", 8)]), max_new_tokens=1)
    d = Branch("D", 0, tokens_of([Segment("other", 72)]), max_new_tokens=40, priority=1 if priority else 0)
    return [d, p, c] if priority else [p, c, d]


@pytest.mark.parametrize("priority", [False, True])
@pytest.mark.parametrize("mode", ["every-boundary", "chunk-end"])
def test_deferred_consumer_starts_in_round_2(priority, mode):
    cfg = wait_config(max_num_seqs=2, block_size=16, state_interval=16, snapshot_mode=mode)
    s = Scheduler(cfg, STATE_READY, hybrid=True)
    first = _run(s, _pcd(priority))
    assert s.blocked_total >= 1, "C was never Blocked: the example does not exercise the rule"
    assert first["C"] == 2
    assert first["P"] == 1
    # D had to wait for a row, but not behind C's claim for ever: it runs once C finished.
    assert first["D"] == 3


@pytest.mark.parametrize("priority", [False, True])
def test_pcd_matches_prefix_stop(priority):
    """The native rule starts C in round 2 too; state-ready is no worse in rounds."""
    runs = {}
    for arm in (STATE_READY, PREFIX_STOP):
        cfg = wait_config(max_num_seqs=2, block_size=16, state_interval=16)
        s = Scheduler(cfg, arm, hybrid=True)
        runs[arm.name] = (_run(s, _pcd(priority)), len(s.rounds))
    assert runs["state-ready"][0]["C"] == runs["prefix-stop"][0]["C"] == 2
    assert runs["state-ready"][1] <= runs["prefix-stop"][1]


def test_a_branch_that_finishes_now_passes_a_full_reservation():
    """(a): one that finishes within the round is admitted past D even when every t+1 row is claimed."""
    doc = Segment("doc", 64)
    branches = [Branch("P", 0, tokens_of([doc, Segment("p", 8)]), max_new_tokens=5),
                Branch("C", 0, tokens_of([doc, Segment("c", 8)]), max_new_tokens=5),
                Branch("Q", 0, tokens_of([Segment("q", 40)]), max_new_tokens=1)]
    s = Scheduler(wait_config(max_num_seqs=3, block_size=16, state_interval=16), STATE_READY, hybrid=True)
    for b in branches:
        s.add(b)
    s.admit(1.0)
    batch = s.schedule(1.0)
    assert [f.branch.request_id for f in batch.fragments] == ["P", "Q"]
    assert batch.deferred == 1


def test_a_branch_that_stays_is_held_back_until_it_fits():
    """(b) rows: Q finishes at t+1 (2 tokens) and goes in once a row is left beside C's claim."""
    doc = Segment("doc", 64)
    branches = [Branch("P", 0, tokens_of([doc, Segment("p", 8)]), max_new_tokens=5),
                Branch("C", 0, tokens_of([doc, Segment("c", 8)]), max_new_tokens=5),
                Branch("Q", 0, tokens_of([Segment("q", 40)]), max_new_tokens=2)]
    for rows, admitted in ((2, ["P"]), (3, ["P", "Q"])):
        s = Scheduler(wait_config(max_num_seqs=rows, block_size=16, state_interval=16), STATE_READY, hybrid=True)
        for b in [Branch(b.request_id, 0, b.prompt, max_new_tokens=b.max_new_tokens) for b in branches]:
            s.add(b)
        s.admit(1.0)
        batch = s.schedule(1.0)
        assert [f.branch.request_id for f in batch.fragments] == admitted
        assert batch.stop_reason == (None if rows == 3 else "claim")


@pytest.mark.parametrize("q_tokens, prompt_tail, admitted", [
    (2, 0, True),  # its whole prompt now, one token now and its last at t+1
    (3, 0, False),  # a decode that outlives t+1: refused though rows, tokens and pages fit
    (1, 24, True),  # a prompt tail left for t+1 that one chunk takes, then its only token
    (2, 24, False),  # the same tail, but a decode still to come after t+1
])
def test_b_takes_only_a_branch_that_finishes_by_the_next_round(q_tokens, prompt_tail, admitted):
    """(b) as in the vLLM plugin: admitted past D only if it is done by the end of D's round (t+1);
    one admitted a round early that runs on would stay a round ahead of the native order."""
    doc = Segment("doc", 64)
    cfg = wait_config(max_num_seqs=4, block_size=16, state_interval=16,
                      max_num_batched_tokens=96 + 40 + 16 * bool(prompt_tail))
    s = Scheduler(cfg, STATE_READY, hybrid=True)
    q = Branch("Q", 0, tokens_of([Segment("q", 40 + prompt_tail)]), max_new_tokens=q_tokens)
    for b in (Branch("P", 0, tokens_of([doc, Segment("p", 32)]), max_new_tokens=5),
              Branch("C", 0, tokens_of([doc, Segment("c", 8)]), max_new_tokens=5), q):
        s.add(b)
    s.admit(1.0)
    batch = s.schedule(1.0)
    assert batch.deferred == 1
    frags = {f.branch.request_id: f for f in batch.fragments}
    assert ("Q" in frags) == admitted
    if admitted:
        assert frags["Q"].end < q.num_tokens if prompt_tail else frags["Q"].end == q.num_tokens
    else:
        assert batch.stop_reason == "claim"
        outcome, _, _ = s._check(q, 2, 256)  # without the claim, Q would have been admitted
        assert outcome.name == "READY"
    s.check_integrity()


def test_kv_reservation_holds_back_what_would_crowd_out_the_consumer():
    """Rows are spare but the pool is not: a candidate whose pages would leave C's t+1 fragment no
    room is not admitted past C."""
    doc = Segment("doc", 64)
    p = Branch("P", 0, tokens_of([doc, Segment("p", 64)]), max_new_tokens=2)
    c = Branch("C", 0, tokens_of([doc, Segment("c", 64)]), max_new_tokens=2)
    q = Branch("Q", 0, tokens_of([Segment("q", 96)]), max_new_tokens=2)
    # P takes 8 pages (+1 for its decode), C needs 4 beyond its hit at t+1, Q would take 6 now.
    s = Scheduler(wait_config(max_num_seqs=4, block_size=16, state_interval=16, num_kv_pages=16),
                  STATE_READY, hybrid=True)
    for b in (p, c, q):
        s.add(b)
    s.admit(1.0)
    batch = s.schedule(1.0)
    assert [f.branch.request_id for f in batch.fragments] == ["P"]
    assert batch.stop_reason == "claim"


def test_claims_arithmetic():
    chunk = lambda start, total, tokens: min(total - start, tokens)  # noqa: E731
    cl = Claims(max_rows=4, max_tokens=100, block_size=10, chunk=chunk)
    b = Branch("x", 0, tuple(range(30)), max_new_tokens=2)
    assert not finishes_now(b, 30) and not finishes_now(b, 20)
    assert finishes_now(Branch("y", 0, (1, 2), max_new_tokens=1), 2)
    assert finishes_next(b, 30, 100, chunk) and not finishes_next(b, 20, 100, chunk)
    assert finishes_next(Branch("t", 0, tuple(range(30))), 20, 100, chunk)  # tail at t+1, its one token
    assert not finishes_next(Branch("t", 0, tuple(range(300))), 20, 100, chunk)  # tail > T: two chunks
    cl.carry(b, 30)  # decodes at t+1: one row, one token
    assert (cl.rows_next, cl.tokens_next) == (1, 1)
    cl.carry(Branch("z", 0, tuple(range(50))), 20)  # unfinished prefill: its next chunk
    assert (cl.rows_next, cl.tokens_next) == (2, 31)
    assert cl.allows(b, 30, take_pages=3, avail_pages=3, avail_slots=0)  # nothing deferred yet
    cl.defer(Branch("d", 0, tuple(range(45))), 20)  # resumes at 20: 25 tokens, pages 2..4
    assert (cl.deferred, cl.d_tokens, cl.d_pages) == (1, 25, 3)
    assert cl.allows(b, 30, take_pages=3, avail_pages=6, avail_slots=0)
    assert not cl.allows(b, 30, take_pages=4, avail_pages=6, avail_slots=0), "pages"
    cl.defer(Branch("e", 0, tuple(range(45))), 20)
    assert not cl.allows(b, 30, take_pages=0, avail_pages=99, avail_slots=0), "rows: 2 + 1 + 2 > 4"
    assert cl.allows(Branch("f", 0, (1,) * 30, max_new_tokens=1), 30, 99, 0, 0), "(a) needs no room"
    cl = Claims(max_rows=4, max_tokens=100, block_size=10, chunk=chunk)
    cl.defer(Branch("d", 0, tuple(range(45))), 20)
    assert cl.allows(b, 30, take_pages=0, avail_pages=99, avail_slots=0)
    long = Branch("l", 0, tuple(range(30)), max_new_tokens=3)
    assert not cl.allows(long, 30, take_pages=0, avail_pages=99, avail_slots=0), "outlives t+1"


def test_priority_orders_the_waiting_queue():
    s = Scheduler(small_config(max_num_seqs=1), get_arm("radix"), hybrid=False)
    bs = [Branch(f"r{i}", 0, (i + 1,) * 8, priority=p) for i, p in enumerate([2, 0, 1, 0])]
    first = _run(s, bs)
    assert sorted(first, key=first.get) == ["r1", "r3", "r2", "r0"]


def test_priority_picks_the_preemption_victim():
    """Under memory pressure the lowest-priority running branch is preempted, not the newest."""
    cfg = small_config(max_num_seqs=2, block_size=4, num_kv_pages=8, max_num_batched_tokens=64)
    s = Scheduler(cfg, get_arm("radix"), hybrid=False)
    low = Branch("low", 0, (1,) * 8, max_new_tokens=12, priority=5)
    high = Branch("high", 0, (2,) * 8, max_new_tokens=12, priority=0)
    _run(s, [low, high])
    assert high.num_preemptions == 0
    assert low.num_preemptions >= 1


def test_priority_must_be_an_integer():
    with pytest.raises(ValueError, match="priority"):
        Branch("x", 0, (1,), priority="high")


@pytest.mark.parametrize("budget, admitted", [(600, ["P"]), (620, ["P", "Q"])])
def test_a_shared_byte_pool_is_reserved_in_bytes(budget, admitted):
    """Pages and slots are plentiful by count; only the unified byte budget binds. At 600 bytes Q
    (6 pages + a slot = 100 B) fits now but not beside C's t+1 fragment (4 pages + a slot = 80 B)."""
    doc = Segment("doc", 64)
    cfg = wait_config(max_num_seqs=4, block_size=16, state_interval=16, num_kv_pages=64, num_state_slots=64,
                      cache_memory_bytes=budget, kv_page_bytes=10, state_slot_bytes=40)
    s = Scheduler(cfg, STATE_READY, hybrid=True)
    q = Branch("Q", 0, tokens_of([Segment("q", 96)]), max_new_tokens=2)
    for b in (Branch("P", 0, tokens_of([doc, Segment("p", 64)]), max_new_tokens=2),
              Branch("C", 0, tokens_of([doc, Segment("c", 64)]), max_new_tokens=2), q):
        s.add(b)
    s.admit(1.0)
    batch = s.schedule(1.0)
    assert [f.branch.request_id for f in batch.fragments] == admitted
    if admitted == ["P"]:
        assert batch.stop_reason == "claim"
        outcome, _, _ = s._check(q, 3, 256)  # without the claim, Q would have been admitted
        assert outcome.name == "READY"
    s.check_integrity()
