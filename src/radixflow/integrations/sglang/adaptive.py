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

import bisect
import contextlib
import heapq
import itertools
import os

from sglang.srt.mem_cache.evict_policy import LRUStrategy
from sglang.srt.mem_cache.unified_cache.components.full import FullComponent

from radixflow.cache.eviction.duel import (  # noqa: F401  (Shadow, TAIL_SHARES: the duel's names, as before)
    KEY_TOKENS,
    LEVEL_STEP,
    TAIL_SHARES,
    DuelRule,
    FixedRule,
    Shadow,
    cut_cold,
    cut_target,
    water_level,
)
from radixflow.integrations.sglang.backend import ACCESS, FULL, LEAF, RadixflowFullComponent, SGLangTreeView


def cold_order() -> str:
    """RADIXFLOW_SGLANG_COLD_ORDER: `kept` (default; FULL-only device trees: the tail rule's cold
    leaves kept across calls, `ColdOrder`) or `sorted` (every evictable leaf sorted by recency per
    pass, the walk it replaces; the same decisions)."""
    raw = os.environ.get("RADIXFLOW_SGLANG_COLD_ORDER", "kept")
    if raw not in ("kept", "sorted"):
        raise ValueError(f"RADIXFLOW_SGLANG_COLD_ORDER must be kept or sorted, got {raw!r}")
    return raw


class ColdOrder:
    """The tail rule's cold leaves kept across calls: every evictable leaf's recency key (our stamp,
    then leaf order) in a sorted list, the `q` share with the lowest keys (`cold`, the same count as
    `leaves[: max(1, int(len(leaves) * q + 0.999))]`) in a second sorted list by (-depth, recency),
    so that a pass takes its deepest cold leaves in the order a sort of the cold share by depth
    gives (stable: the least recent first among equal depths) without sorting it. Fed by the
    component's change feed (leaves joining and leaving SGLang's set, trims, re-stamps): a change
    costs O(log L) plus the leaves it moves across the cold boundary (and a memmove of the lists);
    a pass reads its t leaves off the front of `deep`: nothing changes the lists during a pass (the
    feed enters at the next pass's sync)."""

    __slots__ = ("rec", "node_at", "key_of", "q", "bound", "cold", "deep", "_uid")

    def __init__(self) -> None:
        self.rec: list[tuple] = []  # (stamp, leaf order) of every evictable leaf, sorted
        self.node_at: dict[tuple, object] = {}
        self.key_of: dict = {}  # leaf -> its key in `rec`
        self.q: float | None = None
        self.bound: tuple | None = None  # the key of the coldest share's warmest leaf
        self.cold: dict = {}  # cold leaf -> its entry in `deep`
        self.deep: list = []  # (-depth, stamp, leaf order, uid, leaf) of the cold leaves, sorted
        self._uid = 0

    def reset(self) -> None:
        self.__init__()

    def count(self) -> int:
        n = len(self.rec)
        return max(1, int(n * self.q + 0.999)) if n else 0

    def update(self, view, nodes, members, seq) -> None:
        """Re-keys `nodes` (present in `members`, SGLang's evictable set: entered at their key; else
        taken out), then moves the cold boundary."""
        rec, node_at, key_of = self.rec, self.node_at, self.key_of
        for n in nodes:
            old = key_of.pop(n, None)
            if old is not None:
                del rec[bisect.bisect_left(rec, old)]
                del node_at[old]
            if n in members:
                md = n.component_data[FULL].metadata
                order = md.get(LEAF)
                if order is None:
                    order = md[LEAF] = seq()
                key = (md.get(ACCESS, 0), order)
                bisect.insort(rec, key)
                node_at[key] = n
                key_of[n] = key
        if self.q is not None:
            self._move_bound(view, nodes)

    def set_share(self, view, q: float) -> None:
        if q == self.q:
            return
        self.q, self.bound, self.cold, self.deep = q, None, {}, []
        self._move_bound(view, ())

    def _move_bound(self, view, changed) -> None:
        rec, node_at = self.rec, self.node_at
        k = self.count()
        new = rec[k - 1] if k else None
        old = self.bound
        if new is None:
            self.cold, self.deep = {}, []
        elif old is None:
            for key in rec[:k]:
                self._join(view, node_at[key])
        elif new > old:
            for key in rec[bisect.bisect_right(rec, old):k]:
                self._join(view, node_at[key])
        elif new < old:
            for key in rec[k:bisect.bisect_right(rec, old)]:
                self._leave(node_at[key])
        self.bound = new
        key_of = self.key_of
        for n in changed:
            key = key_of.get(n)
            if key is not None and key <= new:
                self._join(view, n)
            else:
                self._leave(n)

    def _join(self, view, n) -> None:
        self._leave(n)
        self._uid += 1
        key = self.key_of[n]
        e = (-view.depth(n), key[0], key[1], self._uid, n)
        self.cold[n] = e
        bisect.insort(self.deep, e)

    def _leave(self, n) -> None:
        e = self.cold.pop(n, None)
        if e is not None:
            deep = self.deep
            del deep[bisect.bisect_left(deep, e)]

    def order(self) -> list:
        """The cold leaves in the order a pass takes them (tests)."""
        return [e[4] for e in self.deep]


