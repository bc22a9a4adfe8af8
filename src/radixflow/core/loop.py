"""Drives one trace through a scheduler and an executor: arrivals, admission, rounds, completion.

Time is a virtual clock: it advances by each call's host time (measured or modelled) and jumps over
idle gaps to the next arrival or admission deadline. The scheduler itself never reads a clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from radixflow.core.batch import Batch, ExecResult
from radixflow.core.branch import Branch
from radixflow.core.scheduler import Scheduler


class Executor(Protocol):
    def execute(self, batch: Batch) -> ExecResult: ...


@dataclass
class RunResult:
    scheduler: Scheduler
    branches: list[Branch]
    makespan: float


def run_trace(scheduler: Scheduler, executor: Executor, branches: list[Branch],
              on_round: Callable[[Scheduler, Batch], None] | None = None,
              progress: Callable[[int], None] | None = None) -> RunResult:
    """Runs every branch to completion; returns when all have finished."""
    order = sorted(branches, key=lambda b: b.arrival)  # stable: native order within equal arrivals
    now = order[0].arrival if order else 0.0
    i = 0
    done = 0
    while i < len(order) or scheduler.has_unfinished:
        while i < len(order) and order[i].arrival <= now + 1e-12:
            scheduler.add(order[i])
            i += 1
        deadline = scheduler.admit(now)
        preempted = scheduler.preemptions
        batch = scheduler.schedule(now)
        if not batch and scheduler.preemptions > preempted:
            continue  # the call preempted every running branch and, as vLLM, started none: the next one will
        if not batch:
            nxt = [t for t in (order[i].arrival if i < len(order) else None, deadline) if t is not None]
            if not nxt:
                raise RuntimeError(f"stuck at t={now:.3f}s: {len(scheduler.waiting)} waiting, "
                                   f"{len(scheduler.running)} running, nothing schedulable "
                                   f"(is the KV pool too small for one branch?)")
            now = max(now, min(nxt))
            continue
        result = executor.execute(batch)
        now += result.host_time
        finished = scheduler.complete(batch, result, now)
        if on_round is not None:
            on_round(scheduler, batch)
        if progress is not None and finished:
            done += len(finished)
            progress(len(finished))
    return RunResult(scheduler, list(branches), now)
