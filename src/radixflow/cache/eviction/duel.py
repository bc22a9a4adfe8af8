"""The duel behind `adaptive` (SGLang's `radixflow-adaptive`): lru, or a tail cut over the coldest
share of the idle histories, chosen per evict call by shadow caches (docs/eviction.md,
"radixflow-adaptive").

A `Shadow` is a light simulated cache: keys and token counts per trajectory (where its unshared
chain starts, what it keeps of its private tokens, its last access; for lru where its nodes start),
no tensors, replaying the requests the real cache sees under one fixed rule in the real cache's
budget. `DuelRule` runs nine of them on the same stream: lru (freeing whole nodes, as SGLang's lru
does), and the tail rule at the sweep oracle's cold shares q = 1/8 ... 1 (the q least recently used
idle trajectories levelled from the deepest down). It answers lru (None) until `MIN_RETURNS`
returns and `WHOLE` whole losses of lru's shadow; then, every `EVERY` returns, the tail share whose
shadow has the lowest P99 missed tokens at least `P99_GAIN` below lru's shadow's, with its hits not
more than `HIT_SLACK` (window) and `RECENT_SLACK` (latest returns) below lru's; the share in use
stays within `STAY_SLACK` unless another is `SWITCH_GAIN` better, and goes back to lru at the first
duel its shadow shows a hit loss. A veto watches the real cache: from its first tail call, its hit
tokens on returns against the lru shadow's on the same returns must not fall more than
`VETO_SLACK` below the ratio they had while the cache ran lru; if they do, lru for `VETO_HOLD`
returns. Why these margins, and what they cost: docs/eviction.md, "Issue #43".

The tail rule's cut (`water_level`, `cut_target`, `cut_cold`) runs over any `TreeView`. No SGLang here.
"""

from __future__ import annotations

import bisect
import itertools
from array import array
from collections import deque

from radixflow.cache.eviction.view import KEY_TOKENS, chain_top, cut_to

# the duel's tail shadows: the oracle's eight cold shares (sweep.ORACLE_SHARES), so the duel can pick
# whichever of them the sweep's oracle would (docs/eviction.md, "radixflow-adaptive")
TAIL_SHARES = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0)
LEVEL_STEP = 16  # tokens: the tail rule levels in steps of at least this (a page of 16 at page 1: a call
# trims the few deepest cold leaves one step, not every cold leaf by a few tokens; issue #30's cost)

