"""The radixflow backends inside SGLang 0.5.23's real UnifiedRadixCache (CPU, Python tree core).

Needs SGLang installed by scripts/install_sglang.sh (its own venv); skipped otherwise, failed under
RADIXFLOW_REQUIRE_SGLANG=1."""

from __future__ import annotations

from array import array
from unittest import mock

import pytest
from sglang_factories import load_twins, replay

twins = load_twins()

from sglang.srt.mem_cache.base_prefix_cache import InsertParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components.full import FullComponent  # noqa: E402

from radixflow.integrations.sglang.backend import RadixflowFullComponent  # noqa: E402

FULL, MAMBA, SWA = twins.FULL, twins.MAMBA, twins.SWA
CHUNK = 16  # tokens


@pytest.fixture(autouse=True)
def _chunk(monkeypatch):
    monkeypatch.setenv("RADIXFLOW_SGLANG_CHUNK_TOKENS", str(CHUNK))
    # our index cuts exactly what is asked, chunk by chunk: the backends' batched cuts off (tested below)
    monkeypatch.setenv("RADIXFLOW_SGLANG_CUTS_PER_CALL", "0")
    monkeypatch.setenv("RADIXFLOW_SGLANG_CUT_AHEAD", "1")
    # flop-aware ranks every leaf per call, as our index does (its kept GreedyDual order: tested below)
    monkeypatch.setenv("RADIXFLOW_SGLANG_FLOP_ORDER", "ranked")


TREES = [pytest.param((FULL,), 4, id="full-ps4"), pytest.param((FULL, MAMBA), 1, id="mamba-ps1"),
         pytest.param((FULL, MAMBA), 4, id="mamba-ps4-extra-buffer")]
POLICIES = [("radixflow-rr-tail", "rr-tail:{chunk}"), ("radixflow-level-tail", "level-tail:{chunk}"),
            ("radixflow-flop-aware", "flop-aware")]  # our policy; {chunk}: the tail chunk in pages


