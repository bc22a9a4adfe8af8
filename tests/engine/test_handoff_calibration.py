"""The engine's own cost model for `--handoff auto` (engine/calibration.py) and the scan chunk each
recurrent level picks by measured cost (chunk_plan.py: ScanCosts)."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from handoff_cases import BLOCK, handoff_rows, setup_rows

from factories import make_branches
from fidelity import FLOOR_ULPS, float64_mode
from radixflow.config import SchedulerConfig
from radixflow.core.handoff import HANDOFF, WAIT, choose
from radixflow.engine.calibration import HandoffCalibration, nnls
from radixflow.engine.engine import Engine, EngineConfig
from radixflow.engine.models.chunk_plan import ScanCosts, build_chunk_plan, chunk_candidates, plan_shape
from radixflow.engine.models.level_clock import LevelClock
from radixflow.engine.tiny import ensure_tiny_model


def _calibrated(level_seconds: float) -> HandoffCalibration:
    """A calibration fed what an engine measures: rounds of 2-40 ms (1 ms + 0.1 ms per token, lengths
    ~40 ms) and extra levels of `level_seconds` (+ 0.1 ms per row)."""
    cal = HandoffCalibration()
    for tokens in (16, 64, 128, 256, 390):
        cal.observe_round(4, tokens, 0.001 + 0.0001 * tokens, 0.040)
    for rows, longest in ((1, 20), (3, 30), (6, 20), (2, 40)):
        cal.observe_level(rows, 20 * rows, longest, level_seconds + 0.0001 * rows)
    return cal


def test_fits_recover_the_measured_costs():
    cal = _calibrated(0.005)
    costs = cal.handoff_costs()
    assert costs.round == pytest.approx(0.001, abs=1e-6) and costs.token == pytest.approx(0.0001, rel=1e-3)
    assert costs.level + costs.level_row == pytest.approx(0.0051, rel=1e-3)
    assert costs.wait == pytest.approx(0.040)
    assert cal.predict_level(6, 120, 20) == pytest.approx(0.0056, rel=1e-3)
    assert cal.predict_level(2, 40, 40) == pytest.approx(0.0052, rel=1e-3)


def test_marginal_level_cost_is_measured_less_its_rows_priced_at_level_0():
    """Fake timings: level 0 costs 2 ms + 0.05 ms per 1-token row + 0.3 ms per longer row + 0.01 ms
    per token of them + 0.002 ms per token of the longest row. An extra level's rows are priced by the
    per-row and per-token terms only; its marginal cost is its measured time less that price."""
    from radixflow.engine.calibration import level0_equivalent, levels_cost

    cal = HandoffCalibration()
    for ones, rows, tokens, longest in ((4, 1, 64, 64), (0, 3, 300, 200), (8, 2, 40, 30), (2, 6, 500, 120),
                                        (16, 0, 0, 1), (1, 4, 256, 64), (6, 2, 128, 100)):
        cal.observe_base(ones, rows, tokens, longest,
                         0.002 + 0.00005 * ones + 0.0003 * rows + 0.00001 * tokens + 0.000002 * longest)
    assert cal.base_fit == pytest.approx([0.002, 0.00005, 0.0003, 0.00001, 0.000002], rel=1e-6, abs=1e-12)
    assert level0_equivalent(cal.base_fit, 1, 2, 100) == pytest.approx(0.00005 + 0.0006 + 0.001, rel=1e-6)
    # two levels: one measured dearer than its rows at level 0 (the fixed cost of a level), one cheaper
    a = cal.record_level(1, 2, 100, 0.004)
    b = cal.record_level(0, 1, 10, 0.0001)
    assert a == pytest.approx(0.00165, rel=1e-6) and b == pytest.approx(0.0004, rel=1e-6)
    cost = levels_cost(cal.levels_log)
    assert cost["levels"] == 2
    assert cost["gross"] == pytest.approx(0.0041)
    assert cost["level0_equivalent"] == pytest.approx(0.00205, rel=1e-6)
    assert cost["marginal"] == pytest.approx(0.0041 - 0.00205, rel=1e-6)  # may be < gross only by the price
    assert levels_cost([]) == {"levels": 0, "gross": 0.0, "level0_equivalent": 0.0, "marginal": 0.0}
    # level 0 got 10x dearer per token: the fit follows once BASE_REFIT rounds more were seen, not before
    from radixflow.engine.calibration import BASE_REFIT

    for i in range(BASE_REFIT):
        assert cal.base_fit[3] == pytest.approx(0.00001, rel=1e-6)
        tokens = 50 + 37 * i
        cal.observe_base(i % 5, 1 + i % 4, tokens, 20 + i, 0.002 + 0.0003 * (1 + i % 4) + 0.0001 * tokens)
    assert cal.base_fit[3] > 0.00003


def test_nnls_keeps_every_coefficient_non_negative():
    xs = [(1.0, t) for t in (1, 2, 3, 4)]
    assert nnls(xs, [4.0, 3.0, 2.0, 1.0]) == [pytest.approx(2.5), 0.0]  # a falling line: flat at the mean
    assert nnls(xs, [3.0, 5.0, 7.0, 9.0]) == [pytest.approx(1.0), pytest.approx(2.0)]


def test_a_measured_level_dearer_than_a_rounds_gain_makes_auto_wait():
    """A level measured at 0.5 s costs more than a round of the consumer's latency (40 ms) and than
    recomputing its 1,000-token gap (100 ms): `auto` waits. Measured at 1 ms, it hands off."""
    dear = _calibrated(0.5).handoff_costs()
    assert choose(dear, new_level=True, gap=1000, next_sure=True) == WAIT
    cheap = _calibrated(0.001).handoff_costs()
    assert choose(cheap, new_level=True, gap=1000, next_sure=True) == HANDOFF


def test_a_folded_handoff_is_priced_by_the_scan_calls_it_adds():
    """Folding (`fold_step`): a dependent of a multi-token producer opens no level, it costs the scan
    calls it runs past its producer's row, each at the measured per-call cost. The same dear level that
    makes `auto` wait for a 1-token producer's dependent does not count for a folded one."""
    from dataclasses import replace

    from radixflow.core.handoff import RECOMPUTE, fold_calls

    dear = replace(_calibrated(0.5).handoff_costs(), fold_step=0.0001, fold_chunk=16)
    # producer of 160 tokens, d 100 tokens in: its row runs 60 more (4 chunks)
    assert fold_calls(16, 160, 100, 40) == 0 and fold_calls(16, 160, 100, 100) == 3
    assert choose(dear, True, 1000, True, fold=(160, 100, 40)) == HANDOFF           # costs 0
    assert choose(dear, True, 1000, True, fold=(1, 1, 40)) == WAIT                  # a decode producer: a level
    # 3 calls at 20 ms each (60 ms) against a 40 ms round of waiting and a 0.1 ms x 2-token recompute
    slow = replace(dear, fold_step=0.02)
    assert choose(slow, False, 2, True, fold=(160, 100, 100)) == RECOMPUTE
    assert choose(slow, False, 10000, True, fold=(160, 100, 100)) == WAIT
    assert choose(replace(dear, fold_step=None), True, 1000, True, fold=(160, 100, 40)) == WAIT  # no folding


