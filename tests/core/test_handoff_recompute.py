"""`--handoff auto` choosing to recompute a consumer's gap: it resumes from the published snapshot beneath
its pending boundary, with that snapshot as its state (a grid boundary that is pending names only the
published one's depth; the engine refuses a row that starts past 0 with no state)."""

from __future__ import annotations

from factories import make_branches, small_config
from radixflow.core.batch import ExecResult, Sample
from radixflow.core.handoff import RECOMPUTE, HandoffCosts
from radixflow.core.loop import run_trace
from radixflow.core.policies import get_arm
from radixflow.core.scheduler import Scheduler


class _Checked:
    """Executes nothing; checks every row has the state it starts from."""

    def __init__(self) -> None:
        self.resumed = 0

    def execute(self, batch):
        for f in batch.fragments:
            assert f.start == 0 or f.state_in is not None or f.after is not None, (f.branch.key, f.start)
            self.resumed += f.start > 0 and f.state_in is not None
        return ExecResult(0.01, {i: Sample(1, 0.0) for i, f in enumerate(batch.fragments) if f.samples})


def test_a_recomputed_gap_resumes_from_the_published_snapshot():
    recompute = HandoffCosts(level=1.0, token=1e-9, round=1.0)  # a level dearer than any gap
    for arm in ("radix", "radixflow"):
        # a 200-token document over a 160-token budget: in round 2 the siblings meet the producer's pending
        # boundaries past 160 with the published one at 160 beneath them
        branches = make_branches(1, doc_len=200, tail=20)
        s = Scheduler(small_config(handoff="auto", max_num_batched_tokens=160), get_arm(arm), True,
                      handoff_costs=recompute)
        ex = _Checked()
        run_trace(s, ex, branches, on_round=lambda sch, _: sch.check_integrity())
        assert s.handoff_choices[RECOMPUTE] > 0 and ex.resumed > 0, (arm, s.handoff_choices)
