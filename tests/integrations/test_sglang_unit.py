"""SGLang's own radix-cache unit assertions that run on CPU, ported, with our backends substituted.

Ported from the UnifiedRadixCache unit suite (its pool-ledger fuzz `verify_pool_consistency`, the
evict/lock/match contracts) as our own tests: the upstream files are not in the wheel, and CI cannot
fetch them. Each runs on FULL, FULL+MAMBA and FULL+SWA caches from SGLang's test kit."""

from __future__ import annotations

from array import array

import pytest
from sglang_factories import load_twins

twins = load_twins()

from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.registry import get_radix_cache_factory, registered_radix_cache_backends  # noqa: E402
from sglang.srt.plugins import load_plugins  # noqa: E402

FULL, MAMBA, SWA = twins.FULL, twins.MAMBA, twins.SWA
BACKENDS = ["radixflow-rr-tail", "radixflow-level-tail", "radixflow-flop-aware", "radixflow-adaptive",
            pytest.param("radixflow-adaptive", id="adaptive-tails")]


@pytest.fixture(autouse=True)
def _adaptive_tails(request, monkeypatch):
    """`adaptive-tails`: the adaptive backend with its evidence bypassed, so every evict call cuts tails."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and "adaptive-tails" in callspec.id:
        from radixflow.integrations.sglang import adaptive

        monkeypatch.setattr(adaptive, "_FORCED", [(1.0, 0, None)])  # the tail rule on every call (adaptive.forced)
TREES = [pytest.param((FULL,), {}, id="full"), pytest.param((FULL, MAMBA), {}, id="mamba"),
         pytest.param((FULL, SWA), {"sliding_window": 4}, id="swa")]


def _tokens(seed, n):
    return [seed * 1000 + i for i in range(n)]


def _insert(sg, tokens):
    st = sg.start(tokens, 0)
    sg.finish(st, tokens)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("components,kw", TREES)
def test_pool_ledger_and_sanity_after_each_op(backend, components, kw):
    """verify_pool_consistency: free + evictable + protected == pool size, and sanity_check()."""
    sg = twins.SGLangTwin(backend, 256, 1, components, **kw)
    for s in range(12):
        _insert(sg, _tokens(s, 24 + s))
        sg.check()
    for n in (1, 7, 30, 10**6):
        sg.evict(n)
        sg.check()
    assert sg.cache.evictable_size() == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("components,kw", TREES)
def test_evict_frees_at_least_the_request_when_it_can(backend, components, kw):
    sg = twins.SGLangTwin(backend, 256, 1, components, **kw)
    for s in range(6):
        _insert(sg, _tokens(s, 30))
    before = sg.alloc.available_size()
    got = sg.evict(20)
    assert got >= 20 and sg.alloc.available_size() - before == got


@pytest.mark.parametrize("backend", BACKENDS)
def test_evict_on_an_empty_tree_is_a_no_op(backend):
    sg = twins.SGLangTwin(backend, 64, 1)
    assert sg.evict(10) == 0
    sg.check()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("components,kw", TREES)
def test_locked_node_is_protected_then_evictable_after_unlock(backend, components, kw):
    sg = twins.SGLangTwin(backend, 256, 1, components, **kw)
    toks = _tokens(1, 40)
    _insert(sg, toks)
    m = sg.cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", toks))))
    res = sg.cache.inc_lock_ref(m.last_device_node)
    assert sg.cache.protected_size() > 0
    assert sg.evict(10**6) == 0
    assert sg.kept(toks) == m.device_prefix_len
    sg.cache.dec_lock_ref(m.last_device_node, res.to_dec_params())
    assert sg.cache.protected_size() == 0
    assert sg.evict(10**6) > 0
    sg.check()


@pytest.mark.parametrize("backend", BACKENDS)
def test_match_after_evict_returns_a_prefix_of_what_was_inserted(backend):
    sg = twins.SGLangTwin(backend, 256, 1)
    seqs = [_tokens(s, 40) for s in range(5)]
    for t in seqs:
        _insert(sg, t)
    sg.evict(60)
    for t in seqs:
        k = sg.kept(t)
        assert 0 <= k <= len(t)
        m = sg.cache.tree_core.match_prefix(MatchPrefixParams(key=RadixKey(array("q", t[:k]))))
        assert m.device_prefix_len == k


@pytest.mark.parametrize("backend", BACKENDS)
def test_reset_empties_the_tree(backend):
    sg = twins.SGLangTwin(backend, 128, 1)
    _insert(sg, _tokens(1, 30))
    sg.cache.reset()
    assert sg.cache.evictable_size() == 0 and sg.kept(_tokens(1, 30)) == 0


def test_plugins_register_the_four_backends():
    """What `--radix-cache-backend` resolves: SGLang's plugin loader finds our entry point."""
    load_plugins()
    names = registered_radix_cache_backends()
    for name in twins.BACKENDS:
        assert name in names and get_radix_cache_factory(name).__module__ == "radixflow.integrations.sglang"
    assert "radixflow-adaptive" in names


