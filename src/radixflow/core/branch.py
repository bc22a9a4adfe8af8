"""Logical requests and their branches: what a client sent and the counters the scheduler keeps."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class BranchState(enum.Enum):
    HELD = "held"  # arrived, not yet admitted by the admission policy
    WAITING = "waiting"  # admitted, not started (or preempted back)
    RUNNING = "running"  # started: chunked prefill or decode in progress
    FINISHED = "finished"


@dataclass(eq=False)
class Branch:
    """One prompt of a logical request; the unit the scheduler places into rounds."""

    request_id: str
    index: int
    prompt: tuple[int, ...]
    namespace: str = ""
    arrival: float = 0.0
    max_new_tokens: int = 1
    stop_token_ids: frozenset[int] = frozenset()
    priority: int = 0  # lower runs first (vLLM's convention); ties go by arrival (uid) order
    uid: int = -1  # set by the scheduler when added; unique and increasing in native order
    state: BranchState = BranchState.HELD
    output: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    cached_tokens: int | None = None  # start boundary h at first selection
    identity_hit: int | None = None  # ĥ at first selection
    blocked_rounds: int = 0  # rounds deferred as Blocked before the first selection
    blocked_tokens: int = 0  # what the wait saved: blocking depth − ready depth at the first deferral
    misses: object = None  # core.misses.Misses: the prompt split by cause at first selection
    admitted_at: float | None = None
    first_selected_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    num_fragments: int = 0
    num_preemptions: int = 0
    finish_reason: str | None = None
    sched: object = None  # scheduler-private bookkeeping (pages, slots, locks)
    user_data: object = None  # executor-private data (sampling params, generator, logprobs)

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, tuple):
            self.prompt = tuple(self.prompt)
        if len(self.prompt) == 0:
            raise ValueError(f"branch {self.request_id}/{self.index}: empty prompt")
        if self.max_new_tokens < 1:
            raise ValueError(f"branch {self.request_id}/{self.index}: max_new_tokens must be >= 1")
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise ValueError(f"branch {self.request_id}/{self.index}: priority must be an integer, "
                             f"got {self.priority!r}")

    @property
    def key(self) -> tuple[str, int]:
        return (self.request_id, self.index)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.prompt + tuple(self.output) if self.output else self.prompt

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def remaining_prefill(self) -> int:
        return max(0, len(self.prompt) - self.num_computed_tokens)

    @property
    def in_prefill(self) -> bool:
        return self.num_computed_tokens < len(self.prompt)

    @property
    def is_finished(self) -> bool:
        return self.state is BranchState.FINISHED

    def tokens_to_compute(self) -> int:
        """Tokens not yet run through the model (the last sampled token included)."""
        return self.num_tokens - self.num_computed_tokens


@dataclass(eq=False)
class LogicalRequest:
    """What a client sends: one or more branches that finish together."""

    request_id: str
    branches: list[Branch]
    arrival: float = 0.0

    @property
    def finished(self) -> bool:
        return all(b.is_finished for b in self.branches)

    @property
    def finished_at(self) -> float | None:
        if not self.finished:
            return None
        return max(b.finished_at for b in self.branches)

    @property
    def latency(self) -> float | None:
        end = self.finished_at
        return None if end is None else end - self.arrival


def group_requests(branches: list[Branch]) -> list[LogicalRequest]:
    """Groups branches into logical requests by request_id, keeping first-seen order."""
    groups: dict[str, LogicalRequest] = {}
    for b in branches:
        req = groups.get(b.request_id)
        if req is None:
            groups[b.request_id] = LogicalRequest(b.request_id, [b], b.arrival)
        else:
            req.branches.append(b)
            req.arrival = min(req.arrival, b.arrival)
    return list(groups.values())
