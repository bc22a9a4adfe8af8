"""Data passed between the scheduler and an executor: fragments, a round's batch, its result."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from radixflow.core.branch import Branch


class Outcome(enum.Enum):
    """σ_t(r | B): the readiness of a waiting branch against the partial batch B (SPEC §3)."""

    READY = "ready"
    BLOCKED = "blocked"  # only obstacle: a same-round producer in B writes the matched boundary
    OTHER = "other"  # rows or tokens exhausted, pool out of memory, ...


@dataclass(eq=False, slots=True)
class Fragment:
    """One row of one round: `num_tokens` tokens of `branch` starting at position `start`."""

    branch: Branch
    start: int
    num_tokens: int
    page_table: list[int]  # pages covering [0, start + num_tokens)
    state_in: int | None = None  # snapshot/working slot holding the state at `start` (hybrid only)
    state_out: list[tuple[int, int]] = field(default_factory=list)  # (n tokens in, slot) captures
    samples: bool = False  # the row's last position produces the branch's next token
    first: bool = False  # first fragment of the branch since it was (re)started
    copies_before: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) KV pages, before the forward
    copies_after: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) KV pages, after the forward
    # SPEC §15 hand-off: index in Batch.fragments of the producer row of the same forward whose state at
    # `start` this row starts from (producer.start < start <= producer.end; the producer comes first in the
    # list). Pages below start // block_size are the producer's (or the tree's copy of the same tokens'
    # K/V where the producer keeps a private duplicate: written in this forward or published before); a
    # page that `start` cuts is this row's own and the engine forks the producer's rows
    # [0, start % block_size) into it after the producer's K/V write.
    # `state_in` is None for a dependent.
    after: int | None = None

    @property
    def end(self) -> int:
        return self.start + self.num_tokens

    @property
    def token_ids(self) -> tuple[int, ...]:
        return self.branch.tokens[self.start : self.end]


@dataclass
class Batch:
    round: int
    fragments: list[Fragment] = field(default_factory=list)
    deferred: int = 0  # Blocked branches skipped this round (|D_t|)
    stop_reason: str | None = None  # why the waiting scan ended early (Other), if it did

    @property
    def num_rows(self) -> int:
        return len(self.fragments)

    @property
    def num_tokens(self) -> int:
        return sum(f.num_tokens for f in self.fragments)

    def __bool__(self) -> bool:
        return bool(self.fragments)


@dataclass
class Sample:
    """What the executor produced for a sampling row."""

    token: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    finish_reason: str | None = None  # set by an executor that detects a stop (e.g. a stop string)


@dataclass
class ExecResult:
    host_time: float  # c(B_t), seconds
    samples: dict[int, Sample] = field(default_factory=dict)  # fragment index -> sample
    capture_time: float = 0.0  # the part of c(B_t) spent capturing state and copying pages (modelled)
    handoff_time: float = 0.0  # the part of c(B_t) spent in extra recurrent levels (SPEC §15; engine: measured)
    # recurrent levels the forward ran, where the executor counts them itself (the engine folds a
    # multi-token producer's dependents into its scan: no level); None: the scheduler's count
    levels: int | None = None