_FORCED: list = []  # cold shares (None: lru) that caches built now hold on every call; the last counts


@contextlib.contextmanager
def forced(q: float | None):
    """Caches built inside run a `FixedRule(q)` instead of the duel (the sweep's oracle, tests)."""
    _FORCED.append(q)
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
        self.rule = FixedRule(_FORCED[-1]) if _FORCED else DuelRule()
        self.q: float | None = None
        self._sglang_lru = False  # this call is SGLang's own walk (a tree the component cannot cut itself)
        self.tail_calls = self.lru_calls = 0
        self._inserts = 0
        self._shared = 0
        self._matched: dict[int, tuple] = {}  # node id -> trajectory key of the last match ending there
        self._cold_kept = cold_order() == "kept"
        self._cold = ColdOrder()
        # the lru calls' heap kept across calls (`kept_lru_walk`): (last_access_time, leaf) entries
        self._lru_heap: list = []
        self._lru_live: dict = {}

    # --------------------------------------------------------------- evidence
    def finalize_match_result_in_cache(self, params, result):
        """Where the request's trajectory starts, from its tokens and where the match ended: a chain
        through the last matched node when it is a leaf, else a new one from its end (the key the
        insert will give it). Kept by node until a lock takes it (a match alone is a probe)."""
        result = super().finalize_match_result_in_cache(params, result)
        core = self.tree_core
        node = result.last_device_node
        node = core.node_by_id(node) if isinstance(node, int) else node
        root = core.root_node
        if node is None or params.key is None:
            return result
        depth = 0
        n = node
        while n is not root:
            depth += len(n.key)
            n = n.parent
        if node is root or node.children:
            start = depth
        else:
            top = node
            while top.parent is not root and len(top.parent.children) == 1:
                top = top.parent
            start = depth - _down_from(top, node)
        extra = params.key.extra_key
        tokens = params.key.token_ids
        if len(self._matched) > 4096:
            self._matched.clear()  # probes never locked
        self._matched[node.id] = ("" if extra is None else str(extra), start, tuple(tokens[start:start + KEY_TOKENS]))
        return result

    def acquire_component_lock(self, node, result, lock_host: bool = False):
        result = super().acquire_component_lock(node, result, lock_host)
        if not lock_host:
            key = self._matched.pop(node.id, None)
            if key is not None:
                self.rule.begin(key)
        return result

    def commit_insert_component_data(self, node, is_new_leaf, params, result, cache_actions) -> None:
        super().commit_insert_component_data(node, is_new_leaf, params, result, cache_actions)
        core = self.tree_core
        root = core.root_node
        if node is root:
            return
        path = [node]  # the unshared chain, from the leaf up to where it starts
        while path[-1].parent is not root and len(path[-1].parent.children) == 1:
            path.append(path[-1].parent)
        path.reverse()
        end = _depth(node, root)
        start = end - sum(len(n.key) for n in path)
        extra = path[0].key.extra_key
        extra = "" if extra is None else str(extra)
        key = (extra, start, _first_tokens(path))
        if key not in self.rule.seen:
            self._rekey(key, path, start, extra)
        if self._inserts % self.SHARED_EVERY == 0:
            self._shared = self._shared_tokens()
        self._inserts += 1
        tree = core.component_evictable_size(FULL) + core.component_protected_size(FULL)
        free = self.alloc.available_size() if self.alloc is not None else 0
        budget = max(0, free + tree - self._shared)
        self.rule.observe(key, start, end - start, int(getattr(params, "prev_prefix_len", 0) or 0), budget)

    def _rekey(self, key: tuple, path: list, start: int, extra: str) -> None:
        """A trajectory's key moves when the chain it runs in changes where it starts: a new branch off
        its chain (the part above becomes shared: its old key goes to the part below), or the other
        branches gone (its chain starts higher again). Carries the shadows over, so that neither
        looks like a new trajectory beside a stale one."""
        rule = self.rule
        d = start
        for i in range(1, len(path)):  # a chain that started lower down, before the branches above went
            d += len(path[i - 1].key)
            low = (extra, d, _first_tokens(path[i:]))
            if low in rule.seen:
                rule.rename(low, key, start - d)
                return
        top = path[0]
        up = top.parent
        root = self.tree_core.root_node
        if up is root or len(up.children) != 2:
            return
        chain = [up]  # the chain `up` ran in before this branch came
        while chain[-1].parent is not root and len(chain[-1].parent.children) == 1:
            chain.append(chain[-1].parent)
        chain.reverse()
        high = (extra, start - sum(len(n.key) for n in chain), _first_tokens(chain))
        if high in rule.seen:
            (other,) = [c for c in up.children.values() if c is not top]
            rest = [other]
            while len(rest[-1].children) == 1 and sum(len(n.key) for n in rest) < KEY_TOKENS:
                (nxt,) = rest[-1].children.values()
                rest.append(nxt)
            rule.rename(high, (extra, start, _first_tokens(rest)), start - high[1])

    def _shared_tokens(self) -> int:
        """Device tokens not on any leaf's unshared chain: the shared prefixes (a walk of the tree)."""
        core = self.tree_core
        root = core.root_node
        private = 0
        for n in core._node_arena.values():
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
        heap, live = self._lru_heap, self._lru_live
        pop, push = heapq.heappop, heapq.heappush
        freed = 0
        self._sync_cold()
        members = self.tree_core.evictable_device_leaves
        while freed < need:
            while heap:
                e = pop(heap)
                x = e[1]
                if live.get(x) is not e:
                    continue
                if x not in members:
                    del live[x]
                    continue
                t = x.last_access_time
                if e[0] != t:
                    e = live[x] = (t, x)
                    push(heap, e)
                    continue
                break
            else:
                return
            del live[x]
            if self.removes_now:
                fresh = members.fresh  # only grows until the next drain: new notes are appended
                seen = len(fresh)
                freed += self.drop_now(x)
                if len(fresh) > seen:
                    for n in itertools.islice(fresh, seen, None):
                        if n in members:  # joined (a victim's parent); a victim's own note is a departure
                            e = live[n] = (n.last_access_time, n)
                            push(heap, e)
            else:
                freed += yield x
                self._sync_cold()
                members = self.tree_core.evictable_device_leaves

    def _plain_lru(self) -> bool:
        """SGLang's FULL priority is its lru's (the node's counter), not a session-aware one."""
        self._ensure_eviction_strategy()
        return getattr(self.session_ref_eviction_strategy, "__func__", None) is LRUStrategy.get_priority

    def lru_walk(self, need: int):
        """SGLang's own lru walk (`FullComponent._evict_device_*`), victim for victim: a heap of
        (priority, node) over the evictable leaves, built in their set's order and heapified, popped
        until `need` is freed, a victim's parent pushed once it is an evictable leaf. The component
        removes the victims itself, the whole call in one SGLang step where it may (as its tail
        cuts), instead of one round trip through the cache per victim."""
        core = self.tree_core
        self._ensure_eviction_strategy()
        prio = self.session_ref_eviction_strategy
        plain = getattr(prio, "__func__", None) is LRUStrategy.get_priority  # lru: the node's counter
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
        self._lru_heap, self._lru_live = [], {}

    def _enter_changes(self) -> None:
        """On every insert (the request path): what changed enters the cold order now, so a tail
        call only enters what changed since the last request."""
        if self._walk is None and self._cold_kept and self._one_step():
            self._sync_cold()

    def _sync_cold(self) -> None:
        view = self._kept_view()
        changes = view.changes()  # every evictable leaf after a reset (`_orders_reset` ran first)
        members = self.tree_core.evictable_device_leaves
        self._cold.update(view, changes, members, self.next_leaf_seq)
        heap, live = self._lru_heap, self._lru_live
        for n in changes:
            if n in members:
                e = (n.last_access_time, n)
                live[n] = e
                heapq.heappush(heap, e)
            else:
                live.pop(n, None)
        if len(heap) > 3 * len(live) // 2 + 32:
            heap[:] = [e for e in heap if live.get(e[1]) is e]
            heapq.heapify(heap)

    def cold_level_walk(self, view, need: int, q: float):
        """The tail rule: the `q` least recently used evictable leaves (our stamps; ties: the order
        they became leaves), cut from the deepest down to one level (a multiple of the page, and of
        `LEVEL_STEP` tokens where pages are smaller) until `need` tokens are freed; again over the
        leaves left if one level did not free enough. A call that runs in one step (a FULL-only
        device tree, as rr-tail's) frees `cut_ahead` times its demand (RADIXFLOW_SGLANG_CUT_AHEAD)
        and, with RADIXFLOW_SGLANG_CUTS_PER_CALL > 0, cuts each cold leaf at least a chunk down
        (`cut_target`), so it makes about `cuts` cuts however flat the cold top is. On FULL-only
        device trees over the kept `ColdOrder` (`kept_cold_level_walk`), elsewhere by sorting the
        leaves per pass."""
        unit = max(view.unit, -(-LEVEL_STEP // view.unit) * view.unit)
        if self._cold_kept and view.trims:
            yield from self.kept_cold_level_walk(view, need, q, unit)
            return
        depth = view.depth
        freed = 0
        while freed < need:
            leaves = self._by_recency()
            if not leaves:
                return
            cold = leaves[: max(1, int(len(leaves) * q + 0.999))]
            cold.sort(key=depth, reverse=True)  # stable: the least recent first among equal depths
            level = water_level([depth(n) for n in cold], need - freed, unit)
            chunk = self._tail_chunk(need - freed, unit)
            progressed = False
            for leaf in cold:
                d = depth(leaf)
                if d <= level:
                    break
                target = cut_target(d, level, chunk, unit)
                got = yield from cut_cold(view, leaf, target)
                freed += got
                progressed |= got > 0
                if freed >= need:
                    return
            if not progressed:
                return

    def kept_cold_level_walk(self, view, need: int, q: float, unit: int):
        """`cold_level_walk` over the kept `ColdOrder`, the same victims: per pass the cold share
        as of the pass's start, read deepest first off `ColdOrder.deep` only as far as the water
        level and the cuts reach (the list does not change during a pass: what a pass changes
        enters at the next one's sync, as the sorted walk re-sorts then). Where the walk removes
        its victims itself, each cold leaf is cut at once (`_cut_tail`)."""
        order, depth = self._cold, view.depth
        is_leaf, evictable = view.is_leaf, view.evictable
        freed = 0
        while freed < need:
            self._sync_cold()
            order.set_share(view, q)
            if not order.rec:
                return
            deep = order.deep
            want = need - freed
            level = 0
            total = 0
            last = len(deep) - 1
            for i, e in enumerate(deep):  # `water_level` over the cold depths, deepest first
                total -= e[0]
                nxt = -deep[i + 1][0] if i < last else 0
                lv = (total - want) // (i + 1)
                if lv >= nxt:
                    level = max(0, lv // unit * unit)
                    break
            chunk = self._tail_chunk(want, unit)
            progressed = False
            io = self._io
            for e in deep:
                leaf = e[4]
                d = depth(leaf)
                if d <= level:
                    break
                target = cut_target(d, level, chunk, unit)
                if io is not None:
                    got = self._cut_tail(view, leaf, target, *io) if is_leaf(leaf) and evictable(leaf) else 0
                else:
                    got = yield from cut_cold(view, leaf, target)
                freed += got
                progressed |= got > 0
                if freed >= need:
                    return
            if not progressed:
                return

    def _by_recency(self) -> list:
        keyed = []
        for n in self.tree_core.evictable_device_leaves:
            md = n.component_data[FULL].metadata
            seq = md.get(LEAF)
            if seq is None:
                seq = md[LEAF] = self.next_leaf_seq()
            keyed.append((md.get(ACCESS, 0), seq, n))
        keyed.sort(key=_stamp_and_seq)
        return [n for _, _, n in keyed]


def _stamp_and_seq(t):
    return t[0], t[1]


def _depth(node, root) -> int:
    d = 0
    while node is not root:
        d += len(node.key)
        node = node.parent
    return d


def _first_tokens(path: list) -> tuple:
    """The first KEY_TOKENS tokens of a chain given top down."""
    out: list = []
    for n in path:
        out.extend(n.key.token_ids[: KEY_TOKENS - len(out)])
        if len(out) >= KEY_TOKENS:
            break
    return tuple(out)


def _down_from(top, node) -> int:
    """Tokens on the path from `top` down to `node`, both included."""
    total = len(node.key)
    while node is not top:
        node = node.parent
        total += len(node.key)
    return total
