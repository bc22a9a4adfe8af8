"""The same cache operations on SGLang's real `UnifiedRadixCache` and on our `RadixIndex` (tests and
benchmarks/sglang_eviction.py; imports SGLang's test kit, so only where SGLang is installed).

`SGLangTwin` drives SGLang's cache as its scheduler does for one request: `match_prefix` (the hit),
`inc_lock_ref` on the matched node while the request runs, KV allocated for the rest (evicting with
`cache.evict` when the allocator is short), then `insert` of the whole sequence (`prev_prefix_len` =
the hit, so SGLang frees the slots it already held) and the lock released. `IndexTwin` does the same
with `RadixIndex` (match, lock, allocate with `evict_pages`, insert, publish, unlock, a snapshot at the
end on hybrid trees). Both count what the
cache gave each request, so the decisions of two policies can be compared call by call.
"""

from __future__ import annotations

import dataclasses
import time
from array import array

from radixflow.cache.eviction import get_eviction
from radixflow.cache.pool import IdPool
from radixflow.cache.radix import RadixIndex, chain_hashes
from radixflow.integrations.sglang import cpu_shim

cpu_shim.install()

import torch  # noqa: E402
from sglang.srt.managers.schedule_batch import Req  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.test.kits.unified_radix_cache.config import CacheConfig  # noqa: E402
from sglang.test.kits.unified_radix_cache.fixtures import build_fixture  # noqa: E402

from radixflow.integrations.sglang import BACKENDS  # noqa: E402
from radixflow.integrations.sglang.components import component_class  # noqa: E402

FULL, MAMBA, SWA = ComponentType.FULL, ComponentType.MAMBA, ComponentType.SWA
SGLANG_POLICIES = ("lru", "tlru")  # SGLang's own, by --radix-eviction-policy name


def sglang_cache(backend: str, capacity: int, page_size: int = 1, components=(FULL,), max_reqs: int = 64,
                 mamba_slots: int = 256, sliding_window: int | None = None, small_kv: bool = False,
                 core: str = "python"):
    """(cache, allocator, req pool): SGLang's cache from its test kit, FULL eviction by `backend`
    (a radixflow backend name, or one of SGLang's policies `lru`, `tlru`). `core="default"`: SGLang's
    default tree core (Rust where it loads; SGLang falls back to Python on its own), what an lru user
    runs; only for SGLang's policies (a component override needs the Python core)."""
    policy = backend if backend in SGLANG_POLICIES else "lru"
    cfg = CacheConfig(page_size=page_size, components=tuple(components), kv_size=capacity,
                      max_num_reqs=max_reqs, max_context_len=capacity, mamba_cache_size=mamba_slots,
                      sliding_window_size=sliding_window, eviction_policy=policy,
                      enable_mamba_extra_buffer=page_size > 1 and MAMBA in components,
                      **({"num_layers": 2, "full_attention_layer_ids": (1,), "head_num": 1, "head_dim": 8}
                         if small_kv else {}))  # small_kv: a large pool of tiny KV rows (benchmarks)
    override = None
    if backend not in SGLANG_POLICIES:
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose from {', '.join((*BACKENDS, *SGLANG_POLICIES))}")
        override = {FULL: component_class(BACKENDS[backend])}
    cache, alloc, pool = build_fixture(cfg, component_registry_override=override)
    if core == "default":
        if override is not None:
            raise ValueError(f"{backend} runs on the Python tree core only (a component override)")
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        params = dataclasses.replace(cache.cache_init_params, tree_core_backend=None)
        cache = UnifiedRadixCache(params=params)  # the same allocator and pools, a fresh tree
    elif core != "python":
        raise ValueError(f"unknown tree core {core!r}: python or default")
    return cache, alloc, pool


