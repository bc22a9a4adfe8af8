"""The round scheduler (SPEC §4): running branches first, then the waiting queue by a traversal rule.

Engine-agnostic: it sees integers (pages, slots, tokens) and a `now` passed in by the caller. The
simulator and the real engine drive the same object through `add / admit / schedule / complete`.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from itertools import islice
from typing import NamedTuple

from radixflow.cache.eviction import ReuseCosts
from radixflow.cache.pool import ByteBudget, IdPool
from radixflow.cache.radix import Boundary, Match, Node, RadixIndex, Snapshot, chain_hashes
from radixflow.config import SchedulerConfig
from radixflow.core.batch import Batch, ExecResult, Fragment, Outcome
from radixflow.core.branch import Branch, BranchState
from radixflow.core.checkpoints import BranchPoints, attach_exact_end, capture_exact
from radixflow.core.claims import Claims, finishes_now
from radixflow.core.integrity import check_scheduler, holds_nothing
from radixflow.core.lookup import Arrival, BlockedGroups, arrival_hashes
from radixflow.core.misses import at_first_selection
from radixflow.core.partial_hits import capture_partial, continue_partial, release_partial
from radixflow.core.policies import AdmissionView, Arm
from radixflow.core.vllm_split import aligned_split, internal_checkpoint


@dataclass(eq=False, slots=True)
class _Track:
    """Scheduler-private state of one branch."""

    hashes: list[int] = field(default_factory=list)
    page_table: list[int] = field(default_factory=list)
    private: set[int] = field(default_factory=set)  # pages owned by the branch, not by the tree
    node: Node | None = None  # deepest tree node the branch holds a lock on
    working: int | None = None  # slot with the branch's running linear state
    rolling: int | None = None  # slot with the state at the last page boundary passed (end snapshot)
    rolling_depth: int = 0
    read_snapshot: Snapshot | None = None  # locked for the round that restores from it
    level: int = 0  # dependency depth of the branch's last fragment
    verified: int = 0  # depth up to which a match was checked token by token
    kin: tuple | None = None  # an earlier arrival's prompt equal to this one's on the first kin_len tokens
    kin_len: int = 0
    no_cache: bool = False  # a hash collision was detected: this branch neither reads nor writes the cache
    junction: int = 0  # vllm-align: KV hit depth past the state hit at selection (vLLM's shared_prefix_boundary)
    partial_tail: Snapshot | None = None  # vllm-align partial hits: the tail state this branch stopped at
    seq: int = 0  # place in the waiting queue among equal priorities (uid; preempted: before every uid)
    # While waiting: the chain hash at the last match's depth ĥ and of the page after it (None past the
    # prompt). A branch whose key was found Blocked this round, and whose next page is still not in the
    # tree, has the same path and ĥ: it is Blocked without a lookup of its own.
    group_key: int | None = None
    next_hash: int | None = None


class _Plan(NamedTuple):
    match: Match
    start: int
    num_tokens: int
    snapshot: Snapshot | None
    ready: int = 0  # a Blocked plan: the depth its ready state is at (what the wait saves is start - ready)


@dataclass
class RoundRecord:
    """Per-round measures kept by the scheduler."""

    round: int
    start: float
    rows: int
    tokens: int
    deferred: int
    host_time: float = 0.0
    capture_time: float = 0.0


class Scheduler:
    # Blocked groups recognised by one key (core/lookup.py); False: a full lookup per branch (the
    # property tests replay every round both ways and require the same batch).
    group_shortcut = True

    def __init__(self, config: SchedulerConfig, arm: Arm, hybrid: bool, costs: ReuseCosts | None = None) -> None:
        config.validate()
        self.config = config
        self.arm = arm
        self.hybrid = hybrid
        self.block_size = config.block_size
        self.interval = config.state_interval if hybrid else config.block_size
        self.vllm_align = hybrid and config.snapshot_mode == "vllm-align"
        if self.vllm_align and config.state_interval != config.block_size:
            raise ValueError(f"--snapshot-mode vllm-align keeps state on KV blocks: the state interval "
                             f"({config.state_interval}) must equal the block size ({config.block_size}); "
                             f"spec.vllm_align.apply_vllm_align sets both to vLLM's block")
        # vLLM's hash block; below the block, partial hits and the tail-boundary stop (core/partial_hits.py)
        self.unit = (config.prefix_match_unit or config.block_size) if self.vllm_align else config.block_size
        self.partial_hits = self.vllm_align and self.unit < config.block_size
        if self.vllm_align and config.block_size % self.unit:
            raise ValueError(f"--prefix-match-unit {self.unit} must divide the {config.block_size}-token block")
        # vLLM 0.29's --mamba-cache-mode all (Mamba-2 only): no split, a state at every block boundary
        # crossed, hits on the block; the every-boundary path does it, never cutting a chunk (_chunk)
        self.vllm_all = self.vllm_align and config.mamba_cache_mode == "all"
        self.chunk_end = hybrid and config.snapshot_mode in ("chunk-end", "vllm-align") and not self.vllm_all
        self.branch_points = (BranchPoints(config.block_size, self.interval, min(64, config.state_interval // 2),
                                           None if config.checkpoint_wait == "grid" else int(config.checkpoint_wait))
                              if hybrid and config.checkpoints == "branch" else None)
        self.exact_checkpoints = 0  # branch-point and exact-end snapshots made (SPEC §14)
        budget = ByteBudget(config.cache_memory_bytes) if config.cache_memory_bytes > 0 else None
        self.pages = IdPool(config.num_kv_pages, "KV page", config.kv_page_bytes, budget)
        self.slots = IdPool(config.num_state_slots if hybrid else 0, "state slot", config.state_slot_bytes, budget)
        self.index = RadixIndex(config.block_size, self.pages, self.slots, config.eviction)
        if hasattr(self.index.eviction, "costs"):  # flop-aware: the model's costs, or units from the config
            self.index.eviction.costs = costs or ReuseCosts(page_bytes=config.kv_page_bytes or 1,
                                                            slot_bytes=config.state_slot_bytes or 1)
        self.held: list[Branch] = []
        self.waiting: list[Branch] = []
        self.running: list[Branch] = []
        self.round = 0
        self.rounds: list[RoundRecord] = []
        self.finished: list[Branch] = []
        self.blocked_total = 0
        self.preemptions = 0
        self.max_level = 0  # dependency depth D of the fragments placed so far
        self.claims: Claims | None = None  # the last scan's reservation for D_t (None: nothing deferred)
        self._next_uid = 0
        self._front_seq = 0
        self._last_arrival: Arrival | None = None  # for hash reuse between siblings
        self._deadline: float | None = None
        self._next_sure = False  # this scan: round t+1 runs whatever the rest of the scan does

    # ================================================================== public API
    def add(self, branch: Branch) -> None:
        """A branch arrived: it is held until the admission policy releases it."""
        if branch.state is not BranchState.HELD or branch.uid >= 0:
            raise ValueError(f"branch {branch.key} was already added")
        need = -(-(branch.prompt_len + branch.max_new_tokens) // self.block_size)
        if need > self.config.num_kv_pages:
            raise ValueError(f"branch {branch.key} needs {need} KV pages; the pool has "
                             f"{self.config.num_kv_pages}: raise the KV cache memory or lower max tokens")
        budget = self.pages.budget
        if budget is not None and need * self.pages.unit_bytes + self.slots.unit_bytes * self.hybrid > budget.total:
            raise ValueError(f"branch {branch.key} needs more cache memory than the {budget.total} bytes there are")
        branch.uid = self._next_uid
        self._next_uid += 1
        branch.sched = tr = _Track()
        if self.config.enable_prefix_caching:  # hashed once on arrival, as vLLM's request block hasher
            arrival, tr.verified, tr.no_cache = arrival_hashes(self.index, branch.namespace, branch.prompt,
                                                               self._last_arrival)
            if not tr.no_cache:
                self._last_arrival = arrival
                tr.hashes = arrival.hashes
                tr.kin, tr.kin_len = arrival.kin, arrival.kin_len
                k, max_pages = arrival.shared, (branch.num_tokens - 1) // self.block_size
                if 0 < k <= max_pages:  # first guess of its group key: where it leaves its sibling
                    tr.group_key = tr.hashes[k - 1]
                    tr.next_hash = tr.hashes[k] if k < max_pages else None
        self.held.append(branch)

    def admit(self, now: float) -> float | None:
        """Runs admission; returns the time to call again if branches stay held."""
        if not self.held:
            self._deadline = None
            return None
        view = AdmissionView(bool(self.running), self.config.max_num_seqs,
                             self.config.max_num_batched_tokens, self._demand)
        n, self._deadline = self.arm.admission.release(self.held, now, view)
        for b in self.held[:n]:
            b.state = BranchState.WAITING
            b.admitted_at = now
            self._enqueue(b)
        del self.held[:n]
        return self._deadline

    def schedule(self, now: float) -> Batch:
        """Builds round t's batch: running first, then the waiting queue by the arm's traversal."""
        self.round += 1
        batch = Batch(self.round)
        rows, tokens = self.config.max_num_seqs, self.config.max_num_batched_tokens
        preempted = False
        i = 0
        while i < len(self.running) and rows and tokens:
            b = self.running[i]
            n = self._chunk(b.num_computed_tokens, b.num_tokens, tokens, b, b.sched.junction)
            if n == 0:
                i += 1
                continue
            need = self._new_pages(b, b.num_computed_tokens + n)
            # + a working slot for a branch whose own became its partial-tail snapshot (core/partial_hits.py)
            while not self._ensure(need, int(b.sched.partial_tail is not None and b.sched.working is None)):
                victim = self._victim(i)
                self._preempt(victim)
                preempted = True
                if victim is b:
                    break
            else:
                self._place(b, b.num_computed_tokens, n, batch, now, None)
                rows -= 1
                tokens -= n
                i += 1
                continue
            break
        if preempted:
            batch.stop_reason = "preempted"  # as vLLM: no new branch starts in a round that preempted
        else:
            self._scan_waiting(batch, rows, tokens, now)
        if batch:
            self.rounds.append(RoundRecord(batch.round, now, batch.num_rows, batch.num_tokens, batch.deferred))
        else:
            self.round -= 1
        return batch

    def complete(self, batch: Batch, result: ExecResult, now: float) -> list[Branch]:
        """After execution: advance counters, sample, publish C_{t+1}, finish branches."""
        if self.rounds and self.rounds[-1].round == batch.round:
            self.rounds[-1].host_time = result.host_time
            self.rounds[-1].capture_time = result.capture_time
        done = []
        for i, frag in enumerate(batch.fragments):
            b = frag.branch
            tr: _Track = b.sched
            b.num_computed_tokens = frag.end
            if tr.read_snapshot is not None:
                tr.read_snapshot.lock -= 1
                tr.read_snapshot = None
            if frag.samples:
                sample = result.samples.get(i)
                if sample is None:
                    raise RuntimeError(f"executor returned no sample for row {i} ({b.key})")
                b.output.append(sample.token)
                if b.first_token_at is None:
                    b.first_token_at = now
                reason = self._finish_reason(b, sample)
                if reason is not None:
                    b.finish_reason = reason
                    done.append(b)
        self.index.publish()
        for b in done:
            self._finish(b, now)
        return done

    def abort(self, branch: Branch) -> None:
        """Removes a branch wherever it is; frees what it holds. Call between rounds only."""
        if branch.state is BranchState.HELD:
            self.held.remove(branch)
        elif branch.state is BranchState.WAITING:
            self.waiting.remove(branch)
        elif branch.state is BranchState.RUNNING:
            self._release(branch, keep_end_snapshot=False)
            self.running.remove(branch)
        else:
            return
        branch.state = BranchState.FINISHED
        branch.finish_reason = "abort"

    @property
    def has_unfinished(self) -> bool:
        return bool(self.held or self.waiting or self.running)

    @property
    def next_deadline(self) -> float | None:
        return self._deadline

    def check_integrity(self) -> None:
        """Raises AssertionError if free + cached + in use != total for pages or slots, or locks drift."""
        check_scheduler(self)

    def holds_nothing(self) -> bool:
        """True when no branch holds pages, slots or locks (only the cache itself remains)."""
        return holds_nothing(self)

    # ================================================================== the scan
    def _scan_waiting(self, batch: Batch, rows: int, tokens: int, now: float) -> None:
        waiting = self.waiting
        taken: list[int] = []  # positions selected, removed after the scan (no queue rebuild)
        frag_deferred: list[tuple[int, Branch]] = []
        state_ready = self.arm.traversal.continue_after_blocked()
        self.claims = claims = None
        groups = BlockedGroups(self.index)
        find, in_tree, blocked = groups.find, self.index.page_hashes, groups.by_key
        bs, interval = self.block_size, self.interval
        deferred, shortcut = 0, self.group_shortcut
        self._next_sure = self._next_round_sure(batch, rows)
        pos, n_waiting = -1, len(waiting)
        while pos + 1 < n_waiting:
            pos += 1
            b = waiting[pos]
            if deferred and rows and tokens and shortcut:
                # A member of a group already Blocked this round: same path, same ĥ, same boundary.
                # (The first test is `find`'s own, inlined: this loop may walk 10k Blocked branches.)
                tr = b.sched
                snap = blocked.get(tr.group_key)
                if snap is not None:
                    if tr.next_hash is not None and tr.next_hash in in_tree:
                        snap = None
                elif tr.group_key is None:
                    snap = find(b)
                if snap is not None:
                    d = snap.depth
                    # A chunk from a state boundary gets >= one interval when that many tokens are left.
                    if (tokens < interval or d % interval) and self._chunk(d, b.num_tokens, tokens, b) == 0:
                        batch.stop_reason = "tokens"
                        break
                    deferred += 1
                    self._next_sure = True
                    if b.first_selected_at is None:
                        if not b.blocked_rounds:  # as _check: what the wait saves, at the first deferral
                            b.blocked_tokens = d - groups.ready.get(tr.group_key, 0)
                        b.blocked_rounds += 1
                    if claims.open:
                        claims.defer(b, d)
                        continue
                    # Claims closed and no token test to make: the members that follow this one are
                    # Blocked on the same snapshot by the same two tests, in one tight loop.
                    j, key = pos + 1, tr.group_key
                    if tokens >= interval and not d % interval:
                        saves = d - groups.ready.get(key, 0)
                        for b in islice(waiting, j, None):
                            tr = b.sched
                            if tr.group_key != key or (tr.next_hash is not None and tr.next_hash in in_tree):
                                break
                            if b.first_selected_at is None:
                                if not b.blocked_rounds:
                                    b.blocked_tokens = saves
                                b.blocked_rounds += 1
                            j += 1
                    claims.deferred += j - pos
                    deferred += j - pos - 1
                    pos = j - 1
                    continue
            outcome, plan, reason = self._check(b, rows, tokens, claims=claims)
            if outcome is Outcome.READY:
                self._select(b, plan, batch, now)
                taken.append(pos)
                rows -= 1
                tokens -= plan.num_tokens
                if claims is not None:
                    claims.carry(b, plan.start + plan.num_tokens)
                if not finishes_now(b, plan.start + plan.num_tokens):
                    self._next_sure = True
                continue
            if outcome is Outcome.BLOCKED:
                deferred += 1
                self._next_sure = True
                b.blocked_rounds += b.first_selected_at is None
                if not state_ready:
                    batch.stop_reason = "blocked"
                    break
                key = b.sched.group_key
                if key is not None and not plan.snapshot.tail:  # a tail: members may part inside its page
                    groups.add(key, plan.match.depth // bs, plan.snapshot, plan.ready)
                if claims is None:
                    self.claims = claims = self._new_claims(batch)
                claims.defer(b, plan.start)
                continue
            if reason == "short-fragment":
                frag_deferred.append((pos, b))
                continue
            batch.stop_reason = reason
            break
        batch.deferred += deferred
        self.blocked_total += deferred
        for pos, b in frag_deferred:  # split only what nothing else could fill
            outcome, plan, reason = self._check(b, rows, tokens, allow_split=True, claims=claims)
            if outcome is not Outcome.READY:
                break
            self._select(b, plan, batch, now)
            taken.append(pos)
            rows -= 1
            tokens -= plan.num_tokens
            if claims is not None:
                claims.carry(b, plan.start + plan.num_tokens)
        taken.sort()
        end = len(taken)
        if end > 1 and taken[-1] - taken[0] < 256:  # a short span: one slice assignment, one memmove
            lo, hi, gone = taken[0], taken[-1] + 1, set(taken)
            waiting[lo:hi] = [waiting[j] for j in range(lo, hi) if j not in gone]
            end = 0
        while end:  # from the back, one slice per run of adjacent positions (one memmove each)
            start = end - 1
            while start and taken[start - 1] == taken[start] - 1:
                start -= 1
            del waiting[taken[start] : taken[end - 1] + 1]
            end = start

    def _next_round_sure(self, batch: Batch, rows: int) -> bool:
        """Round t+1 runs whatever the waiting scan decides: arrivals are held, a running branch
        continues past round t (left out of it, or not finished by its fragment), or more branches
        wait than there are rows left."""
        if self.held or len(self.waiting) > rows:
            return True
        ends = {f.branch.uid: f.end for f in batch.fragments}
        return any(b.uid not in ends or not finishes_now(b, ends[b.uid]) for b in self.running)

    def _new_claims(self, batch: Batch) -> Claims:
        """The reservation for D_t, opened at the first deferral with every row placed so far."""
        cfg = self.config
        claims = Claims(cfg.max_num_seqs, cfg.max_num_batched_tokens, self.block_size, self._chunk,
                        slot_per_row=1 if self.hybrid else 0)
        ends = {f.branch.uid: f.end for f in batch.fragments}
        for b in self.running:  # placed this round or not (a running row the token budget left out)
            claims.carry(b, ends.get(b.uid, b.num_computed_tokens))
        return claims

    def _claim_allows(self, claims: Claims, b: Branch, end: int, need: int, node: Node | None) -> bool:
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

    def _check(self, b: Branch, rows: int, tokens: int, allow_split: bool = False,
               claims: Claims | None = None):
        """σ_t(b | B) at the scan position, plus the plan to select it. A Blocked branch's plan holds
        the pending snapshot it waits for and its start at t+1 (that snapshot's depth). With `claims`
        (D_t is not empty), a Ready branch that would take D's t+1 capacity is Other ("claim")."""
        if rows == 0:
            return Outcome.OTHER, None, "rows"
        if tokens == 0:
            return Outcome.OTHER, None, "tokens"
        m = self._match(b)
        snapshot = None
        if self.hybrid:
            bd = self._boundary(b, m)
            if bd.blocking is not None and self.branch_points is not None:
                if not self.branch_points.worth_waiting(bd.ready, bd.blocking.depth, self._next_sure):
                    bd = Boundary(bd.ready, bd.ready_snapshot, None)  # cheaper to recompute the gap now
            if bd.blocking is not None:
                depth = bd.blocking.depth
                if self._chunk(depth, b.num_tokens, tokens, b, self._junction(m, depth)) == 0:
                    return Outcome.OTHER, None, "tokens"
                if b.first_selected_at is None and not b.blocked_rounds:
                    b.blocked_tokens = bd.blocking.depth - bd.ready
                return Outcome.BLOCKED, _Plan(m, bd.blocking.depth, 0, bd.blocking, bd.ready), "blocked"
            start, snapshot = bd.ready, bd.ready_snapshot
        else:
            start = m.depth
        junction = self._junction(m, start)
        n = self._chunk(start, b.num_tokens, tokens, b, junction)
        if n == 0:
            return Outcome.OTHER, None, "tokens"
        if self.arm.frag and not allow_split:
            if n < self._chunk(start, b.num_tokens, self.config.max_num_batched_tokens, b, junction):
                return Outcome.OTHER, None, "short-fragment"
        node = m.node if start else None
        need = -(-(start + n) // self.block_size) - start // self.block_size
        if claims is not None and claims.active and not self._claim_allows(claims, b, start + n, need, node):
            return Outcome.OTHER, None, "claim"
        slots = 1 if self.hybrid else 0
        if self.pages.budget is None and need <= self.pages.num_free and slots <= self.slots.num_free:
            ok = True  # room without evicting anything
        else:
            # Hold the matched path while making room, so eviction cannot take what we matched.
            self.index.lock(node)
            if snapshot is not None:
                snapshot.lock += 1
            ok = self._ensure(need, slots)
            self.index.unlock(node)
            if snapshot is not None:
                snapshot.lock -= 1
        if not ok:
            return Outcome.OTHER, None, "memory"
        return Outcome.READY, _Plan(m, start, n, snapshot), None

    # ================================================================== placing rows
    def _select(self, b: Branch, plan: _Plan, batch: Batch, now: float) -> None:
        tr: _Track = b.sched
        start = plan.start
        if b.first_selected_at is None:
            b.first_selected_at = now
            b.cached_tokens = start
            b.identity_hit = plan.match.depth if self.branch_points is None else self._identity(b, plan.match)
            b.misses = at_first_selection(self.index, b.namespace, b.tokens, tr.hashes, b.prompt_len,
                                          b.identity_hit, start, (b.blocked_rounds, b.blocked_tokens))
        b.state = BranchState.RUNNING
        self.running.append(b)
        tr.group_key = tr.next_hash = None
        b.num_computed_tokens = start
        tr.junction = self._junction(plan.match, start) if self.vllm_align else 0
        if start:
            node = plan.match.node
            self.index.lock(node, now)
            tr.node = node
            tr.page_table = self.index.pages_upto(plan.match, start // self.block_size)
        tr.level = 0
        state_in = None
        copy_in = None
        if plan.snapshot is not None:
            plan.snapshot.lock += 1
            self.index.touch_snapshot(plan.snapshot, now)
            tr.read_snapshot = plan.snapshot
            state_in = plan.snapshot.slot
            tr.level = plan.snapshot.level
            if plan.snapshot.tail:  # resume inside a page: its K/V comes from the snapshot's copy
                page = self.pages.allocate_one()
                tr.page_table.append(page)
                tr.private.add(page)
                copy_in = (plan.snapshot.tail_page, page)
        if self.hybrid:
            tr.working = self.slots.allocate_one()
        self._place(b, start, plan.num_tokens, batch, now, state_in, first=True, copy_in=copy_in)

    def _place(self, b: Branch, start: int, n: int, batch: Batch, now: float, state_in: int | None,
               first: bool = False, copy_in: tuple[int, int] | None = None) -> None:
        tr: _Track = b.sched
        bs = self.block_size
        end = start + n
        if tr.partial_tail is not None and tr.working is None:
            state_in = continue_partial(self, b, start)  # its state is in the snapshot, not a working slot
        table = tr.page_table
        first_new = len(table)
        new = -(-end // bs) - first_new
        if new > 0:
            table.extend([self.pages.allocate_one()] if new == 1 else self.pages.allocate(new))
        full = end // bs
        adopted = full  # the tree holds pages [adopted, full) of the table; the rest are the row's own
        if self.config.enable_prefix_caching and full:
            cuts = None
            if self.hybrid and not self.chunk_end and self.branch_points is None:  # _captures' depths
                step = self.interval // bs
                cuts = range((start // self.interval + 1) * step, full, step)
            adopted = self._register(b, full, now, cuts, start // bs)
        if adopted < first_new:  # earlier pages of the row the tree took over now
            tr.private.difference_update(table[adopted : min(full, first_new)])
        if new > 0:  # new pages outside [adopted, full)
            tr.private.update(table[first_new : max(first_new, adopted)])
            tr.private.update(table[max(first_new, full) :])
        tr.level += 1
        if tr.level > self.max_level:
            self.max_level = tr.level
        frag = Fragment(b, start, n, list(tr.page_table), samples=end == b.num_tokens, first=first)
        if copy_in is not None:
            frag.copies_before.append(copy_in)
        if self.hybrid:
            if not first and state_in is None:
                state_in = tr.working
            frag.state_in = state_in
            frag.state_out = self._captures(b, start, end, now, frag.copies_after)
        batch.fragments.append(frag)
        b.num_fragments += 1

    def _register(self, b: Branch, full: int, now: float, cuts: range | None = None, known: int = 0) -> int:
        """Registers the branch's full pages in the index (pending: usable by full attention this round).
        `known`: pages expected in the tree already (the row's start; `RadixIndex.match` checks it).
        Returns the first page the tree adopted (`full` when none); the caller keeps `private` in step."""
        tr: _Track = b.sched
        if tr.no_cache:
            return full
        if len(tr.hashes) < full:
            tr.hashes = chain_hashes(b.namespace, b.tokens, self.block_size, tr.hashes)
        node, adopted = self.index.insert(b.namespace, b.tokens, tr.hashes, tr.page_table, full, now, cuts,
                                          b.prompt, known)
        if node is not tr.node:
            self.index.relock(tr.node, node)
            tr.node = node
        return adopted

    def _captures(self, b: Branch, start: int, end: int, now: float,
                  copies: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """State captures of a hybrid row: every interval boundary in (start, end], the last page
        boundary (a candidate end-of-branch snapshot) and the row's end (the working state)."""
        tr: _Track = b.sched
        out: list[tuple[int, int]] = []
        caching = self.config.enable_prefix_caching and not tr.no_cache
        end_slot = None  # where the row's end state goes, when not the working slot
        if caching and self.chunk_end:
            if self.vllm_align:  # a state exported from inside the final chunk (no cut there)
                ckpt = internal_checkpoint(start, end, b.prompt_len, b.num_tokens, self.interval,
                                           self.config.internal_checkpoint, self.unit)
                if ckpt is not None and ckpt % self.block_size == 0:
                    self._capture_at(b, ckpt, start, now, out)
                elif self.partial_hits:  # the working slot may become the partial-tail snapshot
                    end_slot = capture_partial(self, b, start, end, ckpt, now, out, copies)
            if end % self.interval == 0:
                self._capture_at(b, end, start, now, out)
            if self.branch_points is not None:  # our extension on vLLM's grid (docs/checkpoints.md)
                self._branch_captures(b, start, end, now, out, copies)
        elif caching:
            first_b = (start // self.interval + 1) * self.interval
            for depth in range(first_b, end + 1, self.interval):
                self._capture_at(b, depth, start, now, out)
            if self.branch_points is not None:  # exact depths; the branch's end is snapshotted at finish
                self._branch_captures(b, start, end, now, out, copies)
                out.append((end - start, tr.working))
                return out
            # End-of-branch snapshot: once past the prompt's last chunk, the state at the last page
            # boundary passed is kept in one extra slot; at finish it becomes the branch's end
            # snapshot (a 1-token branch holds that slot for one round only).
            page_end = end // self.block_size * self.block_size
            if end >= b.prompt_len and page_end > start and page_end % self.interval:
                if tr.rolling is None and self._ensure(0, 1):
                    tr.rolling = self.slots.allocate_one()
                if tr.rolling is not None:
                    out.append((page_end - start, tr.rolling))
                    tr.rolling_depth = page_end
        out.append((end - start, tr.working if end_slot is None else end_slot))
        return out

    def _branch_captures(self, b: Branch, start: int, end: int, now: float, out: list[tuple[int, int]],
                         copies: list[tuple[int, int]]) -> None:
        """Branch-point checkpoints of a row (core/checkpoints.py): exact depths in (start, end]."""
        others = (*self.held, *self.waiting, *self.running)
        for depth in self.branch_points.depths(b, start, end, others, b.identity_hit or 0):
            if depth % self.block_size == 0:
                self._capture_at(b, depth, start, now, out)
            else:
                capture_exact(self, b, depth, start, now, out, copies)

    def _capture_at(self, b: Branch, depth: int, start: int, now: float, out: list[tuple[int, int]]) -> None:
        """A pending snapshot at `depth` written by this row, unless one exists or no slot can be had."""
        tr: _Track = b.sched
        node = self.index.node_after(tr.hashes, depth // self.block_size)  # registered by _place
        if node.snapshot is not None or not self._ensure(0, 1):
            return
        slot = self.slots.allocate_one()
        snap = self.index.attach_snapshot(node, slot, b.uid, now)
        snap.level = tr.level
        out.append((depth - start, slot))

    # ================================================================== finishing
    def _finish_reason(self, b: Branch, sample) -> str | None:
        if getattr(sample, "finish_reason", None):
            return sample.finish_reason
        if sample.token in b.stop_token_ids:
            return "stop"
        if len(b.output) >= b.max_new_tokens:
            return "length"
        return None

    def _finish(self, b: Branch, now: float) -> None:
        self._release(b, keep_end_snapshot=True, now=now)
        self.running.remove(b)
        b.state = BranchState.FINISHED
        b.finished_at = now
        self.finished.append(b)

    def _release(self, b: Branch, keep_end_snapshot: bool, now: float = 0.0) -> None:
        tr: _Track = b.sched
        if tr.rolling is not None:
            if keep_end_snapshot and self._attach_end_snapshot(b):
                tr.rolling = None
            else:
                self.slots.free([tr.rolling])
                tr.rolling = None
        if tr.working is not None and keep_end_snapshot and self.branch_points is not None:
            if attach_exact_end(self, b):
                tr.working = None
        if tr.working is not None:
            self.slots.free([tr.working])
            tr.working = None
        if tr.read_snapshot is not None:
            tr.read_snapshot.lock -= 1
            tr.read_snapshot = None
        release_partial(b)
        self.index.unlock(tr.node)
        tr.node = None
        self.pages.free(sorted(tr.private))
        tr.private.clear()
        tr.page_table = []
        tr.rolling_depth = 0

    def _attach_end_snapshot(self, b: Branch) -> bool:
        tr: _Track = b.sched
        depth = tr.rolling_depth
        if depth == 0 or depth > b.num_computed_tokens:
            return False
        m = self.index.match(tr.hashes, depth // self.block_size)
        if m.depth != depth:
            return False
        snap = self.index.attach_snapshot(self.index.node_at(m), tr.rolling, None, 0.0)
        if snap is None:
            return False
        snap.level = tr.level
        return True

    def _preempt(self, b: Branch) -> None:
        """Recompute preemption (as vLLM): drop everything, go back to the front of the queue."""
        self._release(b, keep_end_snapshot=False)
        self.running.remove(b)
        b.num_computed_tokens = 0
        b.num_preemptions += 1
        self.preemptions += 1
        b.state = BranchState.WAITING
        self._enqueue(b, front=True)

    # ================================================================== helpers
    def _match(self, b: Branch) -> Match:
        tr: _Track = b.sched
        tr.group_key = tr.next_hash = None
        if not self.config.enable_prefix_caching or tr.no_cache:
            return Match(0, None)
        bs = self.block_size
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

    def _demand(self, b: Branch) -> int:
        """Remaining prefill tokens of `b` if it started now from the published cache."""
        m = self._match(b)
        if self.branch_points is not None or self.partial_hits:
            start = self._boundary(b, m).ready
        else:
            start = self.index.ready_boundary(m)[0] if self.hybrid else m.depth
        return b.num_tokens - start

    def _caching(self, b: Branch) -> bool:
        return self.config.enable_prefix_caching and not b.sched.no_cache

    def _boundary(self, b: Branch, m: Match) -> Boundary:
        """Where a hybrid branch can resume: grid snapshots, plus exact-depth tails in branch mode."""
        if self.branch_points is None and not self.partial_hits:
            return self.index.boundary(m)
        if not self._caching(b):
            return Boundary(0, None, None)
        return self.index.exact_boundary(b.namespace, m, b.tokens, b.num_tokens - 1)

    def _identity(self, b: Branch, m: Match) -> int:
        """ĥ: whole pages (boundary mode, as today) or exact tokens (branch mode)."""
        if self.branch_points is None or not self._caching(b):
            return m.depth
        return self.index.exact_identity(b.namespace, m, b.tokens, b.num_tokens - 1)

    def _junction(self, m: Match, start: int) -> int:
        """vllm-align: the KV hit's depth when it runs past the state hit (vLLM stops a chunk there)."""
        return m.depth if self.vllm_align and m.depth > start else 0

    def _chunk(self, start: int, total: int, tokens: int, b: Branch | None = None, junction: int = 0) -> int:
        """Tokens for one row: all that is left if it fits, else a chunk cut to a state boundary.
        In chunk-end mode a last chunk that crosses a boundary is cut there too, so that boundary's
        state is cached (vLLM's align mode); the tail runs in a later round. vllm-align applies
        vLLM's own split (core/vllm_split.py)."""
        n = min(total - start, tokens)
        if self.vllm_all:  # need_mamba_block_aligned_split is align-only: vLLM takes what the budget gives
            return max(n, 0)
        if self.vllm_align and b is not None:
            return aligned_split(start, max(n, 0), b.prompt_len, total, self.interval,
                                 self.config.max_num_batched_tokens, self.config.internal_checkpoint, junction,
                                 self.unit)
        if self.hybrid:
            aligned = (start + n) // self.interval * self.interval
            if n < total - start or (self.chunk_end and start < aligned < start + n):
                n = aligned - start
        return max(n, 0)

    def _enqueue(self, b: Branch, front: bool = False) -> None:
        """Puts `b` in the waiting queue by (priority, seq): arrival order within a priority; a
        preempted branch goes before every branch of its priority (vLLM's FCFS prepend)."""
        tr: _Track = b.sched
        if front:
            self._front_seq -= 1
            tr.seq = self._front_seq
        else:
            tr.seq = b.uid
        w = self.waiting
        if not w or (w[-1].priority, w[-1].sched.seq) <= (b.priority, tr.seq):
            w.append(b)  # the common case: an arrival behind everything of its priority
        else:
            bisect.insort(w, b, key=lambda x: (x.priority, x.sched.seq))

    def _victim(self, first: int) -> Branch:
        """The running branch to preempt: the lowest priority (largest value), newest started among
        equals, and never one already placed in this round (running[:first])."""
        run = self.running
        return run[max(range(first, len(run)), key=lambda j: (run[j].priority, j))]

    def _new_pages(self, b: Branch, end: int) -> int:
        return max(0, -(-end // self.block_size) - len(b.sched.page_table))

    def _ensure(self, pages: int, slots: int) -> bool:
        """Makes room for `pages` pages and `slots` slots at once, evicting cached tails and snapshots."""
        p, s, budget = self.pages, self.slots, self.pages.budget
        free_pages, free_slots = p.num_free, s.num_free
        if budget is None and pages <= free_pages and slots <= free_slots:
            return True  # the common case: room without evicting anything
        if pages > free_pages:
            self.index.evict_pages(pages - p.num_free)
        if slots > s.num_free:
            self.index.evict_snapshots(slots - s.num_free)
        if budget is not None:
            for _ in range(2):
                short = pages * p.unit_bytes + slots * s.unit_bytes - budget.free
                if short <= 0:
                    break
                # Memory of the kind asked for goes first; then the other kind.
                if slots and not pages:
                    if not self.index.evict_snapshots(-(-short // max(1, s.unit_bytes))):
                        self.index.evict_pages(-(-short // max(1, p.unit_bytes)))
                elif not self.index.evict_pages(-(-short // max(1, p.unit_bytes))):
                    self.index.evict_snapshots(-(-short // max(1, s.unit_bytes)))
            if pages * p.unit_bytes + slots * s.unit_bytes > budget.free:
                return False
        return pages <= p.num_free and slots <= s.num_free
