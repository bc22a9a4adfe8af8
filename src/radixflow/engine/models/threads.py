"""How many torch threads a recurrent scan runs with, chosen by timing it.

The chunked scans (gated delta rule, Mamba-2 SSD) are many small kernels, most of them inside a
sequential loop over chunk positions; each kernel is one parallel region the loop waits on. On a
CPU that is shared or has few cores, one thread often runs them faster than all of them, while the
projections around the scan want every core. Which one wins depends on the machine and its load,
not on the model, so it is measured: `ScanThreads.run(key, fn)` times `fn` with each candidate
thread count on the first calls of a shape class (`key`), then runs the faster, and every
`recheck`-th call of that class times a candidate again (the machine's load moves). The thread
count is set around `fn` only and the caller's is restored afterwards, even when `fn` raises.

`configure("auto" | "1" | N)` sets the policy the models use (`SCAN_THREADS`): "auto" measures,
a number fixes the scan's thread count (benchmarks/engine_prefill.py --scan-threads).

How a scan uses k > 1 threads (`split_heads`): not as k-thread kernels (each of the scan's hundreds of
small kernels is then a parallel region whose threads meet at a barrier; docs/engine_speed.md measured
[240 x 64 x 128] x [128 x 128] batched products at 132 GFLOP/s on one thread and 32 on two of a loaded
2-core machine), but as k independent scans over disjoint ranges of heads (heads never interact in
these recurrences), each on its own Python thread with torch at one thread, joined once at the end.
Every head's arithmetic is the same kernel calls on fewer batch entries, so outputs do not depend on k.

Denormal floats (`flush_denormals`): the scans multiply by decays exp(G) of cumulative log-gates, which
on real models reach exp(-87..-103), the float32 denormal range; a product with a denormal operand takes
a microcode assist (~100x a normal one) on x86. The scans therefore run with denormals flushed to zero
(FTZ/DAZ, `torch.set_flush_denormal`) on every thread that runs them: a value below 1.2e-38 becomes 0,
which no output of these models can show (qwen3.5-0.8b, 4 layers, case (b): the logits bit-identical,
the forward x1.42 on one thread). The MXCSR flag is per thread: set and cleared around the scan on the
caller's thread and on each split worker, never left on for other code (torch has no getter: it is
cleared to torch's default, off).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import torch

T = TypeVar("T")


@dataclass
class _Class:
    """One shape class: the last measured seconds of each candidate, the calls since its first trial."""

    seconds: dict[int, float] = field(default_factory=dict)
    calls: int = 0        # the first is a warm-up (allocations, first touch): run, not timed
    next_trial: int = 0   # index into the candidates of the next re-check


class ScanThreads:
    """Runs scans at a thread count chosen per shape class (see the module docstring).

    fixed: a thread count every scan runs with (no timing); None measures among `candidates`
    (default: 1 and torch's current count). clock: seconds, injectable for tests."""

    def __init__(self, fixed: int | None = None, candidates: tuple[int, ...] | None = None,
                 recheck: int = 8, clock: Callable[[], float] = time.perf_counter):
        if fixed is not None and fixed < 1:
            raise ValueError(f"scan threads must be >= 1, got {fixed}")
        if recheck < 2:
            raise ValueError(f"recheck must be >= 2 calls, got {recheck}")
        self.fixed = fixed
        self.candidates = candidates
        self.recheck = recheck
        self.clock = clock
        self.classes: dict[Hashable, _Class] = {}

    def _candidates(self, current: int) -> list[int]:
        cands = self.candidates if self.candidates is not None else (1, current)
        return sorted(set(cands))

    def choice(self, key: Hashable) -> int | None:
        """The thread count the next ordinary call of `key` runs with (None: still measuring)."""
        cls = self.classes.get(key)
        cands = self._candidates(torch.get_num_threads())
        if cls is None or any(c not in cls.seconds for c in cands):
            return None
        return min(cands, key=lambda c: (cls.seconds[c], -c))

    def _pick(self, key: Hashable) -> tuple[int, bool]:
        """(threads for this call, whether it is timed)."""
        current = torch.get_num_threads()
        if self.fixed is not None:
            return self.fixed, False
        cands = self._candidates(current)
        if len(cands) == 1:
            return cands[0], False
        cls = self.classes.setdefault(key, _Class())
        cls.calls += 1
        if cls.calls == 1:
            return current, False
        untried = [c for c in cands if c not in cls.seconds]
        if untried:
            return untried[0], True
        best = min(cands, key=lambda c: (cls.seconds[c], -c))
        if cls.calls % self.recheck == 0:   # re-time one of the others, in turn
            others = [c for c in cands if c != best]
            trial = others[cls.next_trial % len(others)]
            cls.next_trial += 1
            return trial, True
        return best, True   # the chosen one's time is refreshed too: a re-check compares like with like

    def run(self, key: Hashable, fn: Callable[[], T]) -> T:
        """fn() with torch's thread count set for the scan, restored afterwards."""
        threads, timed = self._pick(key)
        current = torch.get_num_threads()
        if threads != current:
            torch.set_num_threads(threads)
        try:
            t0 = self.clock() if timed else 0.0
            out = fn()
            if timed:
                self.classes[key].seconds[threads] = self.clock() - t0
            return out
        finally:
            if threads != current:
                torch.set_num_threads(current)


def shape_class(kind: str, tokens: int, rows: int) -> tuple[str, int, int]:
    """A scan's shape class: its kind, its token count rounded up to a power of two, and its rows
    (a few buckets, so a class gets the calls it needs to be measured)."""
    return kind, max(tokens - 1, 1).bit_length(), min(rows, 16).bit_length()


SCAN_THREADS = ScanThreads()


def configure(mode: str | int) -> ScanThreads:
    """Set the policy every scan uses: "auto" (measure 1 vs torch's count) or a fixed count >= 1."""
    global SCAN_THREADS
    if isinstance(mode, str) and mode.strip().lower() == "auto":
        SCAN_THREADS = ScanThreads()
        return SCAN_THREADS
    try:
        n = int(mode)
    except (TypeError, ValueError):
        raise ValueError(f"scan threads must be 'auto' or a count >= 1, got {mode!r}") from None
    SCAN_THREADS = ScanThreads(fixed=n)
    return SCAN_THREADS


@contextmanager
def flush_denormals() -> Iterator[None]:
    """Denormal floats flushed to zero on this thread inside (x86 FTZ/DAZ; a no-op where torch cannot
    set them), cleared again on exit."""
    if not torch.set_flush_denormal(True):
        yield
        return
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def run_scan(key: Hashable, fn: Callable[[], T], cuda: bool = False) -> T:
    """fn() under the configured policy (models call this around their scan; CPU threads only), with
    denormals flushed to zero on CPU."""
    if cuda:
        return fn()
    with flush_denormals():
        if torch.get_num_threads() == 1 and SCAN_THREADS.fixed in (None, 1):
            return fn()
        return SCAN_THREADS.run(key, fn)


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _workers(n: int) -> ThreadPoolExecutor:
    """A process-wide pool with at least n worker threads (kept: threads are made once)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL._max_workers < n:
            old, _POOL = _POOL, ThreadPoolExecutor(max_workers=n, thread_name_prefix="radixflow-scan")
            if old is not None:
                old.shutdown(wait=False)
        return _POOL


def head_ranges(heads: int, parts: int) -> list[tuple[int, int]]:
    """`heads` cut into `parts` contiguous ranges (at most one per head), sizes differing by at most 1."""
    parts = max(1, min(parts, heads))
    cuts = [heads * i // parts for i in range(parts + 1)]
    return [(cuts[i], cuts[i + 1]) for i in range(parts)]


def split_heads(heads: int, fn: Callable[[int, int], None]) -> None:
    """fn(lo, hi) over `heads` cut into as many ranges as torch's current thread count (the scan's
    policy set it: `run_scan`), run at once, each on its own thread with torch at one thread (the
    workers with denormals flushed, as `run_scan` has the caller's thread); the caller's thread runs
    the first range. Returns when every range is done; raises the first error.
    With one thread (or one head) fn(0, heads) runs directly."""
    threads = torch.get_num_threads()
    k = min(threads, heads)
    if k <= 1:
        fn(0, heads)
        return
    ranges = head_ranges(heads, k)
    inference, grad = torch.is_inference_mode_enabled(), torch.is_grad_enabled()

    def worker(lo: int, hi: int) -> None:   # the caller's thread-local modes, on the worker's thread
        with torch.inference_mode(inference), torch.set_grad_enabled(grad), flush_denormals():
            fn(lo, hi)

    torch.set_num_threads(1)   # the workers' torch (and MKL) run single-threaded too: the setting is global
    try:
        pool = _workers(k - 1)
        futures = [pool.submit(worker, lo, hi) for lo, hi in ranges[1:]]
        try:
            fn(*ranges[0])
        finally:
            errors = []
            for f in futures:   # every range finished before the thread count is put back
                try:
                    f.result()
                except BaseException as e:   # noqa: BLE001 - re-raised below
                    errors.append(e)
        if errors:
            raise errors[0]
    finally:
        torch.set_num_threads(threads)   # the caller's count, also where it exceeds the heads
