"""The RADIXFLOW_SGLANG_* settings of the SGLang backends, read in this one place, once per cache
(`Settings.read`, when a component is built; docs/sglang.md lists them)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from radixflow.cache.eviction import FlopAware, LevelTail, RoundRobinTail

DEFAULT_CHUNK_TOKENS = 64  # rr-tail / level-tail chunk, in tokens (our simulator: 4 pages of 16)
DEFAULT_CUTS_PER_CALL = 2  # rr-tail / level-tail: an evict call's demand in at most about this many cuts
DEFAULT_CUT_AHEAD = 1.5  # rr-tail / level-tail: an evict call frees this multiple of its demand


@dataclass(frozen=True)
class Settings:
    """One cache's settings."""

    chunk_tokens: int
    recency_weight: float
    flop_order: str
    cut_ahead: float
    cuts_per_call: int
    cold_order: str

    @classmethod
    def read(cls) -> Settings:
        return cls(chunk_tokens(), recency_weight(), flop_order(), cut_ahead_factor(), cuts_per_call(),
                   cold_order())


def chunk_tokens() -> int:
    """RADIXFLOW_SGLANG_CHUNK_TOKENS: rr-tail's and level-tail's chunk, in tokens."""
    try:
        return int(os.environ.get("RADIXFLOW_SGLANG_CHUNK_TOKENS", DEFAULT_CHUNK_TOKENS))
    except ValueError:
        raise ValueError("RADIXFLOW_SGLANG_CHUNK_TOKENS must be a number of tokens") from None


def recency_weight() -> float:
    """RADIXFLOW_SGLANG_RECENCY_WEIGHT: flop-aware's recency weight (default 0.5)."""
    raw = os.environ.get("RADIXFLOW_SGLANG_RECENCY_WEIGHT", "0.5")
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"RADIXFLOW_SGLANG_RECENCY_WEIGHT must be a weight in [0, 1], got {raw!r}") from None


def make_policy(kind: str, page_size: int, settings: Settings | None = None):
    """A fresh policy for one cache, with its settings (`chunk_tokens`, `recency_weight`). `adaptive`
    has no walk of cache/eviction (its component, adaptive.DuelFullComponent, chooses): None."""
    if kind == "adaptive":
        return None
    s = settings or Settings.read()
    if kind == "flop-aware":
        return FlopAware(recency_weight=s.recency_weight)
    pages = max(1, s.chunk_tokens // page_size)
    return (LevelTail if kind == "level-tail" else RoundRobinTail)(chunk_pages=pages)


def flop_order() -> str:
    """RADIXFLOW_SGLANG_FLOP_ORDER: `kept` (default; FULL-only device trees: flop-aware's order kept
    across calls as a GreedyDual heap, `GreedyDual`) or `ranked` (every leaf ranked per call, our
    `RadixIndex`'s walk, `cache/eviction.FlopAware`; Mamba and SWA trees always rank)."""
    raw = os.environ.get("RADIXFLOW_SGLANG_FLOP_ORDER", "kept")
    if raw not in ("kept", "ranked"):
        raise ValueError(f"RADIXFLOW_SGLANG_FLOP_ORDER must be kept or ranked, got {raw!r}")
    return raw


def cut_ahead_factor() -> float:
    """RADIXFLOW_SGLANG_CUT_AHEAD (default 1.5; 1: off): rr-tail / level-tail, and the adaptive's tail
    calls, free this multiple of what an evict call asks for, so fewer calls come (it moves cuts
    earlier; docs/eviction.md, "Cost")."""
    raw = os.environ.get("RADIXFLOW_SGLANG_CUT_AHEAD", str(DEFAULT_CUT_AHEAD))
    try:
        f = float(raw)
    except ValueError:
        f = 0.0
    if not f >= 1.0:
        raise ValueError(f"RADIXFLOW_SGLANG_CUT_AHEAD must be a factor >= 1, got {raw!r}")
    return f


def cuts_per_call() -> int:
    """RADIXFLOW_SGLANG_CUTS_PER_CALL (default 2; 0: off): rr-tail / level-tail cut an evict call's
    demand in chunks of max(chunk, demand / this), and the adaptive's tail calls cut each cold history
    at least demand / this down (`cache/eviction/duel.cut_target`), so one call makes about this many cuts however
    much it asks for (docs/eviction.md, "Cost")."""
    raw = os.environ.get("RADIXFLOW_SGLANG_CUTS_PER_CALL", str(DEFAULT_CUTS_PER_CALL))
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"RADIXFLOW_SGLANG_CUTS_PER_CALL must be a count >= 0 (0: off), got {raw!r}")
    return n


def cold_order() -> str:
    """RADIXFLOW_SGLANG_COLD_ORDER: `kept` (default; FULL-only device trees: the tail rule's cold
    leaves kept across calls, `ColdOrder`) or `sorted` (every evictable leaf sorted by recency per
    pass, the walk it replaces; the same decisions)."""
    raw = os.environ.get("RADIXFLOW_SGLANG_COLD_ORDER", "kept")
    if raw not in ("kept", "sorted"):
        raise ValueError(f"RADIXFLOW_SGLANG_COLD_ORDER must be kept or sorted, got {raw!r}")
    return raw