class Shadow:
    """A simulated cache at trajectory grain under one rule: `q` None is lru (the least recently
    accessed idle trajectory loses its tail first, then the next), else the tail rule at cold share
    `q`. Counts, at every return, hit tokens (start + what it kept) and missed tokens (private length
    now less what it kept), over the last `WINDOW` returns, and over the last `RECENT` for the hits.
    Keys and token counts only: no tensors, no tree."""

    WINDOW = 1024  # returns the P99 and the hit sum are taken over
    RECENT = 128  # returns the quick return to lru looks at

    def __init__(self, q: float | None = None) -> None:
        if q is not None and not 0.0 < q <= 1.0:
            raise ValueError(f"tail share must be in (0, 1], got {q}")
        self.q = q
        self.kept: dict[tuple, int] = {}  # private tokens kept, by trajectory key (only > 0)
        self.start: dict[tuple, int] = {}
        self.tick: dict[tuple, int] = {}  # last access, in recency order (oldest first)
        self._stale = False  # a rename put a key out of recency order
        # lru only: where each kept chain's nodes start (private offsets > 0): SGLang's lru frees a
        # whole leaf node at a time, so its shadow does too (a returning history's first node, its
        # task and files, goes at once, not a page off it)
        self.bounds: dict[tuple, list[int]] | None = {} if q is None else None
        self.total = 0
        self.hits = 0  # hit tokens of every return
        self.whole = 0  # returns that found nothing of their own kept
        self.running: dict[tuple, int] = {}  # trajectories a running request holds: what it found kept
        self._missed: deque[int] = deque()
        self._sorted: list[int] = []  # `_missed`, sorted (the P99 without a sort per duel)
        self._hits: deque[int] = deque()
        self.hit_sum = 0  # hit tokens over the window
        self.recent_sum = 0  # ... over the last RECENT returns

    @property
    def missed(self) -> list[int]:
        return list(self._missed)

    def kept_of(self, key: tuple) -> int:
        return self.kept.get(key, 0)

    def _touch(self, key: tuple, now: int) -> None:
        tick = self.tick
        tick.pop(key, None)
        tick[key] = now

    def begin(self, key: tuple, now: int) -> None:
        """A request of trajectory `key` takes its hit: what is kept now is its hit, and nothing of
        it is evicted until its insert (a lock)."""
        if key not in self.running:
            self.running[key] = self.kept.get(key, 0)
            if key in self.tick:
                self._touch(key, now)

    def access(self, key: tuple, start: int, length: int, prev: int | None, now: int, budget: int) -> None:
        """Trajectory `key` (chain from `start`) was inserted at `length` private tokens; `prev`: its
        length at its last access (None: first seen). Then evicts down to `budget`."""
        old = self.kept.get(key, 0)
        found = self.running.pop(key, old)
        if prev is not None:
            k = min(found, old, prev)
            self.whole += k == 0
            self._count(start + k, length - k)
        if self.bounds is not None:
            b = self.bounds.setdefault(key, [])
            while b and b[-1] >= old:
                b.pop()
            if 0 < old < length:
                b.append(old)
        self.kept[key] = length
        self.start[key] = start
        self._touch(key, now)
        self.total += length - old
        if self.total > budget:
            self._evict(self.total - budget, key)

    def _count(self, hit: int, miss: int) -> None:
        self.hits += hit
        hits, missed, srt = self._hits, self._missed, self._sorted
        hits.append(hit)
        self.hit_sum += hit
        self.recent_sum += hit
        if len(hits) > self.RECENT:
            self.recent_sum -= hits[-self.RECENT - 1]
        missed.append(miss)
        bisect.insort(srt, miss)
        if len(missed) > self.WINDOW:
            self.hit_sum -= hits.popleft()
            del srt[bisect.bisect_left(srt, missed.popleft())]

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
        bounds = self.bounds
        moved = bounds.pop(old, None) if bounds is not None else None
        if keep and new not in self.kept:
            if bounds is not None:
                bounds[new] = [b - shift for b in moved or () if 0 < b - shift < keep]
            self.kept[new] = keep
            self.tick[new] = tick
            self.start[new] = new[1]
            self.total += keep
            self._stale = True

    def p99(self) -> float:
        srt = self._sorted
        if not srt:
            return 0.0
        k = (len(srt) - 1) * 0.99  # as core.metrics.percentile
        lo = int(k)
        hi = min(lo + 1, len(srt) - 1)
        return srt[lo] + (srt[hi] - srt[lo]) * (k - lo)

    def _idle(self, protect: tuple):
        if self._stale:
            self.tick = dict(sorted(self.tick.items(), key=_second))
            self._stale = False
        run = self.running
        return (k for k in self.tick if k != protect and k not in run)

    def _evict(self, need: int, protect: tuple) -> None:
        kept = self.kept
        if self.q is None:
            bounds = self.bounds
            while need > 0:  # the least recent idle trajectories, a few at a time (cuts drop keys)
                batch = list(itertools.islice(self._idle(protect), 4))
                if not batch:
                    return
                for k in batch:
                    b = bounds.get(k)
                    while need > 0 and k in kept:
                        need -= self._cut(k, b.pop() if b else 0)
                    if need <= 0:
                        return
            return
        start, run, tick = self.start, self.running, self.tick
        while need > 0:
            busy = sum(1 for k in run if k in tick) + (protect in tick and protect not in run)
            idle = len(tick) - busy
            if idle <= 0:
                return
            cold = list(itertools.islice(self._idle(protect), max(1, int(idle * self.q + 0.999))))
            level = _level(cold, start, kept, need)
            freed = 0
            for k in cold:
                if start[k] + kept[k] > level:  # (a chain ending at or above the level keeps all it has)
                    freed += self._cut(k, level - start[k])
            need -= freed
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
            if self.bounds is not None:
                self.bounds.pop(key, None)
        return have - keep


