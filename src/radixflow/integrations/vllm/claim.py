"""The claim of the requests deferred as Blocked in one vLLM step (SPEC §12), as plain arithmetic.

Once a step has deferred a request D_i (its matched state is being written in this step), whatever
the scan admits behind it must leave D what D needs at the next step: a row, its next fragment's
tokens and its blocks. `StepClaim` keeps that reservation and answers, for a later candidate, whether
its share of the next step fits beside it. A candidate that finishes within this step (its whole
remaining prompt is scheduled and it needs only the token sampled at the end of the step) holds
nothing at the next step and always fits; under async scheduling it still holds its row there (vLLM
schedules step t+1 before step t's output comes back), so its row is counted.

The arithmetic knows nothing of vLLM; `scheduler.py` feeds it what vLLM's own scan computed.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class NextStepShare:
    """What one request will hold at the next step: a row (0 or 1), the tokens it will ask for, and
    whether it finishes in this step (then its blocks are cached and evictable at the next step)."""

    rows: int
    tokens: int
    finishes: bool


def next_step_share(
    *,
    remaining_after: int,
    outputs_after: int,
    max_tokens: int,
    token_budget: int,
    rows_outlive_finish: bool,
) -> NextStepShare:
    """The next-step share of a request scheduled (or not) in this step.

    `remaining_after`: its tokens still to compute after this step (> 0: an unfinished prefill or spec
    tail; <= 0: it samples a token at the end of this step). `outputs_after`: its output tokens once
    this step's sample is counted. `rows_outlive_finish`: async scheduling, where a finished request
    is still in `running` when the next step is scheduled.
    """
    if remaining_after > 0:
        return NextStepShare(1, min(remaining_after, token_budget), False)
    if outputs_after >= max_tokens:
        return NextStepShare(1 if rows_outlive_finish else 0, 0, True)
    return NextStepShare(1, 1, False)


@dataclass
class StepClaim:
    """The reservation made by this step's deferred requests, and what has been admitted beside it.

    `base_rows` / `base_tokens`: rows and tokens the requests already in the batch (and the running
    requests not scheduled in it) will hold at the next step. `reserved_*`: what the deferred requests
    need then. A candidate's share fits when rows, tokens and (checked by vLLM's allocator with
    `reserved_blocks`) blocks all fit beside the reservation.
    """

    max_rows: int
    max_tokens: int
    base_rows: int = 0
    base_tokens: int = 0
    deferred: list[str] = field(default_factory=list)
    reserved_tokens: int = 0
    reserved_blocks: int = 0
    base_growth: int = 0
    started: bool = False  # base_rows / base_tokens have been counted

    @property
    def active(self) -> bool:
        return bool(self.deferred)

    def room_for_deferral(self, blocks: int, free_blocks: int) -> bool:
        """Whether one more deferred request could still be served at the next step beside the
        reservation: a row, at least one token (a partial next chunk is still progress), and its
        blocks within the pool's free blocks."""
        rows_ok = self.base_rows + len(self.deferred) + 1 <= self.max_rows
        tokens_ok = self.base_tokens + self.reserved_tokens < self.max_tokens
        return rows_ok and tokens_ok and self.reserved_blocks + blocks <= free_blocks

    def defer(self, request_id: str, tokens: int, blocks: int, growth_blocks: int = 0) -> None:
        """Reserve a deferred request's next fragment (`tokens`, `blocks`) and the blocks its decode
        takes after that (`growth_blocks`)."""
        self.deferred.append(request_id)
        self.reserved_tokens += min(tokens, self.max_tokens)
        self.reserved_blocks += blocks
        self.base_growth += growth_blocks

    def fits_beside(self, share: NextStepShare) -> bool:
        """Claim rule (a)/(b) for rows and tokens; the blocks are left to vLLM's allocator."""
        if share.rows and self.base_rows + share.rows + len(self.deferred) > self.max_rows:
            return False
        if share.tokens and self.base_tokens + share.tokens + self.reserved_tokens > self.max_tokens:
            return False
        return True

    def admit(self, share: NextStepShare, growth_blocks: int = 0) -> None:
        """Count an admitted (or already running) request's next-step share, and the blocks it will
        still take after this step until it reaches its length cap."""
        self.base_rows += share.rows
        self.base_tokens += share.tokens
        self.base_growth += growth_blocks

    @property
    def blocks_to_keep(self) -> int:
        """Free blocks an admission past the deferred requests must leave: their next-step blocks and
        the growth of everything admitted, so the admission sets up no preemption of its own."""
        return self.reserved_blocks + self.base_growth
