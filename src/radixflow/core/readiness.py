"""Readiness of a waiting branch (SPEC §3): σ_t(r | B) and the plan that selects it.

`Readiness.check` reads, against the partial batch, the identity hit ĥ (`match`: a binary search over
the branch's chain hashes, confirmed token by token once per new depth), the deepest state boundary
(`boundary`: grid snapshots, plus exact-depth tails in branch mode or under vLLM's partial hits) and
answers Ready (with the plan: start, tokens, the snapshot to restore), Blocked (the deepest boundary is
pending: written this round by a producer in B) or Other (rows, tokens, memory, a deferred branch's
claim). It makes room in memory for a Ready branch (`ensure`), holding what it matched.
"""

from __future__ import annotations

from collections.abc import Callable

from radixflow.cache.pool import IdPool
from radixflow.cache.radix import Boundary, Match, Node, RadixIndex, chain_hashes
from radixflow.core.batch import Fragment, Outcome
from radixflow.core.branch import Branch
from radixflow.core.claims import Claims, finishes_now
from radixflow.core.handoff import HANDOFF, RECOMPUTE, WAIT, Forward, HandoffCosts, choose
from radixflow.core.rules import Rules
from radixflow.core.track import Plan


class Readiness:
    def __init__(self, rules: Rules, index: RadixIndex, pages: IdPool, slots: IdPool,
                 ensure: Callable[[int, int], bool], handoff_costs: HandoffCosts | None = None) -> None:
        self.rules = rules
        self.config = rules.config
        self.index = index
        self.pages = pages
        self.slots = slots
        self.ensure = ensure
        self.handoff_costs = handoff_costs  # --handoff auto's weights (None: hand off wherever possible)
        self.choices = {HANDOFF: 0, WAIT: 0, RECOMPUTE: 0}  # what the hand-off rule decided, per consumer

    def match(self, b: Branch) -> Match:
        """ĥ in whole pages (pending pages included); sets the branch's Blocked-group key."""
        tr = b.sched
        tr.group_key = tr.next_hash = None
        if not self.config.enable_prefix_caching or tr.no_cache:
            return Match(0, None)
        bs = self.rules.block_size
        max_pages = (b.num_tokens - 1) // bs
        if len(tr.hashes) < max_pages:
            tr.hashes = chain_hashes(b.namespace, b.tokens, bs, tr.hashes)
        m = self.index.match(tr.hashes, max_pages)
        if m.depth > tr.verified:
            # Hashes find the match; tokens confirm it (once per new depth: the tree only loses tails).
            if not self.index.tokens_match(m, b.tokens, tr.verified, tr.kin, tr.kin_len):
                tr.no_cache = True  # a 64-bit chain-hash collision: run this branch uncached
                return Match(0, None)
            tr.verified = m.depth
        k = m.depth // bs
        if k:
            tr.group_key = tr.hashes[k - 1]
            tr.next_hash = tr.hashes[k] if k < max_pages else None
        return m

    def demand(self, b: Branch) -> int:
        """Remaining prefill tokens of `b` if it started now from the published cache."""
        m = self.match(b)
        r = self.rules
        if r.branch_points is not None or r.partial_hits:
            start = self.boundary(b, m).ready
        else:
            start = self.index.ready_boundary(m)[0] if r.hybrid else m.depth
        return b.num_tokens - start

    def caching(self, b: Branch) -> bool:
        return self.config.enable_prefix_caching and not b.sched.no_cache

    def boundary(self, b: Branch, m: Match) -> Boundary:
        """Where a hybrid branch can resume: grid snapshots, plus exact-depth tails in branch mode."""
        r = self.rules
        if r.branch_points is None and not r.partial_hits:
            return self.index.boundary(m)
        if not self.caching(b):
            return Boundary(0, None, None)
        return self.index.exact_boundary(b.namespace, m, b.tokens, b.num_tokens - 1)

    def identity(self, b: Branch, m: Match) -> int:
        """ĥ: whole pages (boundary mode, as today) or exact tokens (branch mode)."""
        if self.rules.branch_points is None or not self.caching(b):
            return m.depth
        return self.index.exact_identity(b.namespace, m, b.tokens, b.num_tokens - 1)

    def claim_allows(self, claims: Claims, b: Branch, end: int, need: int, node: Node | None) -> bool:
        """SPEC §12 for a Ready candidate past D: (a) it finishes now, or (b) it fits beside D's t+1 needs."""
        if finishes_now(b, end):
            return True
        p, sl, idx = self.pages, self.slots, self.index
        ev_pages, ev_snaps = idx.num_evictable_pages, idx.num_evictable_snapshots
        take = need + idx.unlocked_pages_on_path(node)
        bytes_check = None
        if p.budget is not None:
            room = p.budget.free + ev_pages * p.unit_bytes + ev_snaps * sl.unit_bytes

            def bytes_check(pages: int, slots: int) -> bool:
                return pages * p.unit_bytes + slots * sl.unit_bytes <= room
        return claims.allows(b, end, take, p.num_free + ev_pages, sl.num_free + ev_snaps, bytes_check)

    def check(self, b: Branch, rows: int, tokens: int, allow_split: bool = False,
              claims: Claims | None = None, next_sure: bool = False, frag: bool = False,
              forward: Forward | None = None):
        """σ_t(b | B) at the scan position, plus the plan to select it. A Blocked branch's plan holds
        the pending snapshot it waits for and its start at t+1 (that snapshot's depth). With `claims`
        (D_t is not empty), a Ready branch that would take D's t+1 capacity is Other ("claim").
        `next_sure`: round t+1 runs whatever the rest of the scan does (a branch-point wait is free);
        `frag`: the arm's +Frag rule (SPEC §7: a short fragment is Other until nothing else fits);
        `forward`: this round's producers, when hand-off is on (SPEC §15): a branch Blocked on a state a
        row of this forward computes is Ready as that row's dependent (`Plan.after`), or `auto` may
        choose to recompute or wait instead."""
        if rows == 0:
            return Outcome.OTHER, None, "rows"
        if tokens == 0:
            return Outcome.OTHER, None, "tokens"
        r = self.rules
        m = self.match(b)
        snapshot = None
        if r.hybrid:
            bd = self.boundary(b, m)
            choice = None
            if bd.blocking is not None and forward is not None:
                choice = self._handoff(b, m, bd, tokens, claims, next_sure, frag, forward)
                if isinstance(choice, Plan):
                    return Outcome.READY, choice, None
                if choice == RECOMPUTE:
                    bd = self._published(m, bd)
            if bd.blocking is not None and r.branch_points is not None and choice != WAIT:
                if not r.branch_points.worth_waiting(bd.ready, bd.blocking.depth, next_sure):
                    bd = Boundary(bd.ready, bd.ready_snapshot, None)  # cheaper to recompute the gap now
            if bd.blocking is not None:
                depth = bd.blocking.depth
                if r.chunk(depth, b.num_tokens, tokens, b, r.junction(m, depth)) == 0:
                    return Outcome.OTHER, None, "tokens"
                if b.first_selected_at is None and not b.blocked_rounds:
                    b.blocked_tokens = bd.blocking.depth - bd.ready
                return Outcome.BLOCKED, Plan(m, bd.blocking.depth, 0, bd.blocking, bd.ready), "blocked"
            start, snapshot = bd.ready, bd.ready_snapshot
        else:
            start = m.depth
        junction = r.junction(m, start)
        n = r.chunk(start, b.num_tokens, tokens, b, junction)
        if n == 0:
            return Outcome.OTHER, None, "tokens"
        if frag and not allow_split:
            if n < r.chunk(start, b.num_tokens, self.config.max_num_batched_tokens, b, junction):
                return Outcome.OTHER, None, "short-fragment"
        node = m.node if start else None
        need = -(-(start + n) // r.block_size) - start // r.block_size
        if claims is not None and claims.active and not self.claim_allows(claims, b, start + n, need, node):
            return Outcome.OTHER, None, "claim"
        slots = 1 if r.hybrid else 0
        if self.pages.budget is None and need <= self.pages.num_free and slots <= self.slots.num_free:
            ok = True  # room without evicting anything
        else:
            # Hold the matched path while making room, so eviction cannot take what we matched.
            self.index.lock(node)
            if snapshot is not None:
                snapshot.lock += 1
            ok = self.ensure(need, slots)
            self.index.unlock(node)
            if snapshot is not None:
                snapshot.lock -= 1
        if not ok:
            return Outcome.OTHER, None, "memory"
        return Outcome.READY, Plan(m, start, n, snapshot), None

    def _published(self, m: Match, bd: Boundary) -> Boundary:
        """`bd` without its pending boundary: resume from the published one beneath it. A grid boundary
        that is pending names only that one's depth (`RadixIndex.boundary`), so its snapshot is looked up."""
        snap = bd.ready_snapshot
        if snap is None and bd.ready:
            depth, snap = self.index.ready_boundary(m, bd.ready)
            assert depth == bd.ready, (depth, bd.ready)
        return Boundary(bd.ready, snap, None)

    def _handoff_depth(self, b: Branch, m: Match, d: int, prod: Fragment) -> int:
        """Where a dependent Blocked at `d` starts: the deepest page boundary its producer's row reaches
        (at most the row's end) on tokens the branch shares with that row and matches in the tree, so it
        computes no token a wait would not (a waiting branch resumes at t+1 from the producer's last
        checkpoint, e.g. its finished prompt's last page, not from the interval boundary it was Blocked
        on). vllm-align keeps `d`: vLLM's split assumes starts on its own grid."""
        r = self.rules
        if r.vllm_align:
            return d
        bs = r.block_size
        lim = min(m.depth, prod.end)
        if lim - d < bs:
            return d
        mine, theirs = b.tokens, prod.branch.tokens
        if mine[d:lim] == theirs[d:lim]:  # the usual case (siblings of one prompt), compared in C
            return lim // bs * bs
        e = d
        while mine[e] == theirs[e]:
            e += 1
        return max(d, e // bs * bs)

    def _handoff(self, b: Branch, m: Match, bd: Boundary, tokens: int, claims: Claims | None, next_sure: bool,
                 frag: bool, forward: Forward) -> Plan | str | None:
        """A dependent row's plan for `b`, Blocked at d = bd.blocking.depth, or `auto`'s RECOMPUTE / WAIT,
        or None where no hand-off is possible (then the rule of `--handoff off` applies): the producer's
        row [a, b) must hold d (a < d <= b), the level must be allowed, and the dependent's fragment must
        fit (tokens, memory, D's claim). Its pages below d are the tree's on the matched path: the
        producer's, or (where the producer keeps a private duplicate) the tree's copy of the same
        tokens, written in this forward or published before it."""
        snap = bd.blocking
        p = forward.rows.get(snap.producer)
        if p is None:
            return None
        prod = forward.batch.fragments[p]
        d = snap.depth
        if not prod.start < d <= prod.end:
            return None
        d = self._handoff_depth(b, m, d, prod)
        level = forward.levels[p] + 1
        if level >= self.config.handoff_max_levels:
            return None
        r = self.rules
        junction = r.junction(m, d)
        n = r.chunk(d, b.num_tokens, tokens, b, junction)
        if n == 0:
            return None
        k = d // r.block_size
        if self.config.handoff == "auto":
            new_level = level > forward.depth
            choice = choose(self.handoff_costs, new_level, d - bd.ready, next_sure, forward.spent,
                            forward.sharers(b) if new_level else 1, (prod.num_tokens, d - prod.start, n))
            if choice == RECOMPUTE:
                forward.spent += (d - bd.ready) * self.handoff_costs.token
            if choice != HANDOFF:
                self.choices[choice] += 1
                return choice
        if frag and n < r.chunk(d, b.num_tokens, self.config.max_num_batched_tokens, b, junction):
            return None
        node = m.node
        need = -(-(d + n) // r.block_size) - k
        if claims is not None and claims.active and not self.claim_allows(claims, b, d + n, need, node):
            return None
        if self.pages.budget is not None or need > self.pages.num_free or self.slots.num_free < 1:
            self.index.lock(node)
            ok = self.ensure(need, 1)
            self.index.unlock(node)
            if not ok:
                return None
        self.choices[HANDOFF] += 1
        return Plan(m, d, n, snap, bd.ready, after=p)
