"""The scheduler's private state of one branch (`Branch.sched`) and the plan that selects it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from radixflow.cache.radix import Match, Node, Snapshot


@dataclass(eq=False, slots=True)
class Track:
    """Scheduler-private state of one branch."""

    hashes: list[int] = field(default_factory=list)
    page_table: list[int] = field(default_factory=list)
    private: set[int] = field(default_factory=set)  # pages owned by the branch, not by the tree
    node: Node | None = None  # deepest tree node the branch holds a lock on
    working: int | None = None  # slot with the branch's running linear state
    rolling: int | None = None  # slot with the state at the last page boundary passed (end snapshot)
    rolling_depth: int = 0
    read_snapshot: Snapshot | None = None  # locked for the round that restores from it
    level: int = 0  # dependency depth of the branch's last fragment
    verified: int = 0  # depth up to which a match was checked token by token
    kin: tuple | None = None  # an earlier arrival's prompt equal to this one's on the first kin_len tokens
    kin_len: int = 0
    no_cache: bool = False  # a hash collision was detected: this branch neither reads nor writes the cache
    junction: int = 0  # vllm-align: KV hit depth past the state hit at selection (vLLM's shared_prefix_boundary)
    partial_tail: Snapshot | None = None  # vllm-align partial hits: the tail state this branch stopped at
    seq: int = 0  # place in the waiting queue among equal priorities (uid; preempted: before every uid)
    # While waiting: the chain hash at the last match's depth ĥ and of the page after it (None past the
    # prompt). A branch whose key was found Blocked this round, and whose next page is still not in the
    # tree, has the same path and ĥ: it is Blocked without a lookup of its own.
    group_key: int | None = None
    next_hash: int | None = None


class Plan(NamedTuple):
    """How a selected branch starts (or, Blocked, where it will start at t+1)."""

    match: Match
    start: int
    num_tokens: int
    snapshot: Snapshot | None
    ready: int = 0  # a Blocked plan: the depth its ready state is at (what the wait saves is start - ready)
    after: int | None = None  # a hand-off (SPEC §15): the producer's row; `snapshot` is the pending state read
