"""Timing a forward's recurrent levels (`LevelClock`): what the executor and the hand-off calibration
read after each call (SPEC §15; engine/calibration.py). Kept apart from batch.py's tensor packing: the
models only call into it (`Level.timed`, `ChunkPlan.timer`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class LevelClock:
    """Time spent in the recurrent levels of one call: the extra levels >= 1 (SPEC §15, `by_level`)
    and level 0 (`base`: what the extra levels' rows are priced against, engine/calibration.py); the
    host clock on CPU, CUDA events on a GPU (read after the call, so measuring adds no synchronisation).

    Folded dependents (chunk_plan.py): `fold_calls` / `fold_rows` / `fold_copies` / `fold_copied` count
    what they add to their producers' scans (sequential calls of folded rows only, the rows those calls
    run, state copies at the fold points, the rows those copies start), `fold_seconds` prices the calls
    at the probe's per-call cost, and with `time_fold` (the engine sets it while it calibrates) the
    scans time those calls and copies:
    `fold_wall` on the host clock, `fold_measured` the same segments in the calling thread's CPU time
    where the scan runs on one thread (so time the OS gave other processes, several ms at a time on a
    shared machine, is not counted as the fold's; the host clock where it runs on more), the GPU's time
    (CUDA events) on a GPU."""

    def __init__(self, device: torch.device, time_fold: bool = False) -> None:
        self.cuda = device.type == "cuda"
        self._seconds: dict[int, float] = {}
        self._events: list[tuple[int, torch.cuda.Event, torch.cuda.Event]] = []
        self.time_fold = time_fold
        self.fold_calls = 0         # sequential scan calls the folded dependents added (chunk_plan.py)
        self.fold_rows = 0          # the rows those calls ran (a call of n folded rows counts n)
        self.fold_copies = 0        # calls after which folded rows' states are copied (per plan, like calls)
        self.fold_copied = 0        # the folded rows those copies start (a copy for k siblings counts k)
        self.fold_seconds = 0.0     # those calls priced by the probe's per-call cost (`ScanCosts.per_step`)
        self._fold_measured = 0.0
        self._fold_wall = 0.0
        self._fold_events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def fold(self, calls: int, seconds: float, copies: int = 0, rows: int = 0, copied: int = 0) -> None:
        """A level's plan: its folded dependents added `calls` scan calls running `rows` rows (all
        recurrent layers), priced at `seconds`, and `copies` state copies starting `copied` rows."""
        self.fold_calls += calls
        self.fold_rows += rows
        self.fold_copies += copies
        self.fold_copied += copied
        self.fold_seconds += seconds

    def fold_start(self) -> object:
        """Start timing one call or copy of the fold (chunk_plan.py `blocked_scan`)."""
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter(), time.thread_time() if torch.get_num_threads() == 1 else None

    def fold_stop(self, token: object) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._fold_events.append((token, end))  # type: ignore[arg-type]
            return
        wall0, cpu0 = token  # type: ignore[misc]
        wall = time.perf_counter() - wall0
        self._fold_wall += wall
        self._fold_measured += wall if cpu0 is None else time.thread_time() - cpu0

    def _read_fold_events(self) -> None:
        if self._fold_events:
            self._fold_events[-1][1].synchronize()
            gpu = sum(s.elapsed_time(e) for s, e in self._fold_events) / 1000.0
            self._fold_measured += gpu
            self._fold_wall += gpu
            self._fold_events = []

    @property
    def fold_measured(self) -> float:
        """Seconds measured in the folded rows' own scan calls and fold copies (0 when not timed)."""
        self._read_fold_events()
        return self._fold_measured

    @property
    def fold_wall(self) -> float:
        """The same on the host clock (other processes' time on a shared machine included)."""
        self._read_fold_events()
        return self._fold_wall

    @contextmanager
    def measure(self, depth: int = 1) -> Iterator[None]:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((depth, start, end))
        else:
            t0 = time.perf_counter()
            yield
            self._seconds[depth] = self._seconds.get(depth, 0.0) + time.perf_counter() - t0

    def _all(self) -> dict[int, float]:
        out = dict(self._seconds)
        if self._events:
            self._events[-1][2].synchronize()
            for depth, s, e in self._events:
                out[depth] = out.get(depth, 0.0) + s.elapsed_time(e) / 1000.0
        return out

    @property
    def by_level(self) -> dict[int, float]:
        """Seconds measured per extra level depth (>= 1), summed over the recurrent layers."""
        return {d: s for d, s in self._all().items() if d}

    @property
    def base(self) -> float:
        """Seconds measured in level 0's recurrent work (every row without a same-forward producer)."""
        return self._all().get(0, 0.0)

    @property
    def seconds(self) -> float:
        return sum(self.by_level.values())
