"""Shared test driver for a real Engine."""

from __future__ import annotations

from radixflow.engine.engine import Engine


def drain(eng: Engine) -> list:
    """Steps `eng` until nothing is unfinished, checking integrity after every round; returns the batches."""
    rounds = []
    while eng.has_unfinished:
        batch, _ = eng.step()
        if not batch:
            eng.now = max(eng.now, eng.idle_until() or eng.now)
            continue
        eng.scheduler.check_integrity()
        rounds.append(batch)
    return rounds
