"""The duel behind `adaptive` (SGLang's `radixflow-adaptive`): lru, or a tail cut over the coldest
share of the idle histories, chosen per evict call by shadow caches (docs/eviction.md,
"radixflow-adaptive").

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

The tail rule's cut (`water_level`, `cut_target`, `cut_cold`) runs over any `TreeView`. No SGLang here.
"""

from __future__ import annotations

import math
from collections import deque

from radixflow.cache.eviction.view import KEY_TOKENS, chain_top, cut_to

TAIL_SHARES = (0.125, 0.25, 0.375, 0.5)  # the duel's tail shadows (docs/eviction.md: with 0.75 and 1,
# more P99 wins and hit losses of 1.0-1.7 % on the sweep's short runs)
LEVEL_STEP = 16  # tokens: the tail rule levels in steps of at least this (a page of 16 at page 1: a call
# trims the few deepest cold leaves one step, not every cold leaf by a few tokens; issue #30's cost)

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
        """The 0.99 quantile of the missed tokens, interpolated between ranks (0 with no returns)."""
        if not self.missed:
            return 0.0
        v = sorted(self.missed)
        k = (len(v) - 1) * 0.99
        lo = math.floor(k)
        return v[lo] + (v[math.ceil(k)] - v[lo]) * (k - lo)

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


def water_level(depths, need: int, unit: int) -> int:
    """The deepest level (a multiple of `unit`) such that cutting every depth of `depths` (deepest
    first; any iterable, read only as far as the level) down to it frees at least `need` tokens (0
    when even that does not)."""
    total = 0
    it = iter(depths)
    d = next(it, None)
    n = 0
    while d is not None:
        total += d
        n += 1
        d = next(it, None)
        level = (total - need) // n  # the top n cut to `level` free `need`
        if level >= (0 if d is None else d):
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


def cut_cold(view, leaf, level: int):
    """One cold leaf of the tail rule cut down to the water `level` (nothing where it is no longer an
    evictable leaf); yields the victims, is sent back what each freed, returns the total."""
    if not view.is_leaf(leaf) or not view.evictable(leaf):
        return 0
    got = 0
    for victim in cut_to(view, leaf, level):
        got += yield victim
    return got


