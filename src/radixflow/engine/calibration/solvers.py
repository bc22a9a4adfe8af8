"""Least-squares solvers of the engine's cost fits: non-negative least squares and least absolute
deviations (engine/calibration/model.py fits with them)."""

from __future__ import annotations

from itertools import combinations

import numpy as np


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




def _median(xs: list[float]) -> float:
    return xs[len(xs) // 2] if xs else 0.0

