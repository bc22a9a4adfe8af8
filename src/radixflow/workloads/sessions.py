"""Session workloads: transcripts that grow call by call (agentic sessions, multi-turn chat).

A session's call prompts are prefixes of its transcript; each call's answer is the next tokens of it,
so the whole conversation is known in advance. Generators (`workloads.agentic`, `workloads.multiturn`)
make sessions; the closed-loop driver that runs them is `sim.sessions.run_sessions`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CallSpec:
    prompt_end: int  # the call's prompt is session.tokens[:prompt_end]
    output_len: int  # its answer is the next output_len tokens of the transcript
    delay: float  # seconds from the previous call's end (from t=0 for the first call) to its arrival


@dataclass
class Session:
    sid: str
    namespace: str
    tokens: tuple[int, ...]
    calls: list[CallSpec]
    shared_len: int = 0  # leading tokens shared with other sessions (the system prompt)


def full_prefix_unit(sessions: list[Session]) -> tuple[float, int]:
    """(mean private history of a call: prompt + answer − shared prefix, shared prefix length)."""
    shared = max((s.shared_len for s in sessions), default=0)
    lens = [c.prompt_end + c.output_len - s.shared_len for s in sessions for c in s.calls]
    return (sum(lens) / len(lens) if lens else 0.0), shared
