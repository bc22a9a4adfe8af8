"""Scheduling policies chosen by name: traversal rules, admission rules and the six arms (SPEC §5–8)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from radixflow.core.batch import Outcome
from radixflow.core.branch import Branch


# ----------------------------------------------------------------------------- traversal
class Traversal(Protocol):
    name: str

    def continue_after_blocked(self) -> bool: ...


@dataclass(frozen=True)
class PrefixStop:
    """vLLM's native rule: the first non-Ready branch ends the waiting scan."""

    name: str = "prefix-stop"

    def continue_after_blocked(self) -> bool:
        return False


@dataclass(frozen=True)
class StateReady:
    """RadixFlow: a Blocked branch goes to D_t and the scan goes on; Other still stops it."""

    name: str = "state-ready"

    def continue_after_blocked(self) -> bool:
        return True


# ----------------------------------------------------------------------------- admission
@dataclass
class AdmissionView:
    """What admission may look at: the worker's state and the current cache (no clock inside)."""

    has_running: bool
    max_rows: int
    max_tokens: int
    demand: Callable[[Branch], int]  # remaining prefill tokens against the current published cache


class Admission(Protocol):
    name: str

    def release(self, held: list[Branch], now: float, view: AdmissionView) -> tuple[int, float | None]:
        """How many of `held` (oldest first) to admit now, and when to ask again if some stay held."""
        ...


@dataclass(frozen=True)
class Immediate:
    name: str = "immediate"

    def release(self, held, now, view):
        return len(held), None


@dataclass(frozen=True)
class Timer:
    """Bounded dynamic batching: hold arrivals until `delay` after the first held one."""

    delay: float
    name: str = "timer"

    def release(self, held, now, view):
        deadline = held[0].arrival + self.delay
        return (len(held), None) if now >= deadline - 1e-12 else (0, deadline)


@dataclass(frozen=True)
class Flexible:
    """RadixFlow admission: a 5 ms deadline, released early by running work, full rows or full tokens."""

    delay: float = 0.005
    name: str = "flexible"

    def release(self, held, now, view):
        deadline = held[0].arrival + self.delay
        if now >= deadline - 1e-12 or view.has_running or len(held) >= view.max_rows:
            return len(held), None
        demand = 0
        for b in held:
            demand += view.demand(b)
            if demand >= view.max_tokens:
                return len(held), None
        return 0, deadline


# ----------------------------------------------------------------------------- arms
@dataclass(frozen=True)
class Arm:
    name: str
    admission: Admission
    traversal: Traversal
    frag: bool = False


ARMS: dict[str, Arm] = {
    "radix": Arm("radix", Immediate(), PrefixStop()),
    "radix+timer5": Arm("radix+timer5", Timer(0.005), PrefixStop()),
    "radix+timer10": Arm("radix+timer10", Timer(0.010), PrefixStop()),
    "radix+flex": Arm("radix+flex", Flexible(), PrefixStop()),
    "radixflow": Arm("radixflow", Flexible(), StateReady()),
    "radixflow+frag": Arm("radixflow+frag", Flexible(), StateReady(), frag=True),
}


def get_arm(name: str) -> Arm:
    arm = ARMS.get(name.strip().lower())
    if arm is None:
        raise ValueError(f"unknown policy {name!r}; choose from: {', '.join(ARMS)}")
    return arm


def parse_arms(spec: str) -> list[Arm]:
    """'all' or a comma list of arm names."""
    if spec.strip().lower() == "all":
        return list(ARMS.values())
    names = [s for s in (x.strip() for x in spec.split(",")) if s]
    if not names:
        raise ValueError("empty policy list")
    return [get_arm(n) for n in names]


__all__ = ["ARMS", "Arm", "AdmissionView", "Flexible", "Immediate", "Outcome", "PrefixStop", "StateReady",
           "Timer", "get_arm", "parse_arms"]
