"""A deferred branch keeps its claim (SPEC §12): what state-ready traversal may admit past it.

Within round t, once the scan has deferred branches as Blocked (the set D), a later candidate r is
admitted only if

(a) r finishes within round t: its whole remaining prompt is in this round's fragment and it needs
    only the token sampled at the end of it (at t+1 it holds no row, only cached, evictable KV); or
(b) r finishes by the end of round t+1 (D's round) and fits in what t+1 leaves after reserving
    D's needs there:
    finish  after round t, r has only a prompt tail that one native chunk of T takes, and one token
            to sample, or exactly one decode token left. One that would run past t+1 is refused even
            when it fits: admitted a round early, it runs a round ahead of the native order for its
            whole life (the vLLM plugin's rule, `integrations/vllm/claim.py`; docs/vllm.md);
    rows    rows still running at t+1 (running rows and admitted branches that do not finish now,
            r included) + |D| <= S;
    tokens  those rows' t+1 demand (a decode is 1 token, an unfinished prefill its next chunk) plus
            D's t+1 fragments (capped at T) <= T;
    memory  the pages (and, for hybrid models, the state slot) r takes now, plus D's t+1 fragments'
            pages beyond their hit and one working slot each, fit in what is free or evictable now.
A D member's t+1 fragment starts at the boundary it is Blocked on (the hit once the producer's state
is published) and is the native chunk from there with the whole budget T.

A candidate that fails both is treated like Other: the scan stops there (native order is kept: no
later branch may overtake it). This module is pure arithmetic: the scheduler feeds it rows, tokens
and pool figures; it holds no reference to the scheduler.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from radixflow.core.branch import Branch


def finishes_now(b: Branch, end: int) -> bool:
    """True when a fragment of `b` ending at `end` completes it (its last token is sampled now).
    A stop token may finish a branch earlier; that is not known in advance, so it is not counted."""
    return end >= b.num_tokens and len(b.output) + 1 >= b.max_new_tokens


def finishes_next(b: Branch, end: int, max_tokens: int, chunk: Callable[[int, int, int], int]) -> bool:
    """True when `b`, after a fragment ending at `end` in round t, finishes by the end of round t+1:
    a decode with one token left, or a prompt tail that t+1's native chunk (`chunk` with the whole
    budget `max_tokens`) takes whole, followed by its last token."""
    total = b.num_tokens
    if end >= total:
        return len(b.output) + 2 >= b.max_new_tokens  # one sampled now, one at t+1
    return len(b.output) + 1 >= b.max_new_tokens and chunk(end, total, max_tokens) == total - end


@dataclass
class Claims:
    """Round t's reservation for round t+1 on behalf of the deferred set D."""

    max_rows: int
    max_tokens: int
    block_size: int
    chunk: Callable[[int, int, int], int]  # the scheduler's fragment rule: (start, total, tokens) -> n
    slot_per_row: int = 0  # hybrid models: each row at t+1 needs a working state slot
    rows_next: int = 0  # rows that will still be running at t+1
    tokens_next: int = 0  # their t+1 token demand
    deferred: int = 0  # |D|
    d_tokens: int = 0  # D's t+1 fragments, tokens
    d_pages: int = 0  # D's t+1 fragments, new pages beyond their hit
    open: bool = True  # False once every t+1 row is claimed: D's sums no longer matter
    reserved_rows: int = 0  # rows_next + |D| at the last non-finishing admission past D (for tests)
    reserved_deferred: int = 0  # |D| then
    passed_b: list[Branch] = field(default_factory=list)  # admitted under (b): done by the end of t+1 (tests)
    _last: tuple[int, int] = (-1, -1)  # defer's last (start, total) and its (tokens, pages) at t+1
    _last_sums: tuple[int, int] = (0, 0)

    @property
    def active(self) -> bool:
        return self.deferred > 0

    @property
    def rows_full(self) -> bool:
        """No candidate can pass (b) any more: every t+1 row is running or reserved."""
        return self.rows_next + self.deferred >= self.max_rows

    def carry(self, b: Branch, end: int) -> None:
        """A row placed in round t (running or admitted) whose fragment ends at `end`."""
        if not finishes_now(b, end):
            self.rows_next += 1
            self.tokens_next += self._next_demand(b, end)

    def defer(self, b: Branch, start: int) -> None:
        """`b` is Blocked on the boundary at `start`; reserve its t+1 fragment."""
        self.deferred = d = self.deferred + 1
        if self.rows_next + d >= self.max_rows:
            self.open = False  # nothing can pass (b) any more (rows_next only grows): stop summing
            return
        key = (start, b.num_tokens)
        if key != self._last:  # siblings of one group mostly repeat the last fragment: chunk it once
            n = self.chunk(start, key[1], self.max_tokens)
            bs = self.block_size
            self._last, self._last_sums = key, (n, -(-(start + n) // bs) - start // bs)
        n, pages = self._last_sums
        self.d_tokens += n
        self.d_pages += pages

    def allows(self, b: Branch, end: int, take_pages: int, avail_pages: int,
               avail_slots: int, bytes_check: Callable[[int, int], bool] | None = None) -> bool:
        """May `b`, whose fragment would end at `end` and take `take_pages` pages now, be admitted?
        `avail_pages`/`avail_slots`: free + evictable before `b` takes anything; `bytes_check(pages,
        slots)`: whether that much fits in a shared byte budget (None when pools are separate)."""
        if not self.active or finishes_now(b, end):
            return True  # (a)
        if not finishes_next(b, end, self.max_tokens, self.chunk):
            return False  # (b) takes only what finishes in D's round
        if self.rows_next + 1 + self.deferred > self.max_rows:
            return False
        d_tokens = min(self.max_tokens, self.d_tokens)
        if self.tokens_next + self._next_demand(b, end) + d_tokens > self.max_tokens:
            return False
        pages = take_pages + self.d_pages
        slots = self.slot_per_row * (1 + self.deferred)
        if pages > avail_pages or slots > avail_slots:
            return False
        if bytes_check is not None and not bytes_check(pages, slots):
            return False
        self.reserved_rows = self.rows_next + 1 + self.deferred
        self.reserved_deferred = self.deferred
        self.passed_b.append(b)
        return True

    def _next_demand(self, b: Branch, end: int) -> int:
        if end >= b.num_tokens:
            return 1  # decoding at t+1
        return self.chunk(end, b.num_tokens, self.max_tokens)