def test_insert_of_a_held_prefix_keeps_one_copy():
    """A second insert of the same tokens frees the duplicate slots (prev_prefix_len contract)."""
    sg = twins.SGLangTwin("radixflow-rr-tail", 128, 1)
    toks = _tokens(2, 20)
    _insert(sg, toks)
    free = sg.alloc.available_size()
    value = sg.alloc.alloc(20)
    sg.cache.insert(InsertParams(key=RadixKey(array("q", toks)), value=value))
    assert sg.alloc.available_size() == free
    sg.check()
    assert sg.evict(10**6) == 20 and EvictParams is not None


def _ctx(**kw):
    """A TreeCacheBuildContext for a small FULL cache (params from SGLang's test kit)."""
    import dataclasses

    from sglang.srt.mem_cache.registry import TreeCacheBuildContext
    from sglang.srt.server_args import ServerArgs

    base = twins.SGLangTwin("lru", 128, 1).cache.cache_init_params
    params = dataclasses.replace(base, component_registry_override=None, tree_core_backend=None,
                                 enable_session_radix_cache=kw.pop("session", False))
    args = ServerArgs(model_path="dummy", page_size=1,
                      enable_int8_mamba_checkpoint=kw.pop("int8", False))
    fields = dict(server_args=args, params=params, is_hybrid_swa=False, is_hybrid_ssm=False,
                  enable_hierarchical_cache=False, disable_radix_cache=False, tp_worker=None,
                  model_config=None, tp_size=1, tp_rank=0, tp_group=None)
    fields.update(kw)
    return TreeCacheBuildContext(**fields)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_registered_factory_builds_sglang_cache_with_our_component(backend):
    from radixflow.integrations.sglang.backend import RadixflowFullComponent

    load_plugins()
    cache = get_radix_cache_factory(backend)(_ctx())
    assert type(cache).__name__ == "UnifiedRadixCache"
    assert isinstance(cache.components[FULL], RadixflowFullComponent)
    assert cache.components[FULL].policy_kind == backend.removeprefix("radixflow-")
    assert cache._tree_core_backend == "python"


@pytest.mark.parametrize("kw,word", [({"enable_hierarchical_cache": True}, "HiCache"),
                                     ({"int8": True}, "int8"), ({"session": True}, "session")])
def test_the_factory_refuses_what_it_cannot_honour(kw, word):
    load_plugins()
    with pytest.raises(ValueError, match=word):
        get_radix_cache_factory("radixflow-rr-tail")(_ctx(**kw))


def test_on_another_sglang_version_selecting_a_backend_fails_in_one_line(monkeypatch):
    from importlib import metadata
    from unittest import mock

    from sglang.srt.mem_cache import registry

    from radixflow.integrations import sglang as rf_sglang
    from radixflow.integrations.sglang import compat

    real = metadata.version
    monkeypatch.setattr(compat.metadata, "version", lambda n: "0.5.24" if n == "sglang" else real(n))
    with mock.patch.dict(registry._RADIX_CACHE_REGISTRY, clear=True):
        assert rf_sglang.register() == list(rf_sglang.BACKENDS)
        with pytest.raises(compat.UnsupportedSglangError) as e:
            registry.get_radix_cache_factory("radixflow-level-tail")(None)
    assert "\n" not in str(e.value) and "SGLang 0.5.23 only" in str(e.value) and "0.5.24" in str(e.value)
