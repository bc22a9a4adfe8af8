"""Multi-turn chat (SPEC §10, the RadixAttention chapter): the whole history is resent every turn.

A conversation is system prompt, then user turn / assistant answer pairs. Turn t's request is
S + U1 + A1 + … + U_t; the assistant's answer A_t joins the cached history. Two variants: a user
rewrites turn 2 (a branch: S + U1 + A1 + U2', the common ancestor still hits) and a new user who
shares only the system prompt (S + U1'').

`chat_sessions` builds many users for the closed-loop driver (`sim.sessions.run_sessions`);
`sim.chat_trace.trace_chat` replays one conversation through the real Scheduler, turn by turn.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from radixflow.workloads.sessions import CallSpec, Session
from radixflow.workloads.trace import segment_tokens

VARIANTS = ("rewrite-turn2", "new-user")


@dataclass(frozen=True)
class ChatSpec:
    system_len: int = 200
    user_len: int = 80
    assistant_len: int = 150
    turns: int = 5
    users: int = 1  # conversations (for the simulator); they share the system prompt
    think_time: float = 5.0  # mean seconds between an answer and the next user turn (exponential)
    rewrite_fraction: float = 0.0  # share of users who also go back and rewrite turn 2
    seed: int = 0

    def __post_init__(self) -> None:
        if self.turns < 1 or self.users < 1:
            raise ValueError("multi-turn workload: --turns and --users must be >= 1")
        if self.user_len < 1 or self.assistant_len < 1 or self.system_len < 0:
            raise ValueError("multi-turn workload: user and assistant lengths must be >= 1, system >= 0")
        if not 0 <= self.rewrite_fraction <= 1:
            raise ValueError(f"--rewrite-fraction must be in [0, 1], got {self.rewrite_fraction}")


@dataclass(frozen=True)
class Turn:
    label: str
    request: tuple[int, ...]
    answer: tuple[int, ...]


def _seg(name: str, n: int) -> list[int]:
    return list(segment_tokens(f"chat:{name}", n))


def conversation(spec: ChatSpec, user: int = 0, variants: tuple[str, ...] = ()) -> list[Turn]:
    """The turns of one user's conversation, then the requested variants (run after it)."""
    for v in variants:
        if v not in VARIANTS:
            raise ValueError(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
    system = _seg("system", spec.system_len)
    history = list(system)
    turns = []
    for t in range(1, spec.turns + 1):
        request = history + _seg(f"u{user}:user{t}", spec.user_len)
        answer = _seg(f"u{user}:assistant{t}", spec.assistant_len)
        turns.append(Turn(f"turn {t}", tuple(request), tuple(answer)))
        history = request + answer
    for v in variants:
        if v == "rewrite-turn2":
            if spec.turns < 2:
                raise ValueError("the rewrite-turn2 variant needs --turns >= 2")
            base = list(turns[0].request + turns[0].answer)
            req = base + _seg(f"u{user}:user2-rewritten", spec.user_len)
            turns.append(Turn("rewrite turn 2", tuple(req), tuple(_seg(f"u{user}:assistant2-rewritten",
                                                                         spec.assistant_len))))
        else:
            req = system + _seg(f"u{user}:new-user:user1", spec.user_len)
            turns.append(Turn("new user", tuple(req), tuple(_seg(f"u{user}:new-user:assistant1",
                                                                   spec.assistant_len))))
    return turns


def chat_sessions(spec: ChatSpec) -> list[Session]:
    """Users for the closed-loop simulator; a rewriting user adds a session forked after turn 1."""
    rng = random.Random(spec.seed)
    out = []
    for u in range(spec.users):
        turns = conversation(spec, u)
        toks = list(turns[-1].request + turns[-1].answer)
        calls = [CallSpec(len(t.request), spec.assistant_len,
                          rng.uniform(0, spec.think_time) if i == 0 else rng.expovariate(1 / spec.think_time))
                 for i, t in enumerate(turns)]
        out.append(Session(f"user{u}", "chat", tuple(toks), calls, spec.system_len))
        if spec.turns >= 2 and rng.random() < spec.rewrite_fraction:
            fork = conversation(spec, u, ("rewrite-turn2",))[-1]
            # The rewrite comes after the user has seen the whole conversation, on average.
            delay = sum(c.delay for c in calls) + spec.turns * spec.think_time
            out.append(Session(f"user{u}-rewrite", "chat", fork.request + fork.answer,
                               [CallSpec(len(fork.request), spec.assistant_len, delay)], spec.system_len))
    return out
