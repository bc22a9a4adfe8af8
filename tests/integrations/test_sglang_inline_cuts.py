"""The batched calls' inline cut (`TreeEdits._cut_tail`, integrations/sglang/tree.py) removes the
victims `cache/eviction.cut_to` gives: the same evict calls, freeing the same tokens and leaving the
same tree, with the inline walk on and off (issue #42: a speed-critical inline form only with a test
that it decides as the plain one)."""

from __future__ import annotations

import pytest
from sglang_factories import load_twins, replay

twins = load_twins()

from radixflow.integrations.sglang import adaptive  # noqa: E402
from radixflow.integrations.sglang.tree import TreeEdits  # noqa: E402

FULL = twins.FULL


class Recording(twins.SGLangTwin):
    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.record: list = []

    def evict(self, n: int) -> int:
        got = super().evict(n)
        self.record.append((n, got, self.cache.evictable_size()))
        return got


def _run(backend: str, page: int, seed: int) -> tuple[list, list]:
    sg = Recording(backend, 96 * page, page)
    ours = twins.IndexTwin("lru", 96 * page, page)  # only to reuse the driver
    steps = replay((sg, ours), seed, page, steps=50, check=lambda t: t.check() if t is sg else None)
    kept = [k[0] for _, _, k in steps]
    assert sg.cache.components[FULL].victims > 0
    return sg.record, kept


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("page", [1, 4])
@pytest.mark.parametrize("backend", ["radixflow-rr-tail", "radixflow-level-tail", "radixflow-adaptive"])
def test_inline_cut_removes_what_cut_to_gives(backend, page, seed, monkeypatch):
    monkeypatch.setenv("RADIXFLOW_SGLANG_CHUNK_TOKENS", str(4 * page))
    with adaptive.forced(0.5):  # the adaptive's tail rule on every call (its cuts are the batched ones)
        inline = _run(backend, page, seed)
        monkeypatch.setattr(TreeEdits, "INLINE_CUTS", False)
        plain = _run(backend, page, seed)
    assert len(inline[0]) > 3
    assert inline == plain
