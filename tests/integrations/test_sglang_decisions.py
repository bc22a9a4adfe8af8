"""The radixflow SGLang backends' eviction decisions, pinned: a digest, per seeded config, of what every
`cache.evict` call asked for, what it freed, and the tree it left (every leaf's token path from the
root). It names tokens, never nodes, so a change of how a cut is made (a split and a delete, or a
leaf shortened in place) keeps it, and a change of which tokens a call frees does not.

The digests were taken before the cost work (in-place cuts, incremental rotation and level order) and
kept through it; rr-tail's and level-tail's on FULL-only trees moved once, on purpose, when their
calls were batched (issue #30: an evict call frees 1.5x its demand in about two cuts, backend.py
`cuts_per_call`, `cut_ahead_factor`); their Mamba traces and flop-aware's did not move. The unbatched
walk is still our index's, call for call (test_sglang_backend.py, batching off). A change that moves
a digest must say why in its commit. flop-aware's on FULL-only trees moved once, on purpose, when its
order was kept across calls (a GreedyDual heap, backend.py `GreedyDual`; issue #30: a call no longer
ranks every leaf): its whole-ranking walk, still our index's, keeps the digests it had
(`RADIXFLOW_SGLANG_FLOP_ORDER=ranked`, `PINNED_RANKED`). SGLang venv (scripts/test.sh)."""

from __future__ import annotations

import hashlib

import pytest
from sglang_factories import load_twins, replay

from factories import KeptOrderView

twins = load_twins()

from radixflow.integrations.sglang import sweep  # noqa: E402
from radixflow.workloads.agentic import AgenticSpec, agentic_sessions  # noqa: E402

FULL, MAMBA = twins.FULL, twins.MAMBA


def leaf_paths(cache) -> list[tuple]:
    """Every leaf's token path from the root (nodes holding device KV only), sorted."""
    root = cache.tree_core.root_node
    out, stack = [], [(root, ())]
    while stack:
        node, path = stack.pop()
        kids = [c for c in node.children.values() if c.component_data[FULL].value is not None]
        if not kids and node is not root:
            out.append(path)
        for c in kids:
            stack.append((c, path + tuple(c.key.token_ids)))
    return sorted(out)


