"""Helpers for the SGLang backend tests: load SGLang (or skip / fail), and seeded request traces."""

from __future__ import annotations

import os
import random

import pytest

from radixflow.integrations.sglang.compat import SUPPORTED_SGLANG_VERSION


def load_twins():
    """The twins module (SGLang's real cache + ours); without a usable SGLang: skip, or fail when
    RADIXFLOW_REQUIRE_SGLANG=1 (scripts/test.sh sets it after installing SGLang)."""
    try:
        from radixflow.integrations.sglang import compat

        compat.require_supported_sglang()
        from radixflow.integrations.sglang import twins
    except ImportError as exc:
        reason = f"SGLang {SUPPORTED_SGLANG_VERSION} is not importable here ({exc}); run scripts/install_sglang.sh"
        if os.environ.get("RADIXFLOW_REQUIRE_SGLANG") == "1":
            pytest.fail(f"RADIXFLOW_REQUIRE_SGLANG=1 but {reason}", pytrace=False)
        pytest.skip(reason, allow_module_level=True)
    return twins


def histories(rng: random.Random, n: int, page: int, shared_pages: int = 8) -> dict[int, list[int]]:
    """n histories behind one shared system prompt, each with a private first part."""
    system = [7] * (shared_pages * page)
    return {h: system + [1000 * (h + 1) + i for i in range(page * rng.randint(4, 16))] for h in range(n)}


def replay(twins_pair, seed: int, page: int, n: int = 8, steps: int = 40, check=None):
    """One seeded trace through every twin: each step a history returns (match, lock, allocate,
    evicting if short), grows by 1-6 pages and is inserted. Yields (step, [kept lengths per twin])."""
    rng = random.Random(seed)
    hist = histories(rng, n, page)
    for step in range(steps):
        h = rng.randrange(n)
        toks = hist[h]
        add = [1000 * (h + 1) + len(toks) + i for i in range(page * rng.randint(1, 6))]
        states = [t.start(toks, len(add)) for t in twins_pair]
        hits = [s["hit"] for s in states]
        hist[h] = toks + add
        for t, s in zip(twins_pair, states):
            t.finish(s, hist[h])
            if check is not None:
                check(t)
        yield step, hits, [[t.kept(hist[x]) for x in range(n)] for t in twins_pair]
