"""Side-by-side timing for the benchmarks: two functions run interleaved so both see the same load."""

from __future__ import annotations

import time


def timed_pair(fn_a, fn_b, repeat: int) -> tuple[float, float]:
    """Best-of-`repeat` seconds of two functions, runs interleaved so both see the same machine load."""
    fn_a(), fn_b()  # warm-up
    a, b = [], []
    for _ in range(repeat):
        for fn, times in ((fn_a, a), (fn_b, b)):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return min(a), min(b)  # min, not median: the least disturbed run on a shared machine