def _second(item):
    return item[1]


def _level(keys, start: dict, kept: dict, need: int) -> int:
    """The deepest depth L such that cutting every trajectory of `keys` to max(L, its start) frees at
    least `need` tokens (0 when even that does not). One pass down the chains' ends and starts:
    between two of them the tokens freed grow by the number of chains the level is inside. (The ends
    and the starts are sorted apart, as ints, and merged; at a tie an end comes first.)"""
    starts = [start[k] for k in keys]
    ends = [s + kept[k] for s, k in zip(starts, keys)]
    if not ends:
        return 0
    ends.sort(reverse=True)
    starts.sort(reverse=True)
    n = len(ends)
    freed = slope = i = j = 0
    cur = ends[0]
    while j < n:
        if i < n and ends[i] >= starts[j]:
            p = ends[i]
            i += 1
            step = 1
        else:
            p = starts[j]
            j += 1
            step = -1
        if p < cur:
            more = freed + slope * (cur - p)
            if more >= need:
                return cur - -(-(need - freed) // slope)
            freed, cur = more, p
        slope += step
    return 0


class DuelRule:
    """The choice of `radixflow-adaptive` per evict call: None (lru) or a tail share q."""

    MIN_RETURNS = 8  # returns before anything but lru
    EVERY = 2  # returns between duels
    P99_GAIN = 0.10  # a tail shadow must cut lru's shadow's P99 missed by at least this share ...
    HIT_SLACK = 0.005  # ... with its hit tokens (window) not more than this share below lru's shadow's
    RECENT_SLACK = 0.02  # ... nor its latest returns' (Shadow.RECENT) more than this below: else lru at once
    STAY_SLACK = 0.005  # the share in use stays while its hits are not more than this below lru's shadow's
    SWITCH_GAIN = 0.05  # another share replaces it only with a P99 this much lower
    WHOLE = 3  # returns lru's shadow must have lost whole before a tail is considered
    VETO_SLACK = 0.005  # the real cache's hits per return may trail lru's shadow's by this share ...
    VETO_MIN = 16  # ... over at least this many returns since the first tail call
    VETO_HOLD = 256  # returns of lru after the first veto (doubled at each further one)

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
        self.evicting = False  # an evict call was made (the veto's ratio counts from then on)
        self._tail_hits = [0, 0, 0]  # (real, lru shadow, returns) since the first tail call (or a veto)

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
            ghost = start + min(self.lru.kept_of(key), self.lru.running.get(key, prev), prev)
            if not self.tail_calls and self.evicting:
                self._lru_hits[0] += hit
                self._lru_hits[1] += ghost
            else:
                t = self._tail_hits
                t[0] += hit
                t[1] += ghost
                t[2] += 1
        for s in self.shadows:
            s.access(key, start, length, prev, self.now, budget)
        self.seen[key] = length
        if prev is not None:
            self._veto()
            if self.returns >= self.MIN_RETURNS and self.returns % self.EVERY == 0:
                self.choice = self.duel()

    def duel(self) -> float | None:
        """The tail share whose shadow beats lru's: the lowest P99 among those at least `P99_GAIN`
        below lru's shadow's, with the hits kept (`HIT_SLACK` over the window, `RECENT_SLACK` over
        the latest returns); None (lru) while none does. The share in use stays while it keeps the
        hits within `STAY_SLACK` and its P99 below lru's, unless another is `SWITCH_GAIN` lower."""
        base = self.lru
        if base.whole < self.WHOLE:
            return None
        lru_p99 = base.p99()
        recent = base.recent_sum * (1 - self.RECENT_SLACK)
        cur = None
        if self.choice is not None:
            for s in self.tails:
                if s.q == self.choice:
                    cur = s
            if cur is not None and not (cur.hit_sum >= base.hit_sum * (1 - self.STAY_SLACK)
                                        and cur.recent_sum >= recent and cur.p99() < lru_p99):
                cur = None
        hits = base.hit_sum * (1 - self.HIT_SLACK)
        best, best_p99 = None, lru_p99 * (1 - self.P99_GAIN)
        for s in self.tails:
            p = s.p99()
            if p <= best_p99 and s.hit_sum >= hits and s.recent_sum >= recent and (best is None or p < best_p99):
                best, best_p99 = s, p
        if cur is not None and (best is None or best_p99 > cur.p99() * (1 - self.SWITCH_GAIN)):
            return cur.q
        return None if best is None else best.q

    def _veto(self) -> None:
        real, ghost, n = self._tail_hits
        if n < self.VETO_MIN:
            return
        real_lru, ghost_lru = self._lru_hits
        ratio = min(1.0, real_lru / ghost_lru) if ghost_lru else 1.0
        if real < ghost * ratio * (1 - self.VETO_SLACK):
            self.vetoes += 1  # each veto holds lru twice as long as the one before
            self._hold_until = self.returns + self.VETO_HOLD * 2 ** min(self.vetoes - 1, 16)
            self._tail_hits = [0, 0, 0]

    def decide(self) -> float | None:
        """None: this evict call is lru's; else the cold share of the tail cut."""
        self.evicting = True
        if self.returns < self._hold_until:
            self.mode = None
        else:
            self.mode = self.choice
        self.tail_calls += self.mode is not None
        return self.mode


class FixedRule(DuelRule):
    """One rule on every call (the oracle's fixed rules, tests): None is lru, q a tail share; with
    `after` > 0, lru on the first `after` evict calls and q from then on (a rule that switches once,
    issue #43's horizons); with `span`, q on `span` calls only and lru again after them (one non-lru
    call: `span` 1). Its shadows still run, so what they predict can be set beside what the real
    cache did."""

    def __init__(self, q: float | None, after: int = 0, span: int | None = None) -> None:
        super().__init__()
        if after < 0:
            raise ValueError(f"after must be a count of evict calls >= 0, got {after}")
        if span is not None and span < 1:
            raise ValueError(f"span must be a count of evict calls >= 1, got {span}")
        self.q = q
        self.after = after
        self.end = None if span is None else after + span
        self.asked = 0

    def decide(self) -> float | None:
        self.asked += 1
        on = self.asked > self.after and (self.end is None or self.asked <= self.end)
        self.mode = self.q if on else None
        return self.mode


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
    if not view.evictable_leaf(leaf):
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
def first_tokens(view, path: list) -> bytes | tuple:
    """The first KEY_TOKENS tokens of a chain given top down (`token_tag`)."""
    out: list = []
    for n in path:
        out.extend(view.tokens(n)[: KEY_TOKENS - len(out)])
        if len(out) >= KEY_TOKENS:
            break
    return token_tag(out)


def token_tag(tokens) -> bytes | tuple:
    """Tokens as the last part of a trajectory key: packed as int64 bytes, equal exactly when the
    tokens are. A bytes object keeps its hash once computed, where a tuple of 64 ints is hashed
    afresh at every lookup: the shadows look a key up a few times each on every request (a 6x
    cheaper duel over the same decisions, docs/sglang.md). A tuple where a token does not fit."""
    try:
        return array("q", tokens).tobytes()
    except (OverflowError, TypeError):
        return tuple(tokens)


class Evidence:
    """What the duel learns of a cache's requests, read off its tree (a `TreeView` with `tokens`,
    `namespace`, `children`, `num_children`): a request takes its hit (`begin`, from where its match
    ended), then its whole sequence is inserted (`inserted`: trajectory, private length, the hit the
    cache gave it, the budget). A trajectory is keyed (namespace, where its unshared chain starts,
    its first KEY_TOKENS tokens, `token_tag`); a key that moves as branches come and go is carried over
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
        return namespace, start, token_tag(tokens[start:start + KEY_TOKENS])

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
