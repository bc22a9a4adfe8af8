"""The folded hand-off's cost, measured beside its calibrated prediction (chunk_plan.py `fold_only`,
`blocked_scan`'s timer; batch.py `LevelClock`; engine/calibration.py `fold_fit`, `fold_log`).
No timing bound is asserted: that something is measured, where, and what the prediction is made from."""

from __future__ import annotations

import random

import pytest
import torch
from handoff_cases import BLOCK, handoff_rows, setup_rows

from radixflow.engine.calibration import HandoffCalibration, fold_summary, nnls, nnls_l1
from radixflow.engine.models import batch as batch_mod
from radixflow.engine.models.chunk_plan import ScanCosts, blocked_scan, build_chunk_plan
from radixflow.engine.models.level_clock import LevelClock
from radixflow.engine.tiny import ensure_tiny_model


def _folded_plan(rng: random.Random, chunk: int):
    """One producer of 2-300 tokens with 1-4 folded dependents (some past its end), and a plain row."""
    p = rng.randint(2, 300)
    rows, hands, folded, off = [(0, 0, p, [])], {0: []}, {}, p
    for j in range(1, rng.randint(2, 5)):
        k, n = rng.randint(1, p), rng.randint(1, 120)
        rows.append((j, off, n, []))
        hands[0].append((k, j))
        folded[j] = 0
        off += n
    q = rng.randint(2, 200)
    rows.append((len(rows), off, q, []))
    return build_chunk_plan(rows, chunk, off + q, torch.device("cpu"), hands, folded), len(folded)


def test_fold_only_calls_are_the_fold_calls():
    """The calls that run folded rows only are exactly as many as the fold adds (`fold_calls`), and a
    plan without folded rows has none."""
    rng = random.Random(3)
    for _ in range(300):
        chunk = rng.choice([8, 16, 64])
        plan, nfold = _folded_plan(rng, chunk)
        assert len(plan.fold_only) == plan.fold_calls
        for k in plan.fold_only:  # the folded rows are the first local rows
            _, lo, n = plan.steps[k]
            assert lo + n <= nfold
    plain = build_chunk_plan([(0, 0, 100, []), (1, 100, 40, [])], 16, 140, torch.device("cpu"))
    assert plain.fold_only == frozenset() and plain.fold_calls == 0


class _Timer:
    def __init__(self) -> None:
        self.open, self.closed = 0, 0

    def fold_start(self) -> object:
        self.open += 1
        return self.open

    def fold_stop(self, token: object) -> None:
        assert token == self.open
        self.closed += 1


def _run(plan, timer) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    m = plan.num_slots // plan.chunk
    x = torch.rand(m, 2, generator=g)
    state = torch.zeros(len(plan.rows), 2)
    out = torch.zeros(m, 2)
    plan.timer = timer

    def step(s, xs, o):  # a toy recurrence: every chunk adds to its row's state
        s = s + xs
        return s, s
    blocked_scan(plan, (x, out), state, lambda a, b: (a, b), step, out, lambda *_: None)
    return out, state


def test_the_scan_times_the_fold_calls_and_copies_only_and_changes_nothing():
    rng = random.Random(4)
    for _ in range(100):
        plan, _ = _folded_plan(rng, rng.choice([8, 16]))
        ref = _run(plan, None)
        timer = _Timer()
        got = _run(plan, timer)
        assert all(torch.equal(a, b) for a, b in zip(ref, got))
        assert timer.open == timer.closed == plan.fold_calls + len(plan.folds)


@pytest.fixture(scope="module", params=["tiny-qwen3.5", "tiny-nemotron-h"])
def tiny(request, tmp_path_factory):
    from radixflow.engine.loader import load_model

    return load_model(ensure_tiny_model(request.param, cache_dir=tmp_path_factory.mktemp("m"))).model


