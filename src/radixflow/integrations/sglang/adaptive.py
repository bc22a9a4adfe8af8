"""`radixflow-adaptive`: SGLang's own lru walk, or a tail cut over the coldest share of the idle
histories, chosen per evict call by a duel of shadow caches (docs/eviction.md, "radixflow-adaptive").

A `Shadow` is a light simulated cache: one token count per trajectory (where its unshared chain
starts, what it keeps of its private tokens, its last access), replaying the requests the real cache
sees under one fixed rule, in the real cache's budget. `DuelRule` runs five of them on the same
stream: lru, and the tail rule at cold shares q = 1/8, 1/4, 3/8, 1/2 (the q least recently used
idle trajectories levelled from the deepest down, water-filling). It answers lru (None) until
`WARMUP` returns were seen; after that the tail share whose shadow has the lowest P99 missed tokens,
if that P99 is at least `P99_GAIN` below lru's shadow and its hit tokens are not more than
`HIT_SLACK` below lru's; otherwise lru. A veto watches the real cache: while tails act, its hit
tokens per return against the lru shadow's on the same returns must not fall more than `VETO_SLACK`
below what they were while the cache ran lru; if they do, lru for `VETO_HOLD` returns.

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
from collections import deque

from sglang.srt.mem_cache.evict_policy import LRUStrategy
from sglang.srt.mem_cache.unified_cache.components.full import FullComponent

from radixflow.cache.eviction import cut_to
from radixflow.core.metrics import percentile
from radixflow.integrations.sglang.backend import ACCESS, FULL, LEAF, RadixflowFullComponent, SGLangTreeView

TAIL_SHARES = (0.125, 0.25, 0.375, 0.5)  # the duel's tail shadows (docs/eviction.md: with 0.75 and 1,
# more P99 wins and hit losses of 1.0-1.7 % on the sweep's short runs)
LEVEL_STEP = 16  # tokens: the tail rule levels in steps of at least this (a page of 16 at page 1: a call
# trims the few deepest cold leaves one step, not every cold leaf by a few tokens; issue #30's cost)
KEY_TOKENS = 64  # a trajectory is keyed by its chain's first tokens: enough to part users whose chains
# start inside a page of a shared prompt (a chat's system prompt: the same first 8 tokens for all)


class Shadow:
    """A simulated cache at trajectory grain under one rule: `q` None is lru (the least recently
    accessed trajectory loses its tail first, then the next), else the tail rule at cold share `q`.
    Counts hit tokens (start + what it kept) and missed tokens (private length now less what it
    kept) at every return."""

    WINDOW = 1024  # returns the P99 is taken over
    HIT_WINDOW = 256  # returns the hits are compared over (the first returns find every rule alike)

    def __init__(self, q: float | None = None) -> None:
        if q is not None and not 0.0 < q <= 1.0:
            raise ValueError(f"tail share must be in (0, 1], got {q}")
        self.q = q
        self.kept: dict[tuple, int] = {}  # private tokens kept, by trajectory key (only > 0)
        self.start: dict[tuple, int] = {}
        self.tick: dict[tuple, int] = {}
        self.total = 0
        self.hits = 0
        self.whole = 0  # returns that found nothing of their own kept
        self.recent: deque[int] = deque(maxlen=self.HIT_WINDOW)  # hit tokens of the latest returns
        self.missed: deque[int] = deque(maxlen=self.WINDOW)
        self.running: dict[tuple, int] = {}  # trajectories a running request holds: what it found kept

    def kept_of(self, key: tuple) -> int:
        return self.kept.get(key, 0)

    def begin(self, key: tuple, now: int) -> None:
        """A request of trajectory `key` takes its hit: what is kept now is its hit, and nothing of
        it is evicted until its insert (a lock)."""
        if key not in self.running:
            self.running[key] = self.kept.get(key, 0)
            if key in self.tick:
                self.tick[key] = now

    def access(self, key: tuple, start: int, length: int, prev: int | None, now: int, budget: int) -> None:
        """Trajectory `key` (chain from `start`) was inserted at `length` private tokens; `prev`: its
        length at its last access (None: first seen). Then evicts down to `budget`."""
        old = self.kept.get(key, 0)
        found = self.running.pop(key, old)
        if prev is not None:
            k = min(found, old, prev)
            self.whole += k == 0
            self.hits += start + k
            self.recent.append(start + k)
            self.missed.append(length - k)
        self.kept[key] = length
        self.start[key] = start
        self.tick[key] = now
        self.total += length - old
        if self.total > budget:
            self._evict(self.total - budget, key)

    def rename(self, old: tuple, new: tuple, shift: int) -> None:
        """`old` is `new` from now on, starting `shift` tokens deeper (those are shared now; negative:
        higher, the shared tokens above are its own again)."""
        if old in self.running:
            self.running[new] = max(0, self.running.pop(old) - shift)
        k = self.kept.pop(old, 0)
        tick = self.tick.pop(old, 0)
        self.start.pop(old, None)
        self.total -= k
        keep = max(0, k - shift) if k else max(0, -shift)
        if keep and new not in self.kept:
            self.kept[new] = keep
            self.tick[new] = tick
            self.start[new] = new[1]
            self.total += keep

    def p99(self) -> float:
        return percentile(list(self.missed), 0.99) if self.missed else 0.0

    def _evict(self, need: int, protect: tuple) -> None:
        run = self.running
        idle = sorted((k for k in self.kept if k != protect and k not in run), key=self.tick.__getitem__)
        if self.q is None:
            for k in idle:
                if need <= 0:
                    break
                need -= self._cut(k, self.kept[k] - need)
            return
        while need > 0 and idle:
            cold = idle[: max(1, int(len(idle) * self.q + 0.999))]
            level = _level(cold, self.start, self.kept, need)
            freed = 0
            for k in cold:
                freed += self._cut(k, max(0, level - self.start[k]))
            need -= freed
            idle = [k for k in idle if k in self.kept]
            if not freed:
                return

    def _cut(self, key: tuple, keep: int) -> int:
        """Shortens `key` to `keep` private tokens (0: forgotten); returns the tokens freed."""
        have = self.kept[key]
        keep = max(0, keep)
        if keep >= have:
            return 0
        self.total -= have - keep
        if keep:
            self.kept[key] = keep
        else:
            del self.kept[key], self.start[key], self.tick[key]
        return have - keep


def _level(keys: list, start: dict, kept: dict, need: int) -> int:
    """The deepest depth L such that cutting every trajectory of `keys` to max(L, its start) frees at
    least `need` tokens (0 when even that does not)."""

    def freed(level: int) -> int:
        return sum(max(0, start[k] + kept[k] - max(level, start[k])) for k in keys)

    lo, hi = 0, max(start[k] + kept[k] for k in keys)
    if freed(0) < need:
        return 0
    while lo < hi:  # the largest level that still frees `need`
        mid = (lo + hi + 1) // 2
        if freed(mid) >= need:
            lo = mid
        else:
            hi = mid - 1
    return lo


class DuelRule:
    """The choice of `radixflow-adaptive` per evict call: None (lru) or a tail share q."""

    WARMUP = 64  # returns before anything but lru
    EVERY = 8  # returns between duels
    HIT_SLACK = 0.0  # a tail shadow may trail lru's hit tokens (latest returns) by at most this share
    P99_GAIN = 0.10  # ... and must cut lru's P99 missed by at least this share
    WHOLE = 0.01  # share of returns lru's shadow must lose whole before a tail is considered
    EARLY_Q = None  # during the warm-up: this cold share once lru's shadow has lost 1 % whole (off)
    VETO_SLACK = 0.01
    VETO_MIN = 32  # returns under tails before the veto may act
    VETO_HOLD = 256  # returns of lru after a veto

    def __init__(self, shares=TAIL_SHARES) -> None:
        self.lru = Shadow(None)
        self.tails = [Shadow(q) for q in shares]
        self.seen: dict[tuple, int] = {}  # private length at the last access, by trajectory key
        self.returns = 0
        self.now = 0
        self.choice: float | None = None
        self.mode: float | None = None  # what the last evict call did
        self.vetoes = 0
        self._hold_until = 0
        self._lru_hits = [0, 0]  # (real, lru shadow) hit tokens on returns before any tail call
        self.tail_calls = 0
        self._tail_hits: deque[tuple[int, int]] = deque(maxlen=256)  # the same while it cut tails

    @property
    def shadows(self) -> list[Shadow]:
        return [self.lru, *self.tails]

    def begin(self, key: tuple) -> None:
        """A request of trajectory `key` locked its hit in the real cache (its start)."""
        self.now += 1
        for s in self.shadows:
            s.begin(key, self.now)

    def rename(self, old: tuple, new: tuple, shift: int) -> None:
        """Trajectory `old` is `new` now, its start `shift` tokens deeper (negative: higher)."""
        if old in self.seen:
            self.seen[new] = max(0, self.seen.pop(old) - shift)
        for s in self.shadows:
            s.rename(old, new, shift)

    def observe(self, key: tuple, start: int, length: int, hit: int, budget: int) -> None:
        """One insert of the real cache: trajectory `key`, private `length` tokens from `start`,
        `hit` tokens the real cache gave the request, `budget` private tokens the pool holds now."""
        self.now += 1
        prev = self.seen.get(key)
        if prev is not None:
            self.returns += 1
            ghost = start + min(self.lru.kept_of(key), prev)
            if self.mode is None and not self.tail_calls:
                self._lru_hits[0] += hit
                self._lru_hits[1] += ghost
            elif self.mode is not None:
                self._tail_hits.append((hit, ghost))
        for s in self.shadows:
            s.access(key, start, length, prev, self.now, budget)
        self.seen[key] = length
        if prev is not None:
            self._veto()
            if self.returns >= self.WARMUP and self.returns % self.EVERY == 0:
                self.choice = self.duel()

    def duel(self) -> float | None:
        """The tail share whose shadow wins against lru's (lowest P99, hits kept), or None; None too
        while lru's shadow loses fewer than `WHOLE` of the returns whole (its P99 is no whole history:
        a tail cut can only add to it)."""
        if self.lru.whole < self.WHOLE * self.returns:
            return None
        base_p99, base_hits = self.lru.p99(), sum(self.lru.recent)
        best, best_p99 = None, base_p99 * (1 - self.P99_GAIN)
        for s in self.tails:
            p = s.p99()
            if sum(s.recent) >= base_hits * (1 - self.HIT_SLACK) and p <= best_p99 and (best is None or p < best_p99):
                best, best_p99 = s.q, p
        return best

    def _veto(self) -> None:
        tail = self._tail_hits
        real_lru, ghost_lru = self._lru_hits
        if not ghost_lru or len(tail) < self.VETO_MIN:
            return
        real, ghost = sum(h for h, _ in tail), sum(g for _, g in tail)
        if real < ghost * (real_lru / ghost_lru) * (1 - self.VETO_SLACK):
            self.vetoes += 1
            self._hold_until = self.returns + self.VETO_HOLD
            tail.clear()

    def decide(self) -> float | None:
        """None: this evict call is lru's; else the cold share of the tail cut."""
        if self.returns < self.WARMUP:
            early = self.EARLY_Q is not None and self.lru.whole >= max(2, self.WHOLE * self.returns)
            self.mode = self.EARLY_Q if early and self.returns >= self._hold_until else None
        elif self.returns < self._hold_until:
            self.mode = None
        else:
            self.mode = self.choice
        self.tail_calls += self.mode is not None
        return self.mode


