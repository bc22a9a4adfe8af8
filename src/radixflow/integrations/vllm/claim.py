"""The claim of the requests deferred as Blocked in one vLLM step (SPEC §12), as plain arithmetic.

Once a step has deferred a request D_i (its matched state is being written in this step), whatever
the scan admits behind it must leave D what D needs at the next step: a row, its next fragment's
tokens and its blocks (for a waiting D, as many as vLLM's full-sequence gate will ask for). `StepClaim`
keeps that reservation and answers, for a later candidate, whether its share of the next step fits
beside it. A candidate that finishes within this step (its whole remaining prompt is scheduled and it
needs only the token sampled at the end of the step) holds nothing at the next step and always fits;
under async scheduling it still holds its row there (vLLM schedules step t+1 before step t's output
comes back), so its row is counted. Any other candidate must also finish by the end of the next step
(D's step): one that would still be running after it would run a step ahead of the native order for
the rest of its life, and on a full pool that moves every later gate, preemption and eviction.

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
    # It finishes by the end of the next step (the deferred requests' step), counting a prompt whose
    # remainder is one chunk there even where vLLM's Mamba alignment moves a sub-block tail of it on.
    finishes_next: bool = False


def next_step_share(
    *,
    remaining_after: int,
    outputs_after: int,
    max_tokens: int,
    next_chunk: int,
    chunk_cap: int,
    rows_outlive_finish: bool,
    decode_tokens: int = 1,
) -> NextStepShare:
    """The next-step share of a request scheduled (or not) in this step.

    `remaining_after`: its tokens still to compute after this step (> 0: an unfinished prefill or spec
    tail; <= 0: it samples a token at the end of this step). `outputs_after`: its output tokens once
    this step's sample is counted. `next_chunk`: for remaining_after > 0, the tokens vLLM's running
    loop will give it at the next step (its remainder capped by `long_prefill_token_threshold`, the
    token budget and the Mamba block alignment, as `scheduler.py` computes it); `chunk_cap`: the same
    caps before the alignment. `rows_outlive_finish`: async scheduling, where a finished request is
    still in `running` when the next step is scheduled. `decode_tokens`: what a request that samples
    in this step and goes on asks for at the next step (1, or 1 + N draft tokens under speculative
    decoding, capped as vLLM's running loop caps it); `outputs_after` then counts only the outputs it
    is sure of (drafts may all be rejected).
    """
    if remaining_after > 0:
        # An unfinished prompt (no output yet) finishes next step if its whole remainder is one chunk
        # and one token does. vLLM's alignment may end that chunk at the prompt's last block boundary
        # and run the sub-block tail a step later: a tail of a few tokens, not a request running a
        # step ahead of the native order for its life, so it still counts as finishing (the claim
        # counts its aligned chunk as its next-step tokens all the same).
        last = remaining_after <= chunk_cap and outputs_after + 1 >= max_tokens
        return NextStepShare(1, next_chunk, False, last)
    if outputs_after >= max_tokens:
        return NextStepShare(1 if rows_outlive_finish else 0, 0, True, True)
    return NextStepShare(1, decode_tokens, False, outputs_after + 1 >= max_tokens)


@dataclass
class StepClaim:
    """The reservation made by this step's deferred requests, and what has been admitted beside it.

    `base_rows` / `base_tokens`: rows and tokens the requests already in the batch (and the running
    requests not scheduled in it) will hold at the next step, where vLLM's running loop serves them
    before any waiting request; `base_alloc` the blocks they allocate then. The deferred requests D_1,
    D_2, ... are then served one after another from what is left: `reserved_tokens` is the sum of
    their next chunks had the budget lasted, `served_tokens` what each actually gets in turn;
    `reserved_alloc` the blocks they allocate then, and `reserved_peak` the free blocks their
    admissions need in turn (D_i's full-sequence gate and fragment checked after D_1..D_{i-1} have
    allocated, vLLM's watermark counted once, on each check as vLLM adds it, not once per deferral).
    A candidate's share fits when rows, tokens and (checked by vLLM's allocator with
    `reserved_blocks`) blocks all fit beside the reservation.
    """

    max_rows: int
    max_tokens: int
    base_rows: int = 0
    base_tokens: int = 0
    deferred: list[str] = field(default_factory=list)
    reserved_tokens: int = 0
    served_tokens: int = 0
    reserved_alloc: int = 0
    reserved_peak: int = 0
    base_growth: int = 0
    base_alloc: int = 0  # blocks the base allocates at the next step, before any deferred request
    started: bool = False  # base_rows / base_tokens have been counted

    @property
    def active(self) -> bool:
        return bool(self.deferred)

    @property
    def tokens_left(self) -> int:
        """The token budget the next deferred request would find at the next step."""
        return max(self.max_tokens - self.base_tokens - self.served_tokens, 0)

    def room_for_deferral(self, tokens: int, need_blocks: int, free_blocks: int) -> bool:
        """Whether one more deferred request could still be served at the next step after the ones
        before it: a row, a non-empty chunk (`tokens`, computed from `tokens_left`), and its
        admission's block check (`need_blocks`: gate or fragment, watermark included) against the
        pool once the base and the earlier deferred requests have allocated."""
        rows_ok = self.base_rows + len(self.deferred) + 1 <= self.max_rows
        return rows_ok and tokens > 0 and self.base_alloc + self.reserved_alloc + need_blocks <= free_blocks

    def defer(self, request_id: str, demand: int, tokens: int, alloc_blocks: int, need_blocks: int,
              growth_blocks: int = 0) -> None:
        """Reserve a deferred request's next step: `demand` tokens (its chunk had the budget lasted),
        `tokens` (what it gets after the earlier ones), `alloc_blocks` it allocates, `need_blocks` its
        admission checks for, and the blocks its decode takes after that (`growth_blocks`)."""
        self.deferred.append(request_id)
        self.reserved_tokens += demand
        self.served_tokens += tokens
        self.reserved_peak = max(self.reserved_peak, self.reserved_alloc + need_blocks)
        self.reserved_alloc += alloc_blocks
        self.base_growth += growth_blocks

    def fits_beside(self, share: NextStepShare) -> bool:
        """Claim rule (a)/(b) for rows and tokens; the blocks are left to vLLM's allocator. (b) takes
        only a candidate that finishes by the end of the next step, and only if every deferred request
        still gets its whole next chunk (the candidate runs before them at the next step)."""
        if not share.finishes_next:
            return False
        if share.rows and self.base_rows + share.rows + len(self.deferred) > self.max_rows:
            return False
        if share.tokens and self.base_tokens + share.tokens + self.reserved_tokens > self.max_tokens:
            return False
        return True

    def admit(self, share: NextStepShare, growth_blocks: int = 0, next_blocks: int = 0) -> None:
        """Count an admitted (or already running) request's next-step share, the blocks its next-step
        chunk allocates (`next_blocks`) and the blocks it will still take after this step until it
        reaches its length cap (`growth_blocks`, which include `next_blocks`)."""
        self.base_rows += share.rows
        self.base_tokens += share.tokens
        self.base_alloc += next_blocks
        self.base_growth += growth_blocks

    @property
    def blocks_to_keep(self) -> int:
        """Free blocks an admission past the deferred requests must leave: what their admissions need
        at the next step and the growth of everything admitted, so the admission sets up no
        preemption of its own."""
        return self.reserved_peak + self.base_growth
