"""In-forward state hand-off (SPEC §15): a consumer that would be Blocked on a state its same-round
producer computes runs in that forward as a dependent row, reading the producer's state at its depth.

This module holds the round's producers (`Forward`: which row each branch is, at which level of the
forward) and the `auto` rule (`choose`). The scheduler's readiness check decides where a hand-off is
possible (core/readiness.py); the engine folds a multi-token producer's dependents into its
producer's recurrent scan and runs only a 1-token producer's dependents in a level of their own.

A row's level: 0 when it reads only published state, its producer's level + 1 for a dependent;
`--handoff-max-levels L` allows levels 0 .. L-1 in one forward (L = 1 is no hand-off: §9's bound's
dependency term D becomes ⌈D / L⌉).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from radixflow.core.batch import Batch


@dataclass(frozen=True)
class HandoffCosts:
    """What `--handoff auto` weighs, in seconds of host time. Two sources feed the same rule: the
    simulator's cost model (`sim/cost_model.py: CostModel.handoff_costs`, from vLLM's launch counts) and
    the real engine's own measurements (`engine/calibration.py: HandoffCalibration`, fitted online)."""

    level: float  # one extra recurrent level in a forward (its fixed part, every recurrent layer)
    token: float  # one more prefill token in a row (what recomputing the gap costs per token)
    round: float  # the fixed part of one more round (host + launches): what a wait costs when t+1 would not run
    level_row: float = 0.0  # each row a level runs, beyond its tokens' work (the simulator charges none)
    # one round of a consumer's latency, what a wait costs it when t+1 runs anyway (None: `round`, the
    # simulator's stand-in; the engine gives the measured length of its recent rounds)
    wait: float | None = None
    # the engine folds a dependent of a multi-token producer into its producer's chunked scan: no level,
    # only the scan calls it adds, each `fold_step` seconds at `fold_chunk` tokens a chunk (None: every
    # dependent opens or joins a level, as in the simulator)
    fold_step: float | None = None
    fold_chunk: int = 0


def fold_calls(chunk: int, producer_tokens: int, k: int, tokens: int) -> int:
    """Sequential scan calls a dependent of `tokens` tokens adds when folded into its producer's scan at
    k tokens into the producer's row of `producer_tokens` (chunks of `chunk`): the steps it runs past
    the producer's own last step (an upper bound: a longer row in the scan may cover them)."""
    return max(0, -(-tokens // chunk) - -(-(producer_tokens - k) // chunk))


class HandoffCostSource(Protocol):
    """Where a scheduler reads `auto`'s costs at the start of each round (the engine's calibration):
    the core is handed numbers, it never reads a clock."""

    def handoff_costs(self) -> HandoffCosts | None: ...


HANDOFF, WAIT, RECOMPUTE = "handoff", "wait", "recompute"


def choose(costs: HandoffCosts | None, new_level: bool, gap: int, next_sure: bool, spent: float = 0.0,
           sharers: int = 1, fold: tuple[int, int, int] | None = None) -> str:
    """`--handoff auto` for one consumer Blocked at depth d whose published state lies `gap` tokens below d:
    - hand-off costs the extra level when this consumer opens it (`new_level`), nothing more when the
      level already runs in this forward (its rows share the level's launches). The level is bought as
      in ski rental: `spent` is what this round already paid recomputing gaps instead of opening it, so
      the level costs `level - spent` more, and a round never pays more than one level's worth of
      recomputation before it opens the level (at most twice the best choice made in hindsight);
    - recompute costs the gap's tokens now, for each of the `sharers` consumers one level would serve
      (this one and its request's siblings queued right behind it, which the scan meets next);
    - wait costs the consumer one round: its latency when round t+1 runs anyway (`next_sure`: `wait`,
      the round's length, or its fixed part where none is given), and that round's host time as well
      when t+1 would not run without it.
    A level's per-row cost (`level_row`) is paid by every consumer it runs. Where the costs fold
    (`fold_step`) and the producer is a multi-token row (`fold`: its tokens, d's offset in it, the
    consumer's tokens), the hand-off opens no level: it costs the scan calls it adds (`fold_calls`).
    The cheapest wins; ties go to hand-off, then recompute. Without costs, hand-off."""
    if costs is None:
        return HANDOFF
    if costs.fold_step is not None and fold is not None and fold[0] > 1:
        handoff, new_level = fold_calls(costs.fold_chunk, *fold) * costs.fold_step, False
    else:
        handoff = (max(0.0, costs.level - spent) if new_level else 0.0) + costs.level_row
    recompute = gap * costs.token * (sharers if new_level else 1)
    latency = costs.round if costs.wait is None else costs.wait
    wait = latency if next_sure else latency + costs.round
    best = min(handoff, recompute, wait)
    if handoff <= best:
        return HANDOFF
    return RECOMPUTE if recompute <= best else WAIT


class Forward:
    """Round t's rows as producers: the row of each branch placed so far and its level."""

    __slots__ = ("batch", "rows", "levels", "depth", "dependents", "spent", "queue", "pos")

    MAX_SHARERS = 64  # siblings looked at behind a consumer

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.rows: dict[int, int] = {}  # branch uid -> index in batch.fragments
        self.levels: list[int] = []  # level of each row
        self.depth = 0  # deepest level so far (levels in this forward = depth + 1)
        self.dependents = 0  # rows handed off
        self.spent = 0.0  # `auto`: seconds of gaps recomputed this round instead of opening a level
        self.queue: list = []  # the waiting queue being scanned, and the scan's position in it
        self.pos = 0

    def placed(self, uid: int, level: int = 0) -> None:
        """The row just appended to the batch belongs to branch `uid`, at `level`."""
        self.rows[uid] = len(self.levels)
        self.levels.append(level)
        if level:
            self.dependents += 1
            if level > self.depth:
                self.depth = level


    def sharers(self, b) -> int:
        """`b` and its request's branches queued right behind it (they wait on the same producer)."""
        q, rid, ns = self.queue, b.request_id, b.namespace
        n, j, end = 1, self.pos + 1, min(len(self.queue), self.pos + 1 + self.MAX_SHARERS)
        while j < end and q[j].request_id == rid and q[j].namespace == ns:
            n += 1
            j += 1
        return n


def levels_of(batch: Batch) -> list[int]:
    """Each row's level, from `Fragment.after` (producers come first)."""
    out: list[int] = []
    for f in batch.fragments:
        out.append(0 if f.after is None else out[f.after] + 1)
    return out