class FixedRule(DuelRule):
    """One rule on every call (the oracle's fixed rules, tests): None is lru, q a tail share. Its
    shadows still run, so what they predict can be set beside what the real cache did."""

    def __init__(self, q: float | None) -> None:
        super().__init__()
        self.q = q

    def decide(self) -> float | None:
        self.mode = self.q
        return self.q


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
                got = yield from _cut_cold(view, leaf, target)
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
                    got = yield from _cut_cold(view, leaf, target)
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


def water_level(depths: list[int], need: int, unit: int) -> int:
    """The deepest level (a multiple of `unit`) such that cutting every depth of `depths` (deepest
    first) down to it frees at least `need` tokens (0 when even that does not)."""
    total = 0
    for i, d in enumerate(depths):
        total += d
        nxt = depths[i + 1] if i + 1 < len(depths) else 0
        level = (total - need) // (i + 1)  # the top i + 1 cut to `level` free `need`
        if level >= nxt:
            return max(0, level // unit * unit)
    return 0


def cut_target(depth: int, level: int, chunk: int, unit: int) -> int:
    """Where the tail rule cuts a cold leaf ending at `depth` (above the water `level`): at the level,
    or, in a batched call (`chunk` > 0), at least `chunk` tokens down (a multiple of `unit`), so a
    flat top of cold histories gives up the call's demand in a few cuts, the least recent first,
    instead of every one of them shaved by a unit."""
    if not chunk:
        return level
    return min(level, max(0, (depth - chunk) // unit * unit))


def _cut_cold(view, leaf, level: int):
    """One cold leaf of the tail rule cut down to the water `level` (nothing where it is no longer an
    evictable leaf); yields the victims, is sent back what each freed, returns the total."""
    if not view.is_leaf(leaf) or not view.evictable(leaf):
        return 0
    got = 0
    for victim in cut_to(view, leaf, level):
        got += yield victim
    return got