class RecordingTwin(twins.SGLangTwin):
    """An SGLangTwin that records (asked, freed, leaf paths after) for every evict call."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.record: list = []

    def evict(self, n: int) -> int:
        got = super().evict(n)
        self.record.append((n, got, leaf_paths(self.cache)))
        return got


def digest(record) -> str:
    return hashlib.sha256(repr(record).encode()).hexdigest()[:16]


def trace_digest(backend: str, components, page: int, seed: int) -> tuple[str, int]:
    cap = 128 * page
    sg = RecordingTwin(backend, cap, page, components, max_reqs=256, mamba_slots=256)
    ours = twins.IndexTwin("lru", cap, page, hybrid=MAMBA in components)  # only to reuse the driver
    for _ in replay((sg, ours), seed, page, steps=60, check=lambda t: t.check() if t is sg else None):
        pass
    return digest(sg.record), len(sg.record)


def agentic_config(page: int) -> dict:
    """16 agents, a quarter active, a pool inside n_a < m < n (the sweep's shape, smaller)."""
    sessions = agentic_sessions(AgenticSpec(n_agents=16, idle_fraction=0.75, calls=8, system_len=256,
                                            context_len=512, append_len=32, output_len=8, seed=7))
    return sweep._pooled("agentic n=16 s=0.75", sessions, page, (8.0,), 4.0, 16)[0]


def sweep_digest(backend: str, page: int) -> tuple[str, int]:
    cfg = agentic_config(page)
    sg = RecordingTwin(backend, cfg["capacity"], cfg["page"], small_kv=True)
    sweep.replay(sg, cfg["sessions"], 1.0)
    return digest(sg.record), len(sg.record)


BACKENDS = ("radixflow-rr-tail", "radixflow-level-tail", "radixflow-flop-aware")
TRACES = {"full-ps4": ((FULL,), 4), "full-ps1": ((FULL,), 1), "mamba-ps1": ((FULL, MAMBA), 1)}

# (backend, trace, seed) and (backend, page) -> (digest, evict calls); see the docstring for when they moved.
PINNED = {
    ("radixflow-rr-tail", "full-ps4", 0): ("39a376ada2a09b4c", 37),
    ("radixflow-rr-tail", "full-ps4", 1): ("ab87adc93ea94580", 35),
    ("radixflow-rr-tail", "full-ps4", 2): ("d61005d4e33cd3cf", 31),
    ("radixflow-rr-tail", "full-ps1", 0): ("a482f9324e17a7b7", 35),
    ("radixflow-rr-tail", "full-ps1", 1): ("1a6762424c23cb7d", 31),
    ("radixflow-rr-tail", "full-ps1", 2): ("36078084e5810821", 24),
    ("radixflow-rr-tail", "mamba-ps1", 0): ("3f74fe2ffac857a0", 25),
    ("radixflow-rr-tail", "mamba-ps1", 1): ("24ecc47bfbcdde7b", 26),
    ("radixflow-rr-tail", "mamba-ps1", 2): ("1c984a5cacef4f17", 17),
    ("radixflow-level-tail", "full-ps4", 0): ("329644a80d18e9c4", 38),
    ("radixflow-level-tail", "full-ps4", 1): ("ce20abc32df8ad41", 29),
    ("radixflow-level-tail", "full-ps4", 2): ("473fe86b6d99e990", 29),
    ("radixflow-level-tail", "full-ps1", 0): ("7fa8f61d71bdefde", 33),
    ("radixflow-level-tail", "full-ps1", 1): ("b580529ec4c92cd6", 25),
    ("radixflow-level-tail", "full-ps1", 2): ("feb96d2e41fc3215", 25),
    ("radixflow-level-tail", "mamba-ps1", 0): ("1a8dc426dcdaf8df", 30),
    ("radixflow-level-tail", "mamba-ps1", 1): ("6d16469df50ba6e0", 23),
    ("radixflow-level-tail", "mamba-ps1", 2): ("d414f343e416b65f", 17),
    ("radixflow-flop-aware", "full-ps4", 0): ("5b9b6d44c0c329a7", 33),
    ("radixflow-flop-aware", "full-ps4", 1): ("6ed4794efa82ce69", 32),
    ("radixflow-flop-aware", "full-ps4", 2): ("69fbf38eabbf8ff3", 18),
    ("radixflow-flop-aware", "full-ps1", 0): ("13b3581ffaad974b", 33),
    ("radixflow-flop-aware", "full-ps1", 1): ("e80f9bc9bc10a6d8", 32),
    ("radixflow-flop-aware", "full-ps1", 2): ("74e928d24f005d16", 18),
    ("radixflow-flop-aware", "mamba-ps1", 0): ("99949d9b4f8c6849", 31),
    ("radixflow-flop-aware", "mamba-ps1", 1): ("32d576d56fe64532", 27),
    ("radixflow-flop-aware", "mamba-ps1", 2): ("b8e0b97a47eefda6", 22),
}
PINNED_SWEEP = {
    ("radixflow-rr-tail", 16): ("0c7ceeb94d8b9076", 54),
    ("radixflow-rr-tail", 1): ("b235daa78349cdaf", 57),
    ("radixflow-level-tail", 16): ("489a3b989025ff07", 63),
    ("radixflow-level-tail", 1): ("5c57a39721901e97", 69),
    ("radixflow-flop-aware", 16): ("24f684c423ad62cc", 18),
    ("radixflow-flop-aware", 1): ("b00221e376320d7f", 19),
}


# flop-aware's whole-ranking walk (our index's; RADIXFLOW_SGLANG_FLOP_ORDER=ranked): its digests before its
# order was kept, unchanged.
PINNED_RANKED = {
    ("radixflow-flop-aware", "full-ps4", 0): ("434ab049ac19ae7b", 35),
    ("radixflow-flop-aware", "full-ps4", 1): ("89f6250c53107545", 32),
    ("radixflow-flop-aware", "full-ps4", 2): ("e30b69f27cceafdf", 25),
    ("radixflow-flop-aware", "full-ps1", 0): ("a112e3ab8386c94d", 35),
    ("radixflow-flop-aware", "full-ps1", 1): ("875b072d9b673bde", 32),
    ("radixflow-flop-aware", "full-ps1", 2): ("728cfba60935869b", 25),
    ("radixflow-flop-aware", 16): ("d54d93646340a4ff", 26),
    ("radixflow-flop-aware", 1): ("1cd18face323f475", 24),
}


@pytest.fixture(autouse=True)
def _chunk(monkeypatch):
    monkeypatch.setenv("RADIXFLOW_SGLANG_CHUNK_TOKENS", "16")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("trace", TRACES)
@pytest.mark.parametrize("seed", range(3))
def test_trace_decisions_are_pinned(backend, trace, seed):
    components, page = TRACES[trace]
    got = trace_digest(backend, components, page, seed)
    assert got[1] > 3, "the trace never put the cache under pressure"
    assert got == PINNED[(backend, trace, seed)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page", (16, 1))
def test_agentic_decisions_are_pinned(backend, page, monkeypatch):
    monkeypatch.setenv("RADIXFLOW_SGLANG_CHUNK_TOKENS", "64")
    got = sweep_digest(backend, page)
    assert got[1] > 3
    assert got == PINNED_SWEEP[(backend, page)]


@pytest.mark.parametrize("case", list(PINNED_RANKED))
def test_flop_aware_ranked_walk_keeps_its_digests(case, monkeypatch):
    """`RADIXFLOW_SGLANG_FLOP_ORDER=ranked`: every leaf ranked per call (our index's walk), the
    decisions pinned before the kept order came."""
    monkeypatch.setenv("RADIXFLOW_SGLANG_FLOP_ORDER", "ranked")
    if len(case) == 3:
        got = trace_digest(case[0], *TRACES[case[1]], case[2])
    else:
        monkeypatch.setenv("RADIXFLOW_SGLANG_CHUNK_TOKENS", "64")
        got = sweep_digest(*case)
    assert got == PINNED_RANKED[case]


if __name__ == "__main__":  # prints the table to pin (run before a change, never to paper over one)
    import os

    os.environ["RADIXFLOW_SGLANG_CHUNK_TOKENS"] = "16"
    for b in BACKENDS:
        for t, (comps, pg) in TRACES.items():
            for s in range(3):
                print(f"    ({b!r}, {t!r}, {s}): {trace_digest(b, comps, pg, s)},")
    os.environ["RADIXFLOW_SGLANG_CHUNK_TOKENS"] = "64"
    for b in BACKENDS:
        for pg in (16, 1):
            print(f"    ({b!r}, {pg}): {sweep_digest(b, pg)},")


# ----------------------------------------------------------------------------- kept orders, in-place cuts
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from radixflow.cache.eviction import DeepestFirst, Rotation  # noqa: E402
from radixflow.integrations.sglang.backend import SGLangTreeView  # noqa: E402

OPS = st.lists(st.tuples(st.sampled_from(["grow", "grow", "hold", "release", "evict"]), st.integers(0, 5),
                         st.integers(1, 6)), min_size=16, max_size=40)

def _ops_steps(sg, ops, page, split: bool = True, probe: bool = True, step=None) -> tuple[dict, dict]:
    """The random requests of the kept-order tests (grow, hold, release, evict) on one twin, SGLang's
    sanity check and then `step()` after each; returns (histories, requests still held). `split`: some
    requests take a prefix of their history (a split); `probe`: a release probes another history (a
    match without a request: SGLang's counter moves on an idle leaf)."""
    hist = {h: [7] * (2 * page) + [1000 * (h + 1) + i for i in range(page * (1 + h % 3))] for h in range(6)}
    held = {}
    for op, h, n in ops:
        # a history grows to 28 pages at most: two held and one growing request then fit the tests'
        # 96-page pools whatever the eviction (a longer one can lock more than the pool holds)
        if op == "grow" and h not in held and len(hist[h]) + n * page <= 28 * page:
            toks = hist[h]
            state = sg.start(toks[: len(toks) - page * (n % 2)] if split else toks, n * page)
            hist[h] = toks + [1000 * (h + 1) + len(toks) + i for i in range(n * page)]
            sg.finish(state, hist[h])
        elif op == "hold" and h not in held and len(held) < 2:
            held[h] = sg.start(hist[h], page)
        elif op == "release" and held:
            k = sorted(held)[h % len(held)]
            sg.finish(held.pop(k), hist[k])
            if probe:
                sg.kept(hist[(k + n) % 6])
        elif op == "evict":
            sg.evict(n * page)
        sg.check()
        if step is not None:
            step()
    return hist, held


def _ops_end(sg, hist: dict, held: dict) -> None:
    """Finishes the held requests and evicts everything; SGLang's sanity check holds after."""
    for k, state in held.items():
        sg.finish(state, hist[k])
    sg.evict(10**6)
    sg.check()


def _ops_run(sg, ops, page) -> None:
    _ops_end(sg, *_ops_steps(sg, ops, page))


def _whole_walk_orders(comp, view):
    """What the whole-tree walks would pick now: rr-tail's lap (`_ring`) and level-tail's deepest."""
    ring = [leaf for _, leaf in comp.policy._ring(view, comp.policy._page_cursor)
            if view.is_leaf(leaf) and view.evictable(leaf)]
    leaves = view.leaves()
    deepest = None
    if leaves:
        d = max(view.depth(n) for n in leaves)
        tied = [n for n in leaves if view.depth(n) == d]
        deepest = tied[0] if len(tied) == 1 else max(tied, key=view.trajectory_key)
    return ring, deepest


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, page=st.sampled_from([1, 4]), backend=st.sampled_from(["radixflow-rr-tail", "radixflow-level-tail"]))
def test_kept_orders_equal_whole_tree_walks_and_cuts_keep_integrity(ops, page, backend):
    """Random requests (6 histories behind a shared prompt: grow = a request that returns and grows,
    hold / release = a request kept running across later steps, evict = SGLang's evict). After every
    step the kept orders, fed only by the backend's change feed, give rr-tail's next lap and
    level-tail's next pick exactly as a walk over the whole tree does (with trajectory keys and
    depths computed afresh, not read from the component's memos, which must equal them); SGLang's
    sanity check and the pool ledger hold after every in-place cut."""
    import os

    os.environ["RADIXFLOW_SGLANG_CHUNK_TOKENS"] = str(4 * page)
    sg = twins.SGLangTwin(backend, 96 * page, page)
    comp = sg.cache.components[FULL]
    pol = comp.policy

    def step():
        view = SGLangTreeView(comp, depths=comp._depths, keys=comp._keys)
        changes = view.changes()  # what the next evict call would enter first
        fresh = SGLangTreeView(comp)  # no memos: keys and depths walked up the tree now
        ring, deepest = _whole_walk_orders(comp, fresh)
        for leaf in fresh.leaves():
            assert view.trajectory_key(leaf) == fresh.trajectory_key(leaf)
            assert view.depth(leaf) == fresh.depth(leaf)
        if backend == "radixflow-rr-tail":
            if pol._rotation is None:
                pol._rotation = Rotation()
            pol._rotation.enter(view, changes, pol._page_cursor)
            assert [leaf for _, leaf in pol._rotation.order(view)] == ring
        else:
            if pol._deepest is None:
                pol._deepest = DeepestFirst()
            pol._deepest.enter(view, changes)
            assert pol._deepest.deepest(view) is deepest

    _ops_end(sg, *_ops_steps(sg, ops, page, split=False, probe=False, step=step))
    assert sg.cache.evictable_size() == 0


def _whole_tree_greedy_order(comp, view):
    """What flop-aware's kept order must give now, from every evictable leaf computed afresh: (value
    > 0, level at its last access + k * FLOPs per byte, last access, leaf order), lowest first."""
    greedy = comp._greedy
    keyed = []
    for leaf in view.leaves():
        if not view.evictable(leaf):
            continue
        comp._values.pop(leaf.id, None)  # recomputed, not read from the memo
        eff = comp._efficiency(leaf)
        acc = view.last_access(leaf)
        keyed.append(((eff > 0, greedy.priority(acc, eff), acc, view.leaf_order(leaf)), leaf))
    keyed.sort(key=lambda t: t[0])
    return [leaf for _, leaf in keyed]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, page=st.sampled_from([1, 4]), weight=st.sampled_from(["0.5", "0.25", "1", "0"]),
       per_pair=st.sampled_from([0.0, 0.01]))
