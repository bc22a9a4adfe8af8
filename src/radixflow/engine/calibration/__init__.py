"""The engine's own cost model for `--handoff auto` (SPEC §15), calibrated online from its timings.

Two measured things, both warm-started by a short probe on the loaded model (synthetic rows through a
scratch cache, before the first round) and carried over from one engine to the next on the same model
(the last run's observations), never from a constant:

- `ScanCosts` (engine/models/chunk_plan.py): seconds per token slot and per sequential step of the
  chunked recurrent scans at each candidate chunk size. The engine picks from them the chunk its
  levels run (`engine_scan_costs`: rows cut at every state-interval boundary, short dependent tails),
  so neither pays for padding each short segment to the model's 64-token chunk.
- `HandoffCalibration`: least squares (non-negative) over a window of the engine's own rounds:
    round time outside the extra levels = round + token * tokens + row * rows
    an extra level's time               = level + level_row * rows + level_token * tokens
  and a wait's price, one round of the consumer's latency, is the median length of the last 32 rounds.
  `handoff_costs()` gives core/handoff.py's `HandoffCosts` (the rule is the simulator's, only the
  source of the costs differs); the scheduler core reads them through that method and never a clock.
  `predict_level` is what the executor records before each forward, beside the level's measured time.
- The extra levels' *marginal* cost: an extra level's measured time (`LevelClock.by_level`, gross)
  includes its rows' own recurrent work, which the wait path runs too, one round later, inside
  level 0. Level 0's recurrent work is timed every round as well (`LevelClock.base`) and fitted
    level 0's time = base + decode_row * 1-token rows + prefill_row * longer rows
                     + prefill_token * their tokens + base_longest_token * the longest row's tokens;
  `level0_equivalent` prices a level's rows with the per-row and per-token terms only (what adding
  them to level 0 costs: its fixed part and its longest row are there anyway; the fit is remade every
  `BASE_REFIT` rounds), and the level's marginal cost is its measured time less that (`levels_cost`).
  The executor records (measured, level-0 equivalent) of every level in `levels_log`; `bench` and
  `/metrics` report both sums (docs/handoff.md).
- Folded dependents (engine/models/batch.py `FOLD`: a dependent of a multi-token producer runs in its
  producer's chunked scan, no level). What the fold adds is measured inside the scans of every forward
  that folds (chunk_plan.py `blocked_scan`: the calls of folded rows only and the state copies at the
  fold points; level_clock.py `LevelClock.fold_measured`) and fitted by least absolute deviations
  (non-negative, the newest 256 forwards plus the probe's, remade every `FOLD_REFIT` forwards):
    the fold's time = fold_call * calls + fold_row * rows those calls run + fold_copy * rows copied
  warm-started by the probe's own folds (its forwards with dependents, at the engine's chunk), and
  before any fold was measured, the probe's per-call scan cost (`ScanCosts.per_step`). The executor
  predicts each forward's fold from the fit of the forwards before it and logs the measurement beside
  it (`fold_log`; `bench` prints both). `auto` prices a folded hand-off by the calls it adds, each at
  `fold_call + fold_row` (`HandoffCosts.fold_step`); the level fits above then price only the separate
  levels of 1-token producers' dependents.

The package: `solvers.py` (non-negative least squares, least absolute deviations), `model.py`
(`HandoffCalibration`, the fits, and the summaries of its logs), `probes.py` (the warm-up probes, eager
or a step at a time) and `store.py` (probe results kept on disk next to the model cache, so a server
starts without probing again; docs/server.md "Start-up").
"""

from radixflow.engine.calibration.model import (
    BASE_REFIT,
    FOLD_REFIT,
    WINDOW,
    HandoffCalibration,
    fold_summary,
    level0_equivalent,
    levels_cost,
)
from radixflow.engine.calibration.probes import (
    calibration,
    engine_scan_costs,
    exhaust,
    fix_chunk,
    round_steps,
    scan_costs,
    scan_steps,
)
from radixflow.engine.calibration.solvers import nnls, nnls_l1

__all__ = ["BASE_REFIT", "FOLD_REFIT", "WINDOW", "HandoffCalibration", "calibration", "engine_scan_costs", "exhaust",
           "fix_chunk", "fold_summary", "level0_equivalent", "levels_cost", "nnls", "nnls_l1", "round_steps",
           "scan_costs", "scan_steps"]