def level_unit(page: int) -> int:
    """The tail rule's levelling unit: a multiple of the page, and of `LEVEL_STEP` tokens where pages
    are smaller."""
    return max(page, -(-LEVEL_STEP // page) * page)


def by_recency(view) -> list:
    """The view's evictable leaves, least recently used first (ties: leaf order, the order of
    `view.leaves()`)."""
    return sorted(view.leaves(), key=view.last_access)


def sorted_cold(view, q: float):
    """A pass's cold share, sorted off the view: the `q` least recently used evictable leaves, deepest
    first (stable: the least recent first among equal depths), with their depths; None: no leaves."""
    leaves = by_recency(view)
    if not leaves:
        return None
    cold = leaves[: max(1, int(len(leaves) * q + 0.999))]
    cold.sort(key=view.depth, reverse=True)
    return cold, [view.depth(n) for n in cold]


def cold_level_walk(view, need: int, q: float, chunk_of=None, cold_of=sorted_cold, cut_now=None):
    """The tail rule: the `q` least recently used evictable leaves, cut from the deepest down to one
    level (`water_level`, in `level_unit` steps) until `need` tokens are freed; again over the leaves
    left if one level did not free enough. `cold_of(view, q)`: a pass's cold leaves deepest first and
    their depths (`sorted_cold`, or an order kept across calls), read only as far as the level and the
    cuts reach. `chunk_of(want, unit)`: where a call is batched, the least a cut takes (`cut_target`);
    None: cut to the level only. `cut_now(leaf, target)`: where the tree removes a cut whole now, what
    it freed (None: it cannot, the victims are yielded)."""
    unit = level_unit(view.unit)
    depth = view.depth
    freed = 0
    while freed < need:
        share = cold_of(view, q)
        if share is None:
            return
        cold, depths = share
        want = need - freed
        level = water_level(depths, want, unit)
        chunk = chunk_of(want, unit) if chunk_of is not None else 0
        progressed = False
        for leaf in cold:
            d = depth(leaf)
            if d <= level:
                break
            target = cut_target(d, level, chunk, unit)
            got = cut_now(leaf, target) if cut_now is not None else None
            if got is None:
                got = yield from cut_cold(view, leaf, target)
            freed += got
            progressed |= got > 0
            if freed >= need:
                return
        if not progressed:
            return


# ----------------------------------------------------------------------------- evidence
def first_tokens(view, path: list) -> tuple:
    """The first KEY_TOKENS tokens of a chain given top down."""
    out: list = []
    for n in path:
        out.extend(view.tokens(n)[: KEY_TOKENS - len(out)])
        if len(out) >= KEY_TOKENS:
            break
    return tuple(out)


class Evidence:
    """What the duel learns of a cache's requests, read off its tree (a `TreeView` with `tokens`,
    `namespace`, `children`, `num_children`): a request takes its hit (`begin`, from where its match
    ended), then its whole sequence is inserted (`inserted`: trajectory, private length, the hit the
    cache gave it, the budget). A trajectory is keyed (namespace, where its unshared chain starts,
    its first KEY_TOKENS tokens); a key that moves as branches come and go is carried over
    (`_rekey`), so the shadows never see one history as two."""

    def __init__(self, rule: DuelRule) -> None:
        self.rule = rule

    @staticmethod
    def match_key(view, namespace: str, tokens, node, depth: int) -> tuple:
        """The key of a request whose match ended at `node` (`depth` tokens; None or the root: nothing
        matched): a chain through `node` when it is a leaf, else a new one from its end."""
        if node is None or view.is_root(node) or view.has_children(node):
            start = depth
        else:
            start = view.start(chain_top(view, node))
        return namespace, start, tuple(tokens[start:start + KEY_TOKENS])

    def begin(self, key: tuple) -> None:
        self.rule.begin(key)

    def inserted(self, view, node, hit: int, budget: int) -> None:
        """A request's sequence now ends at `node`; `hit`: the tokens the cache gave it."""
        if view.is_root(node):
            return
        path = [node]  # the unshared chain, from the node up to where it starts
        up = view.parent(node)
        while not view.is_root(up) and view.num_children(up) == 1:
            path.append(up)
            up = view.parent(up)
        path.reverse()
        end = view.depth(node)
        start = view.start(path[0])
        namespace = view.namespace(path[0])
        key = (namespace, start, first_tokens(view, path))
        if key not in self.rule.seen:
            self._rekey(view, key, path, start, namespace)
        self.rule.observe(key, start, end - start, hit, budget)

    def _rekey(self, view, key: tuple, path: list, start: int, namespace: str) -> None:
        """A trajectory's key moves when the chain it runs in changes where it starts: a new branch off
        its chain (the part above becomes shared: its old key goes to the part below), or the other
        branches gone (its chain starts higher again)."""
        rule = self.rule
        d = start
        for i in range(1, len(path)):  # a chain that started lower down, before the branches above went
            d += len(view.tokens(path[i - 1]))
            low = (namespace, d, first_tokens(view, path[i:]))
            if low in rule.seen:
                rule.rename(low, key, start - d)
                return
        top = path[0]
        up = view.parent(top)
        if view.is_root(up) or view.num_children(up) != 2:
            return
        chain = [up]  # the chain `up` ran in before this branch came
        while not view.is_root(view.parent(chain[-1])) and view.num_children(view.parent(chain[-1])) == 1:
            chain.append(view.parent(chain[-1]))
        chain.reverse()
        high = (namespace, start - sum(len(view.tokens(n)) for n in chain), first_tokens(view, chain))
        if high in rule.seen:
            (other,) = [c for c in view.children(up) if c is not top]
            rest = [other]
            while view.num_children(rest[-1]) == 1 and sum(len(view.tokens(n)) for n in rest) < KEY_TOKENS:
                (nxt,) = view.children(rest[-1])
                rest.append(nxt)
            rule.rename(high, (namespace, start, first_tokens(view, rest)), start - high[1])