class SGLangTwin:
    """SGLang's cache under one backend; requests as its scheduler would make them."""

    def __init__(self, backend: str, capacity: int, page_size: int = 1, components=(FULL,), **kw) -> None:
        self.backend = backend
        self.cache, self.alloc, self.pool = sglang_cache(backend, capacity, page_size, components, **kw)
        self.page_size = page_size
        self.mamba = MAMBA in components
        self.evict_calls: list[float] = []  # CPU seconds per cache.evict call
        self.held = 0  # tokens allocated to requests that have not inserted them yet
        self.request_cpu = 0.0  # CPU seconds in start + finish (match, lock, allocate, evict, insert, unlock)
        self.requests = 0
        self._rid = 0

    def _req(self):
        self._rid += 1
        req = Req(rid=f"rf-{self._rid}", origin_input_text="", origin_input_ids=array("q"),
                  sampling_params=SamplingParams(temperature=0, max_new_tokens=1))
        self.pool.alloc([req])
        return req

    def kept(self, tokens) -> int:
        """Tokens of `tokens` the cache would give a request now (a match: it refreshes, as a hit does)."""
        key = RadixKey(array("q", tokens))
        return self.cache.tree_core.match_prefix(MatchPrefixParams(key=key)).device_prefix_len

    def evict(self, n: int) -> int:
        # CPU time of this process, not wall time: the machine is shared, and an evict call is
        # single-threaded Python (and Rust, for SGLang's default core) that never waits.
        t0 = time.process_time()
        got = self.cache.evict(EvictParams(num_tokens=n)).num_tokens_evicted
        self.evict_calls.append(time.process_time() - t0)
        return got

    def start(self, prompt, new_tokens: int):
        """A request arrives: match, lock, allocate for the uncached prompt and `new_tokens` more."""
        t0 = time.process_time()
        try:
            return self._start(prompt, new_tokens)
        finally:
            self.request_cpu += time.process_time() - t0
            self.requests += 1

    def _start(self, prompt, new_tokens: int):
        m = self.cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", prompt))))
        hit = m.device_prefix_len
        lock = self.cache.inc_lock_ref(m.last_device_node)
        need = -(-(len(prompt) - hit + new_tokens) // self.page_size) * self.page_size  # whole pages, as ours
        short = need - self.alloc.available_size()
        if short > 0:
            self.evict(short)
        fresh = self.alloc.alloc(need)
        if fresh is None:
            raise RuntimeError(f"SGLang cache ({self.backend}) cannot hold a {need}-token request")
        self.held += len(fresh)
        prefix = self.cache.path_device_indices(m.last_device_node)[:hit]
        return {"hit": hit, "node": m.last_device_node, "lock": lock, "prefix": prefix,
                "fresh": fresh, "req": self._req() if self.mamba else None}

    def finish(self, state, tokens) -> None:
        """The request ends: its whole page-aligned sequence goes into the tree, the lock is released."""
        t0 = time.process_time()
        try:
            self._finish(state, tokens)
        finally:
            self.request_cpu += time.process_time() - t0

    def _finish(self, state, tokens) -> None:
        n = len(tokens) // self.page_size * self.page_size
        value = torch.cat([state["prefix"].to(torch.int64), state["fresh"].to(torch.int64)])
        # prev_prefix_len: the slots below it are the tree's own; SGLang frees our duplicates above it.
        params = InsertParams(key=RadixKey(array("q", tokens[:n])), value=value[:n],
                              prev_prefix_len=state["hit"])
        if state["req"] is not None:
            params.mamba_value = state["req"].kv.mamba_pool_idx.unsqueeze(0)
        self.cache.insert(params)
        self.held -= len(state["fresh"])
        if len(value) > n:
            self.alloc.free(value[n:])
        self.cache.dec_lock_ref(state["node"], state["lock"].to_dec_params())
        if state["req"] is not None:
            self.pool.free_rows([state["req"].kv.req_pool_idx])  # its Mamba state now belongs to the tree

    def check(self) -> None:
        """SGLang's own integrity check, and the allocator ledger: free + evictable + protected + held
        (allocated to running requests, not inserted yet) = size."""
        self.cache.sanity_check()
        core = self.cache.tree_core
        total = core.component_evictable_size(FULL) + core.component_protected_size(FULL)
        a = self.alloc.full_attn_allocator if hasattr(self.alloc, "full_attn_allocator") else self.alloc
        assert a.available_size() + total + self.held == a.size, (
            f"ledger: free {a.available_size()} + evictable/protected {total} + held {self.held} != {a.size}")


class IndexTwin:
    """Our `RadixIndex` under one policy, driven through the same requests (pages of `page_size`)."""

    def __init__(self, policy: str, capacity: int, page_size: int = 1, hybrid: bool = False) -> None:
        self.index = RadixIndex(page_size, IdPool(capacity // page_size, "KV page"),
                                IdPool(1 << 16 if hybrid else 0, "state slot"), get_eviction(policy))
        self.bs = page_size
        self.hybrid = hybrid
        self.now = 0.0

    def _hit(self, tokens) -> tuple[int, object]:
        m = self.index.match(chain_hashes("", tokens, self.bs))
        if self.hybrid:
            depth, _ = self.index.ready_boundary(m)
            return depth, m
        return m.depth, m

    def kept(self, tokens) -> int:
        return self._hit(tokens)[0]

    def evict(self, n: int) -> int:
        return self.index.evict_pages(-(-n // self.bs)) * self.bs

    def start(self, prompt, new_tokens: int):
        self.now += 1.0
        hit, m = self._hit(prompt)
        self.index.request_begins("", prompt, m)  # a policy that observes (adaptive) learns the request
        node = None
        if hit:
            node = self.index.node_at(m) if m.depth == hit else self.index.node_at(type(m)(hit, m.node))
            self.index.lock(node, self.now)
        need = -(-(len(prompt) - hit + new_tokens) // self.bs)
        short = need - self.index.pages.num_free
        if short > 0:
            self.evict(short * self.bs)
        if not self.index.pages.can_allocate(need):
            raise RuntimeError(f"our cache cannot hold a {need}-page request")
        fresh = self.index.pages.allocate(need)
        return {"hit": hit, "node": node, "fresh": fresh}

    def finish(self, state, tokens) -> None:
        self.now += 1.0
        idx, bs = self.index, self.bs
        n = len(tokens) // bs
        hashes = chain_hashes("", tokens, bs)[:n]
        have = state["hit"] // bs
        table = (idx.pages_upto(idx.match(hashes, have), have) if have else []) + state["fresh"]
        node, adopted = idx.insert("", tokens, hashes, table, n, self.now)
        idx.publish()
        idx.touch(node, self.now)
        # The policy hears of the end before the request's spare pages go back (our scheduler's
        # `Memory.release` and SGLang's insert hook report first too): the same budget as SGLang's.
        idx.request_ends(node, state["hit"])
        idx.pages.free(table[have:adopted] + table[n:])  # pages the tree already had, and the remainder
        if self.hybrid:
            end = idx.node_at(idx.match(hashes))
            if end.snapshot is None:
                idx.attach_snapshot(end, idx.slots.allocate_one(), None, self.now)
        if state["node"] is not None:
            idx.unlock(state["node"])

    def check(self) -> None:
        self.index.check_integrity()