def test_fold_calls_is_the_plans():
    """`fold_calls` (what `auto` prices) equals the calls a plan of one producer and one folded
    dependent adds, and a plan without folded rows adds none."""
    from radixflow.core.handoff import fold_calls

    rng = random.Random(1)
    for _ in range(300):
        chunk = rng.choice([8, 16, 64])
        p = rng.randint(2, 300)
        k, n = rng.randint(1, p), rng.randint(1, 120)
        rows = [(0, 0, p, []), (1, p, n, [])]
        plan = build_chunk_plan(rows, chunk, p + n, torch.device("cpu"), {0: [(k, 1)]}, {1: 0})
        assert plan.fold_calls == fold_calls(chunk, p, k, n), (chunk, p, k, n)
        assert plan.base_calls == -(-k // chunk) + -(-(p - k) // chunk)
        assert len(plan.folds) == 1
    rows, hands = _random_rows(random.Random(2))
    plain = build_chunk_plan(rows, 16, rows[-1][1] + rows[-1][2], torch.device("cpu"), hands)
    assert plain.fold_calls == 0 and not plain.folds and all(lo == 0 for _, lo, _ in plain.steps)


class _Source:
    def __init__(self, cal: HandoffCalibration) -> None:
        self.cal, self.calls = cal, 0

    def handoff_costs(self):
        self.calls += 1
        return self.cal.handoff_costs()


@pytest.mark.parametrize("level,expect", [(0.5, "wait"), (0.001, "handoff")])
def test_the_scheduler_reads_its_costs_from_the_source_each_round(level, expect):
    """The core takes the engine's measured costs through `handoff_source` (no clock in core/): four
    siblings on a 200-token document, their state pending in the producer's row."""
    from radixflow.core.policies import get_arm
    from radixflow.core.scheduler import Scheduler

    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512, block_size=16, state_interval=16,
                          num_kv_pages=256, num_state_slots=64, handoff="auto")
    s = Scheduler(cfg, get_arm("radixflow"), hybrid=True)
    s.handoff_source = src = _Source(_calibrated(level))
    for b in make_branches(1, doc_len=200, tail=3):
        s.add(b)
    s.admit(1.0)
    batch = s.schedule(1.0)
    assert src.calls == 1
    deps = [f for f in batch.fragments if f.after is not None]
    if expect == "wait":
        # the siblings behind the first are one Blocked group: decided once (core/lookup.py)
        assert not deps and batch.deferred == 3 and s.handoff_choices[WAIT] == 1
    else:
        assert len(deps) == 3 and s.handoff_choices[HANDOFF] == 3