def test_a_forward_measures_its_fold_when_asked(tiny):
    """The hand-off rows of handoff_cases.py (folded dependents inside and past their producer's row):
    with `time_fold` the clock holds the fold's measured time and counts; without it, the counts only.
    The logits are the same either way."""
    assert batch_mod.FOLD
    costs = ScanCosts({16: 1e-6}, {16: 1e-4}, fixed=16)
    outs, clocks = [], []
    for timed in (False, True):
        cache = tiny.allocate_cache(160, BLOCK, 8)
        first, seq = setup_rows(True)
        tiny(first, cache, None, costs)
        rows, _ = handoff_rows(seq, True)
        clock = LevelClock(torch.device("cpu"), time_fold=timed)
        outs.append(tiny(rows, cache, clock, costs))
        clocks.append(clock)
    assert torch.equal(outs[0], outs[1])
    off, on = clocks
    assert on.fold_copies > 0 and on.fold_copied >= on.fold_copies
    assert (on.fold_calls, on.fold_rows, on.fold_copies, on.fold_copied) == (
        off.fold_calls, off.fold_rows, off.fold_copies, off.fold_copied)
    assert on.fold_seconds == pytest.approx(on.fold_calls * 1e-4)  # the probe's price, as before
    assert on.fold_measured > 0 and on.fold_wall > 0
    assert off.fold_measured == 0 and off.fold_wall == 0


def test_the_fold_prediction_is_made_from_earlier_forwards_and_logged_beside_the_measurement():
    """Before any fold was measured the price is the probe's per-call cost; then the fit of the
    observations so far (remade every FOLD_REFIT forwards): each logged prediction is what the fit of
    the forwards before it gave."""
    from radixflow.engine.calibration import FOLD_REFIT

    cal = HandoffCalibration(scan=ScanCosts({16: 1e-6}, {16: 2e-4}, fixed=16))
    assert cal.fold_fit == [2e-4, 0.0, 0.0] and cal.predict_fold(3, 5, 2) == pytest.approx(6e-4)
    rng = random.Random(5)
    for _ in range(3 * FOLD_REFIT + 1):
        calls, rows, copied = rng.randint(0, 6), rng.randint(0, 12), rng.randint(1, 3)
        fit_before = list(cal.fold_fit)
        predicted = cal.predict_fold(calls, rows, copied)
        assert predicted == pytest.approx(fit_before[0] * calls + fit_before[1] * rows + fit_before[2] * copied)
        measured = 3e-4 * calls + 1e-4 * rows + 2e-4 * copied
        cal.observe_fold(calls, rows, copied, measured, predicted, wall=2 * measured)
        assert cal.fold_log[-1] == (predicted, measured, calls, rows, copied, 2 * measured)
    assert cal.fold_fit == pytest.approx([3e-4, 1e-4, 2e-4], rel=1e-3, abs=1e-9)
    s = fold_summary(cal.fold_log, cal.fold_fit)
    assert s["forwards"] == len(cal.fold_log) and s["wall_total"] == pytest.approx(2 * s["measured_total"])
    assert s["fit"] == {"call": cal.fold_fit[0], "row": cal.fold_fit[1], "copy": cal.fold_fit[2]}


def test_auto_prices_a_folded_call_by_the_measured_fit():
    cal = HandoffCalibration(scan=ScanCosts({16: 1e-6}, {16: 2e-4}, fixed=16))
    cal.observe_round(4, 64, 0.01, 0.05)
    cal.observe_level(2, 40, 20, 0.002)
    for calls, rows, copied in ((1, 1, 1), (2, 3, 1), (0, 0, 2), (4, 6, 2), (3, 3, 1)):
        cal.observe_fold(calls, rows, copied, 5e-4 * calls + 1e-4 * rows + 1e-4 * copied)
    cal._fold_fit = None  # refit now (it is remade every FOLD_REFIT forwards)
    costs = cal.handoff_costs()
    assert costs.fold_chunk == 16 and costs.fold_step == pytest.approx(6e-4, rel=1e-3)


def test_least_absolute_deviations_follow_the_typical_observation():
    """A few observations stretched 10x (a busy machine) pull least squares up, not the L1 fit."""
    rows = [(c, 1) for c in range(1, 9) for _ in range(3)]
    ys = [1e-3 * c + 2e-4 for c, _ in rows]
    for i in (2, 11, 20):
        ys[i] *= 10
    l1 = nnls_l1(rows, ys)
    assert l1 == pytest.approx([1e-3, 2e-4], rel=1e-2)
    assert nnls(rows, ys)[0] > 1.3e-3
    assert all(c >= 0 for c in nnls_l1([(1.0, t) for t in (1, 2, 3, 4)], [4.0, 3.0, 2.0, 1.0]))