def test_flop_aware_kept_order_equals_a_whole_tree_ranking_and_keeps_integrity(ops, page, weight, per_pair):
    """flop-aware's GreedyDual heap, fed only by the backend's change feed, gives after every step
    (the random requests above, splits of shared nodes included) the order of every evictable leaf
    by its priority computed afresh; a victim raises the level; SGLang's sanity check holds. With
    attention FLOPs per token pair (deep tokens cost more) a leaf's FLOPs per byte moves when a split
    shortens it: the feed must re-enter it."""
    import os

    from radixflow.cache.eviction import ReuseCosts

    os.environ["RADIXFLOW_SGLANG_RECENCY_WEIGHT"] = weight
    try:
        sg = twins.SGLangTwin("radixflow-flop-aware", 96 * page, page)
    finally:
        del os.environ["RADIXFLOW_SGLANG_RECENCY_WEIGHT"]
    comp = sg.cache.components[FULL]
    comp.policy.costs = ReuseCosts(flops_per_pair=per_pair)
    levels = []

    def step():
        view = SGLangTreeView(comp, depths=comp._depths, keys=comp._keys, values=comp._values)
        greedy = comp._greedy_order()
        greedy.enter(view, view.changes(), comp._efficiency)
        assert greedy.order(view) == _whole_tree_greedy_order(comp, view)
        levels.append(greedy.level)

    hist, held = _ops_steps(sg, ops, page, probe=False, step=step)  # some grows take a prefix: a split
    assert levels == sorted(levels)
    if comp.victims and weight not in ("0", "1"):  # w = 1: recency alone (every priority 0); w = 0: no level
        assert comp._greedy.level > 0
    _ops_end(sg, hist, held)
    assert sg.cache.evictable_size() == 0


