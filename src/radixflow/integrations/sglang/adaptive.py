"""`radixflow-adaptive`: SGLang's own lru walk, or a tail cut over the coldest share of the idle
histories, chosen per evict call by the duel of shadow caches (`cache/eviction/duel.py`;
docs/eviction.md, "radixflow-adaptive").

`DuelFullComponent` feeds the rule from SGLang's insert hook (`commit_insert_component_data`:
trajectory key, start, private length, `prev_prefix_len` as the real hit, and the budget: the pool
less what running requests hold and the shared prefixes) and asks it once per evict call. When it
says lru, the call is SGLang's own `FullComponent` walk, so its decisions are lru's node for node.
On FULL-only device trees a tail call is batched as rr-tail's are (`cut_target`: about
`cuts_per_call` cuts freeing `cut_ahead_factor` times the demand, not a unit off every cold history),
so it costs about what an lru call costs (docs/eviction.md, "Batched tail calls for the adaptive").
Imports SGLang (through backend.py).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools

from sglang.srt.mem_cache.unified_cache.components.full import FullComponent

from radixflow.cache.eviction.duel import (  # noqa: F401  (Shadow, water_level: the duel's names here, as before)
    DuelRule,
    Evidence,
    FixedRule,
    Shadow,
    cold_level_walk,
    water_level,
)
from radixflow.cache.eviction.kept import ColdOrder, RecencyHeap
from radixflow.integrations.sglang.backend import FULL, RadixflowFullComponent, SGLangTreeView

_FORCED: list = []  # FixedRule's (share or None for lru, lru calls first, calls of the share) for caches built now


@contextlib.contextmanager
def forced(q: float | None, after: int = 0, span: int | None = None):
    """Caches built inside run a `FixedRule(q, after, span)` instead of the duel (the sweep's oracle,
    tests): q on every evict call, or from call `after` + 1 on (on `span` calls, if given), lru else."""
    _FORCED.append((q, after, span))
    try:
        yield
    finally:
        _FORCED.pop()


class DuelFullComponent(RadixflowFullComponent):
    """SGLang's FULL component for `radixflow-adaptive`: `DuelRule` fed at insert, asked per evict
    call; lru calls are SGLang's own `FullComponent` walk, tail calls `cold_level_walk`."""

    policy_kind = "adaptive"
    SHARED_EVERY = 32  # inserts between two measures of the shared prefix tokens
    leaves_gone_feed = True  # `ColdOrder` counts SGLang's evictable set exactly

    def __init__(self, cache, params) -> None:
        super().__init__(cache, params)
        alloc = params.token_to_kv_pool_allocator
        self.alloc = getattr(alloc, "full_attn_allocator", alloc)
        self.rule = FixedRule(*_FORCED[-1]) if _FORCED else DuelRule()
        self.evidence = Evidence(self.rule)
        self.q: float | None = None
        self._sglang_lru = False  # this call is SGLang's own walk (a tree the component cannot cut itself)
        self.tail_calls = self.lru_calls = 0
        self._inserts = 0
        self._shared = 0
        self._matched: dict[int, tuple] = {}  # node id -> trajectory key of the last match ending there
        self._cold_kept = self.settings.cold_order == "kept"
        self._cold = ColdOrder()
        self._lru = RecencyHeap()  # the lru calls' order kept across calls (`kept_lru_walk`)

    # --------------------------------------------------------------- evidence
    def finalize_match_result_in_cache(self, params, result):
        """Where the request's trajectory starts (`Evidence.match_key`), kept by node until a lock
        takes it (a match alone is a probe)."""
        result = super().finalize_match_result_in_cache(params, result)
        node = result.last_device_node
        node = self.tree_core.node_by_id(node) if isinstance(node, int) else node
        if node is None or params.key is None:
            return result
        view = self._kept_view()
        extra = params.key.extra_key
        if len(self._matched) > 4096:
            self._matched.clear()  # probes never locked
        self._matched[node.id] = self.evidence.match_key(view, "" if extra is None else str(extra),
                                                         params.key.token_ids, node, view.depth(node))
        return result

    def acquire_component_lock(self, node, result, lock_host: bool = False):
        result = super().acquire_component_lock(node, result, lock_host)
        if not lock_host:
            key = self._matched.pop(node.id, None)
            if key is not None:
                self.evidence.begin(key)
        return result

    def commit_insert_component_data(self, node, is_new_leaf, params, result, cache_actions) -> None:
        super().commit_insert_component_data(node, is_new_leaf, params, result, cache_actions)
        core = self.tree_core
        if node is core.root_node:
            return
        if self._inserts % self.SHARED_EVERY == 0:
            self._shared = self._shared_tokens()
        self._inserts += 1
        tree = core.component_evictable_size(FULL) + core.component_protected_size(FULL)
        free = self.alloc.available_size() if self.alloc is not None else 0
        self.evidence.inserted(self._kept_view(), node, int(getattr(params, "prev_prefix_len", 0) or 0),
                               max(0, free + tree - self._shared))

    def _shared_tokens(self) -> int:
        """Device tokens not on any leaf's unshared chain: the shared prefixes (a walk of the tree)."""
        core = self.tree_core
        root = core.root_node
        private = 0
        for n in self.tree_nodes():
            if n is root or n.children:
                continue
            while True:
                if n.component_data[FULL].value is not None:
                    private += len(n.key)
                up = n.parent
                if up is None or up is root or len(up.children) != 1:
                    break
                n = up
        return max(0, core.component_evictable_size(FULL) + core.component_protected_size(FULL) - private)

    # --------------------------------------------------------------- eviction
    def _one_step(self) -> bool:
        """Whether this cache's FULL tree lets the component remove victims itself in one step (the
        in-place cuts' condition, `SGLangTreeView.trims`; fixed for a cache's life)."""
        ok = getattr(self, "_one_step_ok", None)
        if ok is None:
            ok = self._one_step_ok = SGLangTreeView(self).trims
        return ok

    def _evict_device_start(self, request_cnt: int) -> None:
        self.q = self.rule.decide()
        if self.q is None:
            self.lru_calls += 1
            if not self._one_step():
                self._sglang_lru = True
                FullComponent._evict_device_start(self, request_cnt)
                return
        else:
            self.tail_calls += 1
        self._sglang_lru = False
        super()._evict_device_start(request_cnt)

    def _evict_device_next_node(self, tracker, device_frees, host_frees, cache_actions):
        if self._sglang_lru:
            return FullComponent._evict_device_next_node(self, tracker, device_frees, host_frees, cache_actions)
        return super()._evict_device_next_node(tracker, device_frees, host_frees, cache_actions)

    def _evict_device_end(self) -> None:
        if self._sglang_lru:
            FullComponent._evict_device_end(self)
            return
        super()._evict_device_end()

    def _start_walk(self, view, need: int):
        if self.q is None:
            if self._cold_kept and view.trims and self._plain_lru():
                return self.kept_lru_walk(need)
            return self.lru_walk(need)
        if self._whole:  # a batched tail call (as rr-tail's): `cut_ahead` times the demand
            need = min(int(need * self.cut_ahead), self.tree_core.full_evictable_size())
        return self.cold_level_walk(view, need, self.q)

    def _tail_chunk(self, want: int, unit: int) -> int:
        """What one cut of a batched tail call takes at least: the pass's demand in about `cuts` cuts
        (RADIXFLOW_SGLANG_CUTS_PER_CALL), a multiple of the levelling unit; 0 (cut to the water
        level only) with batching off or where the call does not run in one step."""
        if not (self.cuts and self._whole):
            return 0
        return max(unit, -(-want // (self.cuts * unit)) * unit)

    def kept_lru_walk(self, need: int):
        """`lru_walk` over a heap kept across calls: every evictable leaf has an entry keyed by its
        `last_access_time` when it entered (the feed: joined SGLang's set). SGLang's counter only
        grows (a match, an insert walk or a split restamps a node with a fresh count), so an entry's
        key is at most the leaf's time now: one popped with an old key goes back with the new one,
        and the first popped whose key is its time is the least recent leaf, as the walk's fresh
        heap gives it. A victim's parent enters before the next pop (SGLang's walk pushes it): where
        the walk removes its victims itself, what joined SGLang's set during the deletion is pushed
        from the feed without draining it (the kept cold order takes the feed at the next sync);
        elsewhere the feed is synced after each victim. A call costs O((changes + victims +
        restamped) log L), not a heap of every leaf."""
        order = self._lru
        freed = 0
        self._sync_cold()
        members = self.tree_core.evictable_device_leaves
        while freed < need:
            x = order.least(members, _counter)
            if x is None:
                return
            if self.removes_now:
                fresh = members.fresh  # only grows until the next drain: new notes are appended
                seen = len(fresh)
                freed += self.drop_now(x)
                if len(fresh) > seen:
                    for n in itertools.islice(fresh, seen, None):
                        if n in members:  # joined (a victim's parent); a victim's own note is a departure
                            order.enter(n, n.last_access_time)
            else:
                freed += yield x
                self._sync_cold()
                members = self.tree_core.evictable_device_leaves

    def _plain_lru(self) -> bool:
        """SGLang's FULL priority is its lru's (the node's counter), not a session-aware one."""
        return self.lru_priority()[1]

    def lru_walk(self, need: int):
        """SGLang's own lru walk (`FullComponent._evict_device_*`), victim for victim: a heap of
        (priority, node) over the evictable leaves, built in their set's order and heapified, popped
        until `need` is freed, a victim's parent pushed once it is an evictable leaf. The component
        removes the victims itself, the whole call in one SGLang step where it may (as its tail
        cuts), instead of one round trip through the cache per victim."""
        core = self.tree_core
        prio, plain = self.lru_priority()
        if plain:
            heap = [(n.last_access_time, n) for n in core.evictable_device_leaves]
        else:
            heap = [(prio(n), n) for n in core.evictable_device_leaves]
        heapq.heapify(heap)
        pop, push = heapq.heappop, heapq.heappush
        freed = 0
        while freed < need and heap:
            x = pop(heap)[1]
            if x not in core.evictable_device_leaves:
                continue
            freed += yield x
            parent = x.parent
            if parent is not None and parent in core.evictable_device_leaves:
                push(heap, (parent.last_access_time if plain else prio(parent), parent))

    # --------------------------------------------------------------- the kept cold order
    def _orders_reset(self) -> None:
        self._cold.reset()
        self._lru = RecencyHeap()

    def _enter_changes(self) -> None:
        """On every insert (the request path): what changed enters the cold order now, so a tail
        call only enters what changed since the last request."""
        if self._walk is None and self._cold_kept and self._one_step():
            self._sync_cold()

    def _sync_cold(self) -> None:
        view = self._kept_view()
        changes = view.changes()  # every evictable leaf after a reset (`_orders_reset` ran first)
        members = self.tree_core.evictable_device_leaves
        self._cold.update(view, changes, members)
        order = self._lru
        for n in changes:
            if n in members:
                order.enter(n, n.last_access_time)
            else:
                order.drop(n)
        order.compact()

    def cold_level_walk(self, view, need: int, q: float):
        """The tail rule: the `q` least recently used evictable leaves (our stamps; ties: the order
        they became leaves), cut from the deepest down to one level (a multiple of the page, and of
        `LEVEL_STEP` tokens where pages are smaller) until `need` tokens are freed; again over the
        leaves left if one level did not free enough. A call that runs in one step (a FULL-only
        device tree, as rr-tail's) frees `cut_ahead` times its demand (RADIXFLOW_SGLANG_CUT_AHEAD)
        and, with RADIXFLOW_SGLANG_CUTS_PER_CALL > 0, cuts each cold leaf at least a chunk down
        (`cut_target`), so it makes about `cuts` cuts however flat the cold top is. On FULL-only
        device trees over the kept `ColdOrder` (`_kept_cold`), elsewhere by sorting the
        leaves per pass."""
        if self._cold_kept and view.trims:
            yield from cold_level_walk(view, need, q, self._tail_chunk, self._kept_cold, self._cut_at_once)
            return
        yield from cold_level_walk(view, need, q, self._tail_chunk)

    def _kept_cold(self, view, q: float):
        """A pass's cold share off the kept `ColdOrder` (`ColdOrder.deep`: deepest first, as of the
        pass's start: what a pass changes enters at the next one's sync, as the sorted walk re-sorts
        then), or None when no leaf is evictable."""
        self._sync_cold()
        order = self._cold
        order.set_share(view, q)
        if not order.rec:
            return None
        deep = order.deep
        return (e[4] for e in deep), (-e[0] for e in deep)

    def _cut_at_once(self, leaf, target: int) -> int | None:
        """Where the walk removes its victims itself (`removes_now`), the cut whole (`_cut_tail`)."""
        if self._io is None:
            return None
        return self._cut_tail(leaf, target) if self._view.evictable_leaf(leaf) else 0


def _counter(node) -> int:
    return node.last_access_time  # SGLang's lru priority: its access counter
