"""The trace driver (core/loop.py)."""

from __future__ import annotations

import pytest

from radixflow.core.batch import Batch, ExecResult, Fragment, Sample
from radixflow.core.branch import Branch
from radixflow.core.loop import run_trace


class _PreemptsFirst:
    """A scheduler whose first call preempts its only running branch and places nothing (as vLLM: no
    new branch starts in a round that preempted); the next call runs the branch."""

    def __init__(self, preempt: bool) -> None:
        self.preempt, self.preemptions, self.calls = preempt, 0, 0
        self.branches: list[Branch] = []
        self.waiting: list[Branch] = []
        self.running: list[Branch] = []

    @property
    def has_unfinished(self) -> bool:
        return any(not b.output for b in self.branches)

    def add(self, b: Branch) -> None:
        self.branches.append(b)

    def admit(self, now: float) -> None:
        return None

    def schedule(self, now: float) -> Batch:
        self.calls += 1
        batch = Batch(self.calls)
        if self.calls == 1:
            self.preemptions += self.preempt
            return batch
        batch.fragments = [Fragment(b, 0, len(b.prompt), [], samples=True) for b in self.branches if not b.output]
        return batch

    def complete(self, batch: Batch, result: ExecResult, now: float) -> list[Branch]:
        for f in batch.fragments:
            f.branch.output.append(1)
        return [f.branch for f in batch.fragments]


class _Exec:
    def execute(self, batch: Batch) -> ExecResult:
        return ExecResult(0.01, {i: Sample(1) for i in range(batch.num_rows)})


def test_a_round_that_only_preempted_is_followed_by_the_next_round():
    s = _PreemptsFirst(preempt=True)
    run_trace(s, _Exec(), [Branch("r", 0, (1, 2, 3))])
    assert s.calls == 2 and s.branches[0].output == [1]


def test_an_empty_round_without_preemption_and_no_event_is_stuck():
    with pytest.raises(RuntimeError, match="stuck"):
        run_trace(_PreemptsFirst(preempt=False), _Exec(), [Branch("r", 0, (1, 2, 3))])
