"""The eviction policies by name (`--eviction`): a fresh policy from its name and argument."""

from __future__ import annotations

from radixflow.cache.eviction.adaptive import Adaptive
from radixflow.cache.eviction.flops import FlopAware
from radixflow.cache.eviction.lru import LRU
from radixflow.cache.eviction.tails import LevelTail, RoundRobinTail
from radixflow.cache.eviction.view import EvictionPolicy

EVICTION_POLICIES: dict[str, type] = {"lru": LRU, "rr-tail": RoundRobinTail, "level-tail": LevelTail,
                                      "flop-aware": FlopAware, "adaptive": Adaptive}


def get_eviction(spec: str) -> EvictionPolicy:
    """A fresh policy from its name; `rr-tail:N` sets the chunk to N pages."""
    name, _, arg = spec.strip().lower().partition(":")
    cls = EVICTION_POLICIES.get(name)
    if cls is None:
        raise ValueError(f"unknown eviction policy {spec!r}; choose from: {', '.join(EVICTION_POLICIES)} "
                         f"(rr-tail:N and level-tail:N set the chunk to N pages)")
    if not arg:
        return cls()
    if cls is FlopAware:
        try:
            return FlopAware(recency_weight=float(arg))
        except ValueError as e:
            raise ValueError(f"bad eviction policy {spec!r}: flop-aware:W takes a recency weight in [0, 1] "
                             f"({e})") from None
    if not issubclass(cls, RoundRobinTail) or not arg.isdigit():
        raise ValueError(f"bad eviction policy {spec!r}: only the tail policies take a chunk size, "
                         f"as rr-tail:N pages")
    return cls(chunk_pages=int(arg))


def parse_evictions(spec: str) -> list[str]:
    """A comma list of policy names, each checked."""
    names = [s for s in (x.strip() for x in spec.split(",")) if s]
    if not names:
        raise ValueError("empty eviction policy list")
    for n in names:
        get_eviction(n)
    return names
