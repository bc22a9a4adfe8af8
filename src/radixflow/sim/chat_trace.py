"""Replays one multi-turn conversation through the Scheduler, turn by turn (SPEC §10): per turn the
identity hit ĥ, the ready hit h and what is recomputed."""

from __future__ import annotations

from dataclasses import dataclass

from radixflow.config import SchedulerConfig
from radixflow.core.branch import Branch
from radixflow.core.loop import run_trace
from radixflow.core.policies import get_arm
from radixflow.core.scheduler import Scheduler
from radixflow.sim.cost_model import CostModel, get_gpu
from radixflow.sim.executor import SimExecutor
from radixflow.spec import get_spec
from radixflow.workloads.multiturn import Turn


@dataclass(frozen=True)
class TurnTrace:
    label: str
    request_len: int
    hit: int  # ĥ: what the index matched
    ready_hit: int  # h: what the model can resume from (a state boundary on hybrid models)
    checkpoint_missing: int = 0  # SPEC §14 causes of the recomputed tokens (they add up with h)
    evicted: int = 0
    no_shared_prefix: int = 0

    @property
    def recomputed(self) -> int:
        return self.request_len - self.ready_hit


def trace_chat(turns: list[Turn], model: str, block_size: int = 1, state_interval: int = 512,
               gpu: str = "a800", checkpoints: str = "boundary") -> list[TurnTrace]:
    """Replays the turns one after the other through the Scheduler (one cache for all of them).

    The answer is served as part of its turn's branch (its tokens are known), so its KV and the
    state at its end are cached, as the chapter assumes; a real decode leaves the last token's KV
    uncomputed, one token less.
    """
    spec = get_spec(model)
    longest = max(len(t.request) + len(t.answer) for t in turns)
    budget = max(8192, state_interval, -(-longest // state_interval) * state_interval)
    cfg = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=budget, block_size=block_size,
                          state_interval=state_interval, checkpoints=checkpoints)
    sched = Scheduler(cfg, get_arm("radix"), spec.is_hybrid)
    executor = SimExecutor(CostModel(spec, get_gpu(gpu), block_size=block_size), spec.vocab_size)
    out = []
    for i, t in enumerate(turns):
        b = Branch(f"turn{i}", 0, t.request + t.answer, "chat", 0.0, 1)
        run_trace(sched, executor, [b])
        # A match never covers a request's last token (it must be run to sample), as in vLLM.
        hit = min(b.identity_hit or 0, len(t.request) - 1)
        ready = min(b.cached_tokens or 0, hit)
        m = b.misses  # counted on the whole branch (request + answer); the request's share:
        gone = min(m.evicted, hit - ready) if m is not None else 0
        out.append(TurnTrace(t.label, len(t.request), hit, ready, hit - ready - gone, gone,
                             len(t.request) - hit))
    return out
