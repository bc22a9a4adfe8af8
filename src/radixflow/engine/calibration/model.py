"""`HandoffCalibration`: the engine's fitted cost model for `--handoff auto` (the fits the package
docstring describes), and the summaries `bench` and `/metrics` print from its logs."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from radixflow.core.handoff import HandoffCosts
from radixflow.engine.calibration.solvers import _median, nnls, nnls_l1
from radixflow.engine.models import batch as batch_mod
from radixflow.engine.models.chunk_plan import ScanCosts

WINDOW = 256  # observations kept per fit (the newest)
BASE_REFIT = 16  # level 0's fit is remade after this many new rounds (a refit costs ~2 ms on a CPU)
FOLD_REFIT = 4  # the fold's fit (least absolute deviations, ~1.5-3 ms on a CPU) after this many new forwards


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