# ------------------------------------------------------------------ the scan chunk, by measured cost
def _random_rows(rng: random.Random) -> tuple[list, dict]:
    rows, hands, off = [], {}, 0
    for i in range(rng.randint(1, 5)):
        n = rng.randint(2, 150)
        cuts = [(k, 0) for k in sorted(rng.sample(range(1, n + 1), rng.randint(0, min(4, n))))]
        rows.append((i, off, n, cuts))
        if rng.random() < 0.5:
            hands[i] = [(rng.randint(1, n), 100 + i)]
        off += n
    return rows, hands


def test_plan_shape_is_the_plans():
    rng = random.Random(0)
    for _ in range(200):
        rows, hands = _random_rows(rng)
        total = rows[-1][1] + rows[-1][2]
        for chunk in (8, 16, 64):
            plan = build_chunk_plan(rows, chunk, total, torch.device("cpu"), hands)
            assert plan_shape(rows, chunk, hands) == (plan.num_slots, len(plan.steps))


def test_the_cheaper_chunk_is_chosen():
    costs = ScanCosts({64: 1.0, 32: 1.0, 16: 1.0, 8: 1.0}, {64: 10.0, 32: 10.0, 16: 10.0, 8: 10.0})
    rows = [(0, 0, 40, [(16, 0), (32, 1)])]  # segments 16, 16, 8: padded to 64 each at 64
    shapes = {c: plan_shape(rows, c) for c in chunk_candidates(64)}
    assert shapes[64] == (192, 3) and shapes[16] == (48, 3) and shapes[8] == (40, 5)
    assert costs.choose(shapes) == 16  # 48 + 30 < 40 + 50 < 192 + 30
    assert ScanCosts({}, {}).choose(shapes) == 64  # nothing measured: the model's chunk


@pytest.fixture(scope="module", params=["tiny-qwen3.5", "tiny-nemotron-h"])
def tiny(request, tmp_path_factory):
    from radixflow.engine.loader import load_model

    return load_model(ensure_tiny_model(request.param, cache_dir=tmp_path_factory.mktemp("m"))).model


def _handoff_logits(model, costs) -> torch.Tensor:
    cache = model.allocate_cache(160, BLOCK, 8)
    first, seq = setup_rows(True)
    model(first, cache, None, costs)
    rows, _ = handoff_rows(seq, True)
    return model(rows, cache, LevelClock(torch.device("cpu")), costs).double()


