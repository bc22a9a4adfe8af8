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
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from dataclasses import dataclass, field, replace
from itertools import combinations

import numpy as np
import torch

from radixflow.core.handoff import HandoffCosts
from radixflow.engine.models import batch as batch_mod
from radixflow.engine.models.cache import RowInput
from radixflow.engine.models.chunk_plan import ScanCosts, build_chunk_plan, chunk_candidates, plan_shape
from radixflow.engine.models.level_clock import LevelClock

WINDOW = 256  # observations kept per fit (the newest)
BASE_REFIT = 16  # level 0's fit is remade after this many new rounds (a refit costs ~2 ms on a CPU)
FOLD_REFIT = 4  # the fold's fit (least absolute deviations, ~1.5-3 ms on a CPU) after this many new forwards


def nnls(rows: list[tuple[float, ...]], ys: list[float]) -> list[float]:
    """Least squares with every coefficient >= 0, by trying each subset of free coefficients (few): the
    normal equations are formed once, so a refit costs microseconds whatever the window."""
    a = np.asarray(rows, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    return _nnls_normal(a.T @ a, a.T @ y, float(y @ y))


def _nnls_normal(gram: np.ndarray, rhs: np.ndarray, yy: float) -> list[float]:
    """`nnls` from its normal equations (gram = A'A, rhs = A'y, yy = y'y)."""
    k = len(rhs)
    best, best_err = [0.0] * k, yy
    for size in range(1, k + 1):
        for cols in combinations(range(k), size):
            idx = list(cols)
            g = gram[np.ix_(idx, idx)]
            sol, *_ = np.linalg.lstsq(g, rhs[idx], rcond=None)
            if (sol < 0).any():
                continue
            # |a x - y|^2 = x'Gx - 2 x'b + y'y
            err = float(sol @ g @ sol - 2 * sol @ rhs[idx] + yy)
            if err < best_err - 1e-18 * max(1.0, yy):
                coef = [0.0] * k
                for c, v in zip(cols, sol.tolist()):
                    coef[c] = v
                best, best_err = coef, err
    return best


def nnls_l1(rows: list[tuple[float, ...]], ys: list[float], iters: int = 12) -> list[float]:
    """Least absolute deviations with every coefficient >= 0 (iteratively reweighted `nnls`): the fit
    follows the typical observation, not the few a busy machine stretched by several times."""
    a = np.asarray(rows, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    floor = 1e-3 * max(float(np.median(np.abs(y))), 1e-12)
    w = np.ones(len(y))
    coef = [0.0] * a.shape[1]
    for _ in range(iters):
        aw = a * w[:, None]
        coef = _nnls_normal(aw.T @ a, aw.T @ y, float((w * y) @ y))
        w = 1.0 / np.maximum(np.abs(a @ np.asarray(coef) - y), floor)
    return coef


@dataclass
class HandoffCalibration:
    """Online fits of the round's base cost and an extra level's cost from the engine's measurements."""

    rounds: deque = field(default_factory=lambda: deque(maxlen=WINDOW))  # (rows, tokens, seconds)
    probe_rounds: list = field(default_factory=list)  # the probe's, kept in every fit (the small rounds)
    probe_levels: list = field(default_factory=list)
    lengths: deque = field(default_factory=lambda: deque(maxlen=32))  # whole rounds' host time, newest
    levels: deque = field(default_factory=lambda: deque(maxlen=WINDOW))  # (rows, tokens, longest, seconds)
    # the levels run once the fits existed: (predicted, measured, rows, tokens)
    log: list[tuple[float, float, int, int]] = field(default_factory=list)
    # level 0's recurrent work of each round: (1-token rows, longer rows, their tokens, longest, seconds)
    base_levels: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    probe_base: list = field(default_factory=list)
    # every extra level run: (measured seconds, its rows priced at level 0), see `level0_equivalent`
    levels_log: list[tuple[float, float]] = field(default_factory=list)
    probe_seconds: float = 0.0
    scan: ScanCosts | None = None  # the engine's scan costs (its fixed chunk): what a folded hand-off adds
    # folded dependents, per forward that ran any: (scan calls of folded rows only, the rows those calls
    # ran, the rows whose state the fold points copied, measured seconds)
    folds: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    probe_folds: list = field(default_factory=list)
    # every forward that folded, as the executor recorded it: (predicted, measured, calls, rows, copied
    # rows, the same segments on the host clock)
    fold_log: list[tuple[float, float, int, int, int, float]] = field(default_factory=list)
    _fold_fit: list[float] | None = None
    _fold_new: int = 0  # fold observations since the fold fit was made
    _round_fit: list[float] | None = None
    _level_fit: list[float] | None = None
    _base_fit: list[float] | None = None
    _base_new: int = 0  # level-0 observations since the base fit was made

    def observe_round(self, rows: int, tokens: int, seconds: float, whole: float | None = None) -> None:
        """A forward's host time outside its extra levels (and `whole`: the round's, levels included)."""
        self.rounds.append((rows, tokens, seconds))
        self._round_fit = None
        if whole is not None:
            self.lengths.append(whole)

    def observe_level(self, rows: int, tokens: int, longest: int, seconds: float,
                      predicted: float | None = None) -> None:
        """One extra level's measured time (all recurrent layers: `rows` rows, `tokens` tokens, the longest
        row `longest`, which sets the scan's sequential steps), and what was predicted for it."""
        self.levels.append((rows, tokens, longest, seconds))
        self._level_fit = None
        if predicted is not None:
            self.log.append((predicted, seconds, rows, tokens))

    def observe_fold(self, calls: int, rows: int, copied: int, seconds: float, predicted: float | None = None,
                     wall: float | None = None) -> None:
        """What one forward's folded dependents added to their producers' scans (all recurrent layers:
        `calls` scan calls of folded rows only, running `rows` rows in all, and the states of `copied`
        folded rows copied from their producers'), the time measured in them inside the scans
        (`LevelClock.fold_measured`; `wall`: on the host clock), and what was predicted for it."""
        self.folds.append((calls, rows, copied, seconds))
        self._fold_new += 1
        if self._fold_new >= FOLD_REFIT:
            self._fold_fit = None
        if predicted is not None:
            self.fold_log.append((predicted, seconds, calls, rows, copied, seconds if wall is None else wall))

    def observe_base(self, ones: int, rows: int, tokens: int, longest: int, seconds: float) -> None:
        """Level 0's measured recurrent time in one forward: `ones` 1-token rows, `rows` longer rows
        of `tokens` tokens in all, the longest `longest`."""
        self.base_levels.append((ones, rows, tokens, longest, seconds))
        self._base_new += 1
        if self._base_new >= BASE_REFIT:
            self._base_fit = None

    def record_level(self, ones: int, rows: int, tokens: int, seconds: float) -> float:
        """Log one extra level's measured time beside its rows priced at level 0; returns the latter."""
        equiv = level0_equivalent(self.base_fit, ones, rows, tokens)
        self.levels_log.append((seconds, equiv))
        return equiv

    @property
    def base_fit(self) -> list[float]:
        """(base, decode_row, prefill_row, prefill_token, base_longest_token) seconds of level 0 (made on
        first use, then again once `BASE_REFIT` rounds more were observed)."""
        if self._base_fit is None:
            self._base_new = 0
            obs = self.probe_base + list(self.base_levels)
            self._base_fit = (nnls([(1.0, o, r, t, n) for o, r, t, n, _ in obs], [s for *_, s in obs]) if obs
                              else [0.0] * 5)
        return self._base_fit

    @property
    def round_fit(self) -> list[float]:
        """(round, token, row) seconds."""
        if self._round_fit is None:
            obs = self.probe_rounds + list(self.rounds)
            self._round_fit = nnls([(1.0, t, r) for r, t, _ in obs], [s for *_, s in obs]) if obs else [0.0] * 3
        return self._round_fit

    @property
    def level_fit(self) -> list[float]:
        """(level, level_row, level_token, level_step) seconds: fixed, per row, per token, per token of
        the longest row."""
        if self._level_fit is None:
            obs = self.probe_levels + list(self.levels)
            self._level_fit = (nnls([(1.0, r, t, n) for r, t, n, _ in obs], [s for *_, s in obs]) if obs
                               else [0.0] * 4)
        return self._level_fit

    @property
    def fold_fit(self) -> list[float]:
        """(fold_call, fold_row, fold_copy) seconds: one scan call of folded rows only, each row it runs,
        each folded row's state copied at its fold point, all recurrent layers together; least absolute
        deviations over the probe's and the newest forwards' measured folds (remade every `FOLD_REFIT`
        forwards), and before any was measured, the probe's per-call cost of the scan (`ScanCosts.per_step`)."""
        if self._fold_fit is None:
            obs = self.probe_folds + list(self.folds)
            if not obs:  # not cached: the engine gives `scan` after the probe
                return [self.scan.per_step.get(self.scan.fixed, 0.0) if self.scan is not None else 0.0, 0.0, 0.0]
            self._fold_new = 0
            self._fold_fit = nnls_l1([(c, r, k) for c, r, k, _ in obs], [s for *_, s in obs])
        return self._fold_fit

    def predict_fold(self, calls: int, rows: int, copied: int) -> float:
        a, r, b = self.fold_fit
        return a * calls + r * rows + b * copied

    @property
    def ready(self) -> bool:
        return bool(self.rounds or self.probe_rounds) and bool(self.levels or self.probe_levels)

    def predict_level(self, rows: int, tokens: int, longest: int) -> float:
        f, r, t, n = self.level_fit
        return f + r * rows + t * tokens + n * longest

    def predict_round(self, rows: int, tokens: int) -> float:
        a, t, r = self.round_fit
        return a + t * tokens + r * rows

    def handoff_costs(self) -> HandoffCosts | None:
        """What `auto` weighs, from the fits (None before anything was measured: then `auto` hands off,
        as the rule does without a cost model)."""
        if not self.ready:
            return None
        a, tok, _ = self.round_fit
        f, r, _, n = self.level_fit
        # opening a level: its fixed part and the sequential steps of a typical longest row (the median
        # observed); the tokens' own work is not counted, the consumer's tokens run whatever it chooses
        longest = sorted(o[2] for o in (*self.probe_levels, *self.levels))
        f += n * _median(longest)
        wait = _median(sorted(self.lengths)) if self.lengths else None
        step, chunk = None, 0
        if batch_mod.FOLD and self.scan is not None and self.scan.fixed is not None:
            chunk = self.scan.fixed
            step = self.fold_fit[0] + self.fold_fit[1]  # a call with the consumer's row, as measured
        return HandoffCosts(level=f, token=tok, round=a, level_row=r, wait=wait, fold_step=step, fold_chunk=chunk)

    def fold_summary(self, since: int = 0) -> dict:
        """Predicted vs measured fold cost per forward that folded (from the `since`-th on): medians,
        sums and the fit."""
        return fold_summary(self.fold_log[since:], self.fold_fit)

    def summary(self, since: int = 0) -> dict:
        """Predicted vs measured time of the levels taken (from the `since`-th on: medians), and the fits."""
        log = self.log[since:]
        pred = sorted(p for p, *_ in log)
        meas = sorted(m for _, m, *_ in log)
        errs = sorted(abs(p - m) / m for p, m, *_ in log if m > 0)
        a, tok, row = self.round_fit
        f, r, t, n = self.level_fit
        return {"levels": len(log), "predicted_median": _median(pred), "measured_median": _median(meas),
                "median_error": _median(errs), "round": a, "token": tok, "row": row, "level": f,
                "level_row": r, "level_token": t, "level_longest_token": n, "probe_seconds": self.probe_seconds}


def level0_equivalent(base_fit: list[float], ones: int, rows: int, tokens: int) -> float:
    """What an extra level's rows (`ones` 1-token rows, `rows` longer rows of `tokens` tokens) would
    cost run in level 0, from level 0's fit: its per-row and per-token terms only."""
    _, decode_row, prefill_row, prefill_token, _ = base_fit
    return decode_row * ones + prefill_row * rows + prefill_token * tokens


def levels_cost(log: list[tuple[float, float]]) -> dict[str, float]:
    """The extra levels of `log` (`HandoffCalibration.levels_log`): their measured time (`gross`), their
    rows priced at level 0 (`level0_equivalent`) and the difference (`marginal`: what running them in
    levels cost beyond the work itself; may be below 0 within the fits' noise)."""
    gross = sum(m for m, _ in log)
    equiv = sum(e for _, e in log)
    return {"levels": len(log), "gross": gross, "level0_equivalent": equiv, "marginal": gross - equiv}


def fold_summary(log: list[tuple[float, float, int, int, int, float]], fit: list[float] | None = None) -> dict:
    """`HandoffCalibration.fold_log` entries: how many forwards folded, their predicted and measured
    fold cost per forward (medians, and the median's error), the median of each forward's own error
    (predicted / measured - 1: its bias) and of its size, the sums, the host clock's median and sum
    (`wall_*`), and the fit."""
    pred = sorted(p for p, *_ in log)
    meas = sorted(m for _, m, *_ in log)
    wall = sorted(e[5] for e in log)
    signed = sorted(p / m - 1 for p, m, *_ in log if m > 0)
    mm = _median(meas)
    out = {"forwards": len(log), "calls": sum(e[2] for e in log), "rows": sum(e[3] for e in log),
           "copied": sum(e[4] for e in log), "predicted_median": _median(pred), "measured_median": mm,
           "error": _median(pred) / mm - 1 if mm > 0 else None,
           "median_round_error": _median(signed) if signed else None,
           "median_abs_error": _median(sorted(abs(e) for e in signed)) if signed else None,
           "predicted_total": sum(pred), "measured_total": sum(meas), "wall_median": _median(wall),
           "wall_total": sum(wall)}
    if fit is not None:
        out["fit"] = {"call": fit[0], "row": fit[1], "copy": fit[2]}
    return out


def _median(xs: list[float]) -> float:
    return xs[len(xs) // 2] if xs else 0.0


# ---------------------------------------------------------------- probes (warm start, once per model)
_SCAN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_CALIB: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def scan_costs(model) -> ScanCosts | None:
    """The model's measured scan costs (probed once per model object; None without recurrent layers)."""
    if model not in _SCAN:
        _SCAN[model] = _probe_scans(model)
    return _SCAN[model]


def engine_scan_costs(model, interval: int) -> ScanCosts | None:
    """The model's scan costs with one chunk fixed for every level: the cheapest for rows cut at every
    `interval` tokens (state captures) and for short tails (dependent rows), predicted from the probe."""
    costs = scan_costs(model)
    if costs is None:
        return None
    layout = [(0, 0, 32 * interval, [(k * interval, 0) for k in range(1, 32)])]
    layout += [(i, 0, max(1, interval // 2) + i, []) for i in range(1, 9)]
    shapes = {c: plan_shape(layout, c) for c in costs.per_slot}
    return replace(costs, fixed=costs.choose(shapes))


def calibration(model, block_size: int, scan: ScanCosts | None = None) -> HandoffCalibration:
    """The model's calibration: probed on first use (at `scan`'s chunk: the first engine's, so the probe's
    folds run the calls the engine's do; None: each probe forward picks its own), then carried from
    engine to engine (the last run's)."""
    if model not in _CALIB:
        cal = HandoffCalibration()
        t0 = time.perf_counter()
        _probe_rounds(model, block_size, cal, scan)
        cal.probe_seconds = time.perf_counter() - t0
        _CALIB[model] = cal
    return _CALIB[model]


def _scan_layers(model) -> list:
    """(kind, module) of each recurrent layer: 'gdn' (Qwen3.5's GatedDeltaNet) or 'ssd' (Mamba-2)."""
    from radixflow.engine.models.nemotron_h import Mamba2Mixer
    from radixflow.engine.models.qwen3_5 import GatedDeltaNet

    out = []
    for m in model.modules():
        if isinstance(m, GatedDeltaNet):
            out.append(("gdn", m))
        elif isinstance(m, Mamba2Mixer):
            out.append(("ssd", m))
    return out


def _scan_runner(kind: str, m, device: torch.device):
    """A function running one layer's chunked scan over a plan, on random inputs of the layer's sizes."""
    from radixflow.engine.models import gated_delta, ssd

    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape):
        return torch.rand(*shape, generator=gen).to(device)

    if kind == "gdn":
        h, dk, dv = m.nv, m.dk, m.dv

        def run(plan, n: int, r: int) -> None:
            args = [rand(n, h, dk) * 0.1, rand(n, h, dk) * 0.1, rand(n, h, dv), -rand(n, h), rand(n, h)]
            init = torch.zeros(r, h, dk, dv, device=device)
            out = torch.empty(n, h, dv, device=device)
            gated_delta._prefill(args, init, plan, init[:1], out)
        return run
    c = m.c
    h, p, s, g = c.mamba_num_heads, c.mamba_head_dim, c.ssm_state_size, c.n_groups

    def run(plan, n: int, r: int) -> None:  # noqa: F811 - one runner per kind
        args = [rand(n, h, p), -rand(n, h) * 0.1, rand(n, g, s), rand(n, g, s)]
        init = torch.zeros(r, h, p, s, device=device)
        out = torch.empty(n, h, p, device=device)
        ssd._prefill(args, init, plan, init[:1], out, g)
    return run


def _model_chunk(kind: str, m) -> int:
    return m.c.chunk_size if kind == "ssd" else 64  # gated_delta_rule's chunk


def _probe_scans(model, repeat: int = 3) -> ScanCosts | None:
    """Time one layer of each recurrent kind at every candidate chunk on four layouts (one long row:
    many steps, few slots; many short rows: one step, padded slots; rows cut every 16 tokens; between),
    fit each chunk's two costs, and sum them over the model's recurrent layers."""
    layers = _scan_layers(model)
    if not layers:
        return None
    device = next(model.parameters()).device
    per_slot: dict[int, float] = {}
    per_step: dict[int, float] = {}
    kinds: dict[str, tuple[object, int]] = {}
    for kind, m in layers:
        if kind not in kinds:
            kinds[kind] = (m, sum(k == kind for k, _ in layers))
    for kind, (m, count) in kinds.items():
        run = _scan_runner(kind, m, device)
        for chunk in chunk_candidates(_model_chunk(kind, m)):
            layouts = [[(0, 0, 256, [])], [(i, 16 * i, 16, []) for i in range(16)],
                       [(i, 64 * i, 64, [(k, 0) for k in (16, 32, 48)]) for i in range(4)],
                       [(i, 32 * i, 32, []) for i in range(8)]]
            samples = []
            for rows in layouts:
                plan = build_chunk_plan(rows, chunk, 256, device)
                run(plan, 256, len(rows))  # warm-up
                best = float("inf")
                for _ in range(repeat):
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    t0 = time.perf_counter()
                    run(plan, 256, len(rows))
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    best = min(best, time.perf_counter() - t0)
                samples.append((plan.num_slots, len(plan.steps), best))
            k, s = nnls([(a, b) for a, b, _ in samples], [t for *_, t in samples])
            if s <= 0:  # a noisy fit put all the time on slots; a step call is never free: the cheapest
                # measured time per step (a step with its chunk's slots, an over-estimate) bounds it
                s = min(t / steps for _, steps, t in samples)
            per_slot[chunk] = per_slot.get(chunk, 0.0) + count * k
            per_step[chunk] = per_step.get(chunk, 0.0) + count * s
    return ScanCosts(per_slot, per_step)


def _probe_rounds(model, block_size: int, cal: HandoffCalibration, scan: ScanCosts | None = None,
                  repeat: int = 2) -> None:
    """Warm start: synthetic forwards through a scratch cache, plain rows (the round fit) and a producer
    with dependents of a few sizes (the level fit, and the fold fit from every repeat), best of `repeat`
    each."""
    hybrid = model.is_hybrid
    device = next(model.parameters()).device
    costs = (scan or scan_costs(model)) if hybrid else None
    gen = torch.Generator().manual_seed(0)
    vocab = min(model.vocab_size, 256)

    def ids(n: int) -> list[int]:
        return torch.randint(0, vocab, (n,), generator=gen).tolist()

    plain = [[16], [128], [16] * 8, [64] * 4]
    # dependents of multi-token producers (folded: no level, unless batch.FOLD is off) and of 1-token
    # producers (a separate level: what the level fit prices)
    handed = [(128, [(128, 16)]), (128, [(64, 8), (128, 8)]), (128, [(96, 24)] * 4),
              (128, [(64, 40), (96, 40), (112, 40), (128, 40)] * 2), (256, [(256, 1)] * 4),
              (1, [(1, 16)]), (1, [(1, 8), (1, 24)]), (1, [(1, 40)] * 4), (1, [(1, 1)] * 4)] if hybrid else []
    pages = sum(-(-n // block_size) + 1 for lens in plain for n in lens)
    pages = max(pages, max((-(-p // block_size) + len(d) * 4 for p, d in handed), default=0))
    cache = model.allocate_cache(pages + 8, block_size, 4 if hybrid else 0)

    def timed(rows: list[RowInput]) -> tuple[float, dict[int, float]]:
        best, levels, base = float("inf"), {}, 0.0
        for _ in range(repeat):
            clock = LevelClock(device, time_fold=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            model(rows, cache, clock, costs)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t = time.perf_counter() - t0
            if clock.fold_copies:  # folded dependents: every repeat is an observation of the fold's cost
                cal.probe_folds.append((clock.fold_calls, clock.fold_rows, clock.fold_copied, clock.fold_measured))
            if t < best:
                best, levels, base = t, clock.by_level, clock.base
        if hybrid:  # level 0: every row without a producer, and the folded dependents
            all_lens = [len(r.token_ids) for r in rows]
            lens = [n for n, k in zip(all_lens, batch_mod.row_levels([r.after for r in rows], all_lens)) if k == 0]
            cal.probe_base.append((sum(n == 1 for n in lens), sum(n > 1 for n in lens),
                                   sum(n for n in lens if n > 1), max(lens), base))
        return best, levels

    for lens in plain:
        rows, page = [], 0
        for n in lens:
            need = -(-n // block_size)
            rows.append(RowInput(ids(n), 0, list(range(page, page + need)), None, [], [n - 1]))
            page += need
        t, _ = timed(rows)
        cal.probe_rounds.append((len(rows), sum(lens), t))
        cal.lengths.append(t)
    for plen, deps in handed:
        need = -(-plen // block_size)
        rows = [RowInput(ids(plen), 0, list(range(need)), None, [], [plen - 1])]
        page = need
        for d, n in deps:
            q = d // block_size
            own = -(-(d + n) // block_size) - q
            rows.append(RowInput(ids(n), d, list(range(q)) + list(range(page, page + own)), None, [], [n - 1],
                                 after=0))
            page += own
        t, levels = timed(rows)
        extra = sum(levels.values())
        cal.probe_rounds.append((len(rows), plen + sum(n for _, n in deps), t - extra))
        cal.lengths.append(t)
        if levels:  # a separate level ran (folded dependents run in level 0)
            cal.probe_levels.append((len(deps), sum(n for _, n in deps), max(n for _, n in deps), extra))
    cal._round_fit = cal._level_fit = cal._base_fit = cal._fold_fit = None
