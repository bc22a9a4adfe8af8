"""Agentic sessions (SPEC §10, RR-Evict): n agents sharing a system prompt, each call appending a tool
result to its own history. Generates sessions only; `sim.sessions` runs them closed-loop.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from radixflow.workloads.sessions import CallSpec, Session
from radixflow.workloads.trace import segment_tokens

TOOL_LATENCIES = ("exp", "fixed", "uniform", "lognormal")


@dataclass(frozen=True)
class AgenticSpec:
    """n agents sharing a system prompt; each call appends a tool result and generates an answer."""

    n_agents: int = 32
    idle_fraction: float = 0.75  # s: share of its time an agent waits on tools (n_a ≈ (1 − s)·n)
    calls: int = 12  # calls per agent
    system_len: int = 256  # shared system prompt
    context_len: int = 2048  # agent-private history before its first call (task, files)
    append_len: int = 64  # tokens appended per call (tool result + instruction)
    output_len: int = 16  # tokens generated per call; they join the history
    tool_latency: str = "exp"  # exp | fixed | uniform | lognormal
    tool_latency_mean: float | None = None  # seconds; None: call_time · s / (1 − s)
    call_time: float = 1.0  # one call's service time estimate, used when tool_latency_mean is None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_agents < 1 or self.calls < 1:
            raise ValueError("agentic workload: --agents and --calls must be >= 1")
        if not 0 <= self.idle_fraction < 1:
            raise ValueError(f"--idle-fraction must be in [0, 1), got {self.idle_fraction}")
        if self.tool_latency not in TOOL_LATENCIES:
            raise ValueError(f"unknown tool latency {self.tool_latency!r}; "
                             f"choose from {', '.join(TOOL_LATENCIES)}")
        if self.output_len < 1 or self.append_len < 1 or self.system_len < 0 or self.context_len < 0:
            raise ValueError("agentic workload: lengths must be >= 0 (append and output >= 1)")

    @property
    def active_fraction(self) -> float:
        return 1.0 - self.idle_fraction

    @property
    def mean_tool_latency(self) -> float:
        if self.tool_latency_mean is not None:
            return self.tool_latency_mean
        return self.call_time * self.idle_fraction / max(1e-9, 1.0 - self.idle_fraction)


def sample_latency(kind: str, mean: float, rng: random.Random) -> float:
    if kind == "exp":
        return rng.expovariate(1.0 / mean) if mean > 0 else 0.0
    if kind == "fixed":
        return mean
    if kind == "uniform":
        return rng.uniform(0.5 * mean, 1.5 * mean)
    sigma = 0.75  # lognormal with this shape and the given mean
    return rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma) if mean > 0 else 0.0


def agentic_sessions(spec: AgenticSpec) -> list[Session]:
    rng = random.Random(spec.seed)
    mean = spec.mean_tool_latency
    system = segment_tokens("agentic:system", spec.system_len)
    out = []
    for a in range(spec.n_agents):
        tag = f"agentic:{spec.seed}:a{a}"
        toks = list(system) + list(segment_tokens(f"{tag}:ctx", spec.context_len))
        calls = []
        for c in range(spec.calls):
            toks += segment_tokens(f"{tag}:c{c}:in", spec.append_len)
            # First calls are spread over one whole cycle so the run starts close to steady state.
            if c == 0:
                delay = rng.uniform(0, mean + spec.call_time)
            else:
                delay = sample_latency(spec.tool_latency, mean, rng)
            calls.append(CallSpec(len(toks), spec.output_len, delay))
            toks += segment_tokens(f"{tag}:c{c}:out", spec.output_len)
        out.append(Session(f"agent{a}", "agentic", tuple(toks), calls, spec.system_len))
    return out