@pytest.mark.parametrize("chunk", [8, 16, 32])
def test_levels_run_at_a_smaller_chunk_are_as_accurate(tiny, chunk):
    """Every level forced to `chunk` (by measured costs that favour it): the hand-off rows of
    handoff_cases.py (producers, captures, dependents at levels 1 and 2) stay as close to a float64 run
    at the model's chunk as float32 at the model's chunk is (or within a few fp32 ulps of the logits: the
    floor of tests/fidelity.py, which scales with the arithmetic, not with one machine). The float64
    run is the model widened under `float64_mode()`, so no internal `.float()` rounds it to fp32."""
    favour = ScanCosts({c: (0.0 if c == chunk else 1.0) for c in chunk_candidates(64)},
                       {c: 0.0 for c in chunk_candidates(64)})
    assert favour.choose({c: (1, 1) for c in chunk_candidates(64)}) == chunk
    with float64_mode():
        ref = _handoff_logits(copy.deepcopy(tiny).double(), None)
    floor = FLOOR_ULPS * torch.finfo(torch.float32).eps * float(ref.abs().max())
    base = float((_handoff_logits(tiny, None) - ref).abs().max())
    got = float((_handoff_logits(tiny, favour) - ref).abs().max())
    assert got <= max(1.5 * base, floor), (got, base, floor)


@pytest.mark.parametrize("fold", [True, False], ids=["folded", "levels"])
@pytest.mark.parametrize("mode", ["on", "auto"])
def test_an_engine_calibrates_and_logs_its_levels(tmp_path, mode, fold, monkeypatch):
    """An engine handing off starts from its probe (costs before the first round), predicts each level
    it runs and records the measured time beside the prediction; with `auto` its scheduler reads them.
    Folded (the default), the siblings of a multi-token producer open no level: nothing is logged as a
    level, and what they add to the producer's scan is priced before each forward (`fold_time`) and
    measured inside it (`fold_measured`), both logged per forward; `batch.FOLD = False` gives the
    separate levels back."""
    from radixflow.core.branch import Branch
    from radixflow.core.loop import run_trace
    from radixflow.engine.models import batch as batch_mod

    monkeypatch.setattr(batch_mod, "FOLD", fold)

    path = ensure_tiny_model("tiny-qwen3.5", cache_dir=tmp_path)
    cfg = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512, block_size=16, state_interval=16,
                          handoff=mode)
    eng = Engine(EngineConfig(model=str(path), scheduler=cfg, kv_cache_memory=8 << 20, max_model_len=1024))
    cal = eng.executor.calibration
    assert cal.handoff_costs() is not None and cal.probe_seconds > 0 and eng.executor.scan_costs is not None
    assert (eng.scheduler.handoff_source is cal) == (mode == "auto")
    before, folds_before = len(cal.log), len(cal.fold_log)
    branches = [Branch(b.request_id, b.index, tuple(t % 256 for t in b.prompt), namespace=b.namespace,
                       max_new_tokens=2) for b in make_branches(1, doc_len=200, tail=3)]
    run_trace(eng.scheduler, eng.executor, branches)
    assert all(b.output for b in branches)
    taken = cal.log[before:]
    assert all(p > 0 and m > 0 for p, m, *_ in taken)
    assert (cal.handoff_costs().fold_step is not None) == fold
    if fold:  # every producer here is a multi-token row: its dependents fold, no level runs
        assert taken == [] and all(r.handoff_time == 0 and r.levels == 1 for r in eng.scheduler.rounds)
        folds = cal.fold_log[folds_before:]
        assert folds and all(p > 0 and m > 0 and w > 0 for p, m, *_, w in folds)
        assert eng.executor.fold_calls == sum(e[2] for e in folds)
        assert eng.executor.fold_time == pytest.approx(sum(p for p, *_ in folds))
        assert eng.executor.fold_measured == pytest.approx(sum(m for _, m, *_ in folds))
    else:
        assert len(taken) == sum(r.levels - 1 for r in eng.scheduler.rounds)
        assert eng.executor.fold_calls == 0 and eng.executor.fold_time == 0 and eng.executor.fold_measured == 0
    if mode == "on":  # hands off wherever it can: here the 3 siblings (in one level when not folded)
        assert eng.scheduler.handoff_choices[HANDOFF] == 3 and len(taken) == (0 if fold else 1)


def test_an_off_engine_keeps_no_calibration(tmp_path):
    path = ensure_tiny_model("tiny-qwen3.5", cache_dir=tmp_path)
    cfg = SchedulerConfig(block_size=16, state_interval=16, handoff="off")
    eng = Engine(EngineConfig(model=str(path), scheduler=cfg, kv_cache_memory=8 << 20, max_model_len=1024))
    assert eng.executor.calibration is None and eng.scheduler.handoff_source is None
    assert eng.executor.scan_costs is not None  # the scan chunk is the engine's, whatever --handoff