def test_a_cut_shortens_the_leaf_in_place():
    """FULL-only: a chunk cut from a lone 256-token history keeps its node (no split), with key and
    value cut to 240 tokens, the 16 slots back in the allocator and the ledger moved."""
    sg = twins.SGLangTwin("radixflow-rr-tail", 1024, 4)
    toks = list(range(1, 257))
    state = sg.start(toks, 0)
    sg.finish(state, toks)
    core = sg.cache.tree_core
    (leaf,) = core.evictable_device_leaves
    nodes, free = len(core._node_arena), sg.alloc.available_size()
    assert sg.evict(8) == 16
    assert core._node_arena.get(leaf.id) is leaf and len(core._node_arena) == nodes
    assert len(leaf.key) == len(leaf.component_data[FULL].value) == 240
    assert sg.alloc.available_size() == free + 16 and core.evictable_size() == 240
    sg.check()
    assert sg.kept(toks) == 240


def test_evict_for_alloc_stops_at_its_target_not_at_its_quota():
    """SGLang's allocator path (`evict_for_alloc`) hands the walk the whole evictable size as its quota
    and stops at the allocation's target between steps: the backend cuts one victim per step there,
    so it frees the target (within one chunk), not the tree."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    for backend in ("radixflow-rr-tail", "radixflow-level-tail", "radixflow-flop-aware"):
        sg = twins.SGLangTwin(backend, 1024, 4)
        for h in range(4):
            toks = [7] * 16 + [1000 * (h + 1) + i for i in range(128)]
            state = sg.start(toks, 0)
            sg.finish(state, toks)
        before, held = sg.alloc.available_size(), sg.cache.evictable_size()
        sg.cache.evict_for_alloc(EvictParams(num_tokens=20))
        freed = sg.alloc.available_size() - before
        assert 20 <= freed <= 20 + 128, (backend, freed)
        assert sg.cache.evictable_size() == held - freed
        sg.check()



def test_compaction_drops_superseded_entries_and_keeps_the_orders():
    """Leaves re-entered between walks (the backends enter changes on every insert) with a moved key
    or depth leave superseded entries in the heaps (an unmoved one keeps its entry: none added);
    past 1.5x the live ones plus 32, `compact` drops them, and the next lap and the deepest pick stay
    what they were."""
    keys = {i: ("", 0, (i * 7 % 13,)) for i in range(40)}
    view = KeptOrderView(keys, {i: 100 + i % 5 for i in range(40)})
    rot, deep = Rotation(), DeepestFirst()
    rot.enter(view, list(keys), ("", 0, (6,)))
    deep.enter(view, list(keys))
    rot.enter(view, list(keys), ("", 0, (6,)))  # nothing moved: no new entry
    deep.enter(view, list(keys))
    assert len(rot) == len(deep.heap) == 40
    for r in range(3):  # every leaf moved and entered three more times: three superseded entries each
        for i in keys:
            keys[i] = ("", r + 1, (i * 7 % 13,))
            view.depths[i] -= 1
        rot.enter(view, list(keys), ("", 0, (6,)))
        deep.enter(view, list(keys))
    assert len(rot) == len(deep.heap) == 160
    lap, pick = rot.order(view), deep.deepest(view)  # (deepest pops the superseded entries on top)
    rot.compact()
    deep.compact()
    assert len(rot) == len(deep.heap) == 40
    assert rot.order(view) == lap and deep.deepest(view) == pick


# ----------------------------------------------------------------------------- the adaptive's cold order
def _adaptive_records(order: str, q, run, monkeypatch) -> list:
    from radixflow.integrations.sglang import adaptive

    monkeypatch.setenv("RADIXFLOW_SGLANG_COLD_ORDER", order)
    if q == "duel":
        return run()
    with adaptive.forced(q):
        return run()


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops=OPS, page=st.sampled_from([1, 4]), q=st.sampled_from([0.125, 0.5, 0.75, 1.0, None]))
def test_adaptive_kept_cold_order_cuts_what_the_sorted_walk_cuts(ops, page, q, monkeypatch):
    """The tail rule on every call (cold share q) over the kept `ColdOrder` and over a sort of every
    leaf per pass, and lru on every call (q None) over the kept lru heap and over a heap of every
    leaf per call: the same evict calls, freeing the same tokens and leaving the same tree, through
    random requests with locks held across steps; SGLang's sanity check after every step."""

    def run():
        sg = RecordingTwin("radixflow-adaptive", 96 * page, page)
        _ops_run(sg, ops, page)
        comp = sg.cache.components[FULL]
        assert (comp.tail_calls if q is not None else comp.lru_calls) == len(sg.record)
        return sg.record

    kept, by_sort = (_adaptive_records(o, q, run, monkeypatch) for o in ("kept", "sorted"))
    assert kept == by_sort


