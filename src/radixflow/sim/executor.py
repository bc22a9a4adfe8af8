"""The simulated executor: no model; the cost model gives c(B), tokens are a deterministic stand-in."""

from __future__ import annotations

import zlib

from radixflow.core.batch import Batch, ExecResult, Sample
from radixflow.sim.cost_model import CostModel


class SimExecutor:
    """Implements the executor protocol (`execute(batch) -> ExecResult`) for the simulator."""

    def __init__(self, cost: CostModel, vocab_size: int = 32000) -> None:
        self.cost = cost
        self.vocab_size = vocab_size

    def execute(self, batch: Batch) -> ExecResult:
        samples = {}
        for i, f in enumerate(batch.fragments):
            if f.samples:
                b = f.branch
                # Depends only on the branch and its length: arms agree on every token, as a
                # batch-invariant engine would.
                key = f"{b.request_id}/{b.index}/{f.end}".encode()
                samples[i] = Sample(zlib.crc32(key) % self.vocab_size)
        return ExecResult(self.cost.call_time(batch), samples, self.cost.capture_time(batch),
                          self.cost.handoff_time(batch))