@pytest.mark.parametrize("components,page", TREES)
@pytest.mark.parametrize("backend,policy", POLICIES)
@pytest.mark.parametrize("seed", range(12))
def test_kept_prefixes_equal_our_cache(components, page, backend, policy, seed):
    """Same requests into SGLang's cache (our backend) and our RadixIndex (our policy): every request
    gets the same hit, and after every request each history keeps the same length in both."""
    hybrid = MAMBA in components
    cap = 128 * page  # ~half of what the trace's histories grow to
    sg = twins.SGLangTwin(backend, cap, page, components, max_reqs=256, mamba_slots=256)
    ours = twins.IndexTwin(policy.format(chunk=CHUNK // page), cap, page, hybrid=hybrid)
    for step, hits, (k_sg, k_ours) in replay((sg, ours), seed, page, check=lambda t: t.check()):
        assert hits[0] == hits[1], f"step {step}: hit {hits}"
        assert k_sg == k_ours, f"step {step}: kept per history, SGLang {k_sg} vs ours {k_ours}"
    assert sg.evict_calls, "the trace never put the cache under pressure"
    assert ours.index.evicted_pages > 0


def _put(cache, alloc, tokens, mamba_pool=None):
    value = alloc.alloc(len(tokens))
    params = InsertParams(key=RadixKey(array("q", tokens)), value=value)
    if mamba_pool is not None:
        req = twins.SGLangTwin._req.__get__(mamba_pool)()
        params.mamba_value = req.kv.mamba_pool_idx.unsqueeze(0)
    cache.insert(params)


@pytest.mark.parametrize("backend", ["radixflow-rr-tail", "radixflow-level-tail"])
def test_a_cut_takes_a_tail_chunk_not_the_whole_leaf(backend):
    """One long idle history, a small demand: it loses one chunk (SGLang's whole-leaf walk would
    drop all 256 tokens). SGLang's own FULL walk is never entered."""
    sg = twins.SGLangTwin(backend, 1024, 4)
    _put(sg.cache, sg.alloc, list(range(1, 257)))
    with mock.patch.object(FullComponent, "_evict_device_next_node",
                           side_effect=AssertionError("fell back to SGLang's whole-leaf walk")):
        freed = sg.evict(CHUNK // 2)
    assert freed == CHUNK
    assert sg.kept(list(range(1, 257))) == 256 - CHUNK
    assert isinstance(sg.cache.components[FULL], RadixflowFullComponent)
    assert sg.cache.components[FULL].victims >= 1
    sg.check()


def test_lru_takes_the_whole_leaf_for_contrast():
    sg = twins.SGLangTwin("lru", 1024, 4)
    _put(sg.cache, sg.alloc, list(range(1, 257)))
    sg.evict(CHUNK // 2)
    assert sg.kept(list(range(1, 257))) == 0


@pytest.mark.parametrize("backend", ["radixflow-rr-tail", "radixflow-level-tail", "radixflow-flop-aware",
                                     "radixflow-adaptive"])
@pytest.mark.parametrize("components,page", TREES)
def test_locked_and_in_flight_requests_are_never_evicted(backend, components, page, monkeypatch):
    """A request holding a lock (running) and one whose KV is allocated but not inserted (in flight)
    keep everything through an evict-all; the idle histories go; integrity holds throughout. (The
    adaptive backend with its evidence bypassed: tail cuts on every call.)"""
    from radixflow.integrations.sglang import adaptive

    monkeypatch.setattr(adaptive, "_FORCED", [(1.0, 0, None)])  # the tail rule on every call (adaptive.forced)
    sg = twins.SGLangTwin(backend, 1024, page, components, max_reqs=64, mamba_slots=64)
    idle = [[50 + h] * page + [100 * (h + 1) + i for i in range(64 * page // 4)] for h in range(4)]
    held = [9] * page + list(range(5000, 5000 + 64))
    for toks in (*idle, held):
        st = sg.start(toks, 0)
        sg.finish(st, toks)
    running = sg.start(held, 8)  # locks `held`'s path
    in_flight = sg.start([3] * 32, 16)  # KV allocated, nothing in the tree yet
    free_before = sg.alloc.available_size()
    sg.evict(10**6)
    assert sg.kept(held) == running["hit"] == len(held)
    assert all(sg.kept(t) == 0 for t in idle)
    assert sg.alloc.available_size() > free_before
    sg.finish(running, held + list(range(9000, 9008)))
    sg.finish(in_flight, [3] * 48)
    sg.check()
    sg.evict(10**6)  # unlocked now: everything goes
    assert sg.kept(held) == 0
    sg.check()


@pytest.mark.parametrize("backend", ["radixflow-rr-tail", "radixflow-level-tail", "radixflow-flop-aware"])
def test_swa_tree_keeps_integrity_and_matchable_prefixes(backend):
    """FULL+SWA: cuts split through SGLang's split (SWA values redistributed); SGLang's sanity check
    and the ledger hold after every request, and a kept prefix still matches as a prefix."""
    sg = twins.SGLangTwin(backend, 128, 1, (FULL, SWA), sliding_window=4)
    ours = twins.IndexTwin("rr-tail", 128, 1)  # only to reuse the trace driver
    for _, _hits, (k_sg, _) in replay((sg, ours), 3, 1, check=lambda t: t.check()):
        assert all(k == 0 or k >= 4 for k in k_sg)  # a kept prefix holds at least its SWA window
    assert sg.evict_calls


@pytest.mark.parametrize("order", ["kept", "ranked"])
def test_flop_aware_frees_what_is_asked_and_keeps_integrity(order, monkeypatch):
    monkeypatch.setenv("RADIXFLOW_SGLANG_FLOP_ORDER", order)
    sg = twins.SGLangTwin("radixflow-flop-aware", 512, 4)
    ours = twins.IndexTwin("flop-aware", 512, 4)
    for _ in replay((sg, ours), 5, 4, check=lambda t: t.check()):
        pass
    assert sg.evict_calls
    before = sg.cache.evictable_size()
    got = sg.evict(40)
    assert got >= 40 or got == before


def _flop_aware_two_histories():
    """Two idle histories of 64 tokens, A inserted before B (page 4): equal FLOPs per byte, so
    flop-aware evicts the less recent one first, in our index's terms."""
    sg = twins.SGLangTwin("radixflow-flop-aware", 1024, 4)
    a, b = list(range(1, 65)), list(range(1001, 1065))
    _put(sg.cache, sg.alloc, a)
    _put(sg.cache, sg.alloc, b)
    return sg, a, b


@pytest.mark.parametrize("order", ["kept", "ranked"])
def test_flop_aware_recency_is_not_refreshed_by_a_match_alone(order, monkeypatch):
    """A match without a request (a scheduler probing its queue) is no access in our index; SGLang's
    own counter refreshes A, which would make B the victim."""
    monkeypatch.setenv("RADIXFLOW_SGLANG_FLOP_ORDER", order)
    sg, a, b = _flop_aware_two_histories()
    assert sg.kept(a) == 64  # SGLang's tree match: bumps A's last_access_time
    sg.evict(64)
    assert (sg.kept(a), sg.kept(b)) == (0, 64)
    sg.check()


@pytest.mark.parametrize("order", ["kept", "ranked"])
def test_flop_aware_split_keeps_the_suffix_recency(order, monkeypatch):
    """A request takes half of A (SGLang splits A; the prefix is stamped by the lock and the insert):
    the suffix keeps A's insert time, older than B, and goes first. SGLang's `_split_node` restamps
    the suffix with a fresh counter, which would make B the victim."""
    monkeypatch.setenv("RADIXFLOW_SGLANG_FLOP_ORDER", order)
    sg, a, b = _flop_aware_two_histories()
    st = sg.start(a[:32], 0)
    assert st["hit"] == 32
    sg.finish(st, a[:32])
    sg.evict(32)
    assert (sg.kept(a), sg.kept(b)) == (32, 64)
    sg.check()




@pytest.mark.parametrize("batched", [False, True])
def test_adaptive_tail_cut_levels_the_least_recent_and_keeps_the_recent(batched, monkeypatch):
    """Tails forced on, q = 3/4, four 144-token histories at page 4 (levelling unit 16), one call of 96
    tokens. Exact (batching off): the least recently used 3 of 4 histories levelled to one depth (96),
    none dropped whole, the most recent untouched. Batched (2 cuts, cut ahead 1.5): 144 tokens asked
    of the cold share, a chunk of at least 72 (80 in units of 16) per cut, so the two least recent
    histories lose 80 each and the third cold one keeps all, as does the most recent."""
    from radixflow.integrations.sglang import adaptive

    monkeypatch.setenv("RADIXFLOW_SGLANG_CUTS_PER_CALL", "2" if batched else "0")
    monkeypatch.setenv("RADIXFLOW_SGLANG_CUT_AHEAD", "1.5" if batched else "1")
    with adaptive.forced(0.75):
        sg = twins.SGLangTwin("radixflow-adaptive", 4096, 4)
    hist = [[7] * 16 + [1000 * (h + 1) + i for i in range(128)] for h in range(4)]
    for toks in hist:
        st = sg.start(toks, 0)
        sg.finish(st, toks)
    freed = sg.evict(96)
    kept = [sg.kept(t) for t in hist]
    assert kept[3] == len(hist[3])  # the most recent: outside the cold share
    assert sum(len(t) - k for t, k in zip(hist, kept)) == freed
    if batched:
        assert freed == 160 and kept == [64, 64, 144, 144]
    else:
        assert all(0 < k < len(hist[0]) for k in kept[:3]) and len(set(kept[:3])) == 1  # levelled, none whole
        assert freed >= 96
    assert sg.cache.components[FULL].tail_calls == 1
    sg.check()


@pytest.mark.parametrize("backend", ["radixflow-rr-tail", "radixflow-level-tail"])
def test_batched_cuts_free_a_call_in_few_cuts(backend, monkeypatch):
    """Eight idle 256-token histories behind a shared prompt, one evict call of 200 tokens. Exact
    (batching off): 16-token chunks, one per history in turn (rr-tail: every history, some twice) or
    from the deepest (level-tail: all levelled), 200 tokens within a chunk. Batched (2 cuts, cut
    ahead 1.5): 300 tokens in two cuts of 152, so two histories lose their tails and six keep all."""
    page = 4
    hist = [[7] * 16 + [1000 * (h + 1) + i for i in range(240)] for h in range(8)]

    def run(cuts: str, ahead: str):
        monkeypatch.setenv("RADIXFLOW_SGLANG_CUTS_PER_CALL", cuts)
        monkeypatch.setenv("RADIXFLOW_SGLANG_CUT_AHEAD", ahead)
        sg = twins.SGLangTwin(backend, 4096, page)
        for toks in hist:
            sg.finish(sg.start(toks, 0), toks)
        freed = sg.evict(200)
        sg.check()
        return freed, [sg.kept(toks) for toks in hist]

    freed, kept = run("0", "1")
    assert 200 <= freed < 200 + CHUNK and sum(256 - k for k in kept) == freed
    assert sum(k < 256 for k in kept) == 8
    freed, kept = run("2", "1.5")
    assert freed == 304 and sorted(256 - k for k in kept) == [0] * 6 + [152, 152]


def test_batching_knobs_refuse_bad_values(monkeypatch):
    from radixflow.integrations.sglang.backend import cut_ahead_factor, cuts_per_call

    for raw in ("-1", "two"):
        monkeypatch.setenv("RADIXFLOW_SGLANG_CUTS_PER_CALL", raw)
        with pytest.raises(ValueError, match="RADIXFLOW_SGLANG_CUTS_PER_CALL"):
            cuts_per_call()
    monkeypatch.setenv("RADIXFLOW_SGLANG_CUT_AHEAD", "0.5")
    with pytest.raises(ValueError, match="RADIXFLOW_SGLANG_CUT_AHEAD"):
        cut_ahead_factor()
    from radixflow.integrations.sglang.backend import flop_order

    monkeypatch.setenv("RADIXFLOW_SGLANG_FLOP_ORDER", "heap")
    with pytest.raises(ValueError, match="RADIXFLOW_SGLANG_FLOP_ORDER"):
        flop_order()


def test_flop_aware_kept_order_weighs_flops_per_byte_against_recency(monkeypatch):
    """GreedyDual: with attention FLOPs per token pair, a deep history saves more per byte than a
    shallow one. At recency weight 0.5 the older deep history outlives a newer shallow one; at 1
    (recency alone) the older goes first."""
    from radixflow.cache.eviction import ReuseCosts

    monkeypatch.setenv("RADIXFLOW_SGLANG_FLOP_ORDER", "kept")
    kept = {}
    for w in ("0.5", "1"):
        with mock.patch.dict("os.environ", {"RADIXFLOW_SGLANG_RECENCY_WEIGHT": w}):
            sg = twins.SGLangTwin("radixflow-flop-aware", 4096, 4)
        sg.cache.components[FULL].policy.costs = ReuseCosts(flops_per_pair=1.0)
        deep, shallow = list(range(1, 1025)), list(range(5001, 5033))
        _put(sg.cache, sg.alloc, deep)
        _put(sg.cache, sg.alloc, shallow)
        sg.evict(16)
        kept[w] = (sg.kept(deep), sg.kept(shallow))
        sg.check()
    assert kept == {"0.5": (1024, 0), "1": (0, 32)}