@pytest.mark.parametrize("q", [0.125, 0.5, None, "duel"])
@pytest.mark.parametrize("page", [16, 1])
def test_adaptive_kept_cold_order_on_the_agentic_config(q, page, monkeypatch):
    """The sweep's agentic shape (smaller), the tail rule forced at q, lru forced (None) or the duel's
    choice: the kept orders' evict calls are the sorted walks', call for call."""
    monkeypatch.setenv("RADIXFLOW_SGLANG_CHUNK_TOKENS", "64")
    cfg = agentic_config(page)

    def run():
        sg = RecordingTwin("radixflow-adaptive", cfg["capacity"], cfg["page"], small_kv=True)
        sweep.replay(sg, cfg["sessions"], 1.0)
        return sg.record, sg.cache.components[FULL].tail_calls

    kept, by_sort = (_adaptive_records(o, q, run, monkeypatch) for o in ("kept", "sorted"))
    assert len(kept[0]) > 3 and (q in (None, "duel") or kept[1] == len(kept[0]))
    assert kept == by_sort


# ----------------------------------------------------------------------------- byte trajectory keys
_KEYS = st.tuples(st.sampled_from(["", "a", "ab", "b", "é", "lora-1"]), st.integers(0, 1 << 40),
                  st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=8))


@settings(max_examples=300, deadline=None)
@given(a=_KEYS, b=_KEYS)
def test_byte_trajectory_keys_order_as_the_tuples(a, b):
    """`encode_key` keeps the tuple order (extra key, branch depth, first tokens) the rotation and
    level-tail's ties were pinned with: equal, less and greater as the tuples are (a shorter name or
    token prefix first, negative token ids below positive ones)."""
    from radixflow.integrations.sglang.backend import encode_key

    ta, tb = (a[0], a[1], tuple(a[2])), (b[0], b[1], tuple(b[2]))
    ka, kb = encode_key(*a), encode_key(*b)
    assert (ka < kb, ka == kb, ka > kb) == (ta < tb, ta == tb, ta > tb)


def test_byte_trajectory_key_refuses_a_nul_in_the_extra_key():
    from radixflow.integrations.sglang.backend import encode_key

    with pytest.raises(ValueError, match="NUL"):
        encode_key("lora\0x", 0, [1, 2])
