"""The round scheduler (SPEC §4-5): running branches first, then the waiting queue by a traversal rule.

Engine-agnostic: it sees integers (pages, slots, tokens) and a `now` passed in by the caller. The
simulator and the real engine drive the same object through `add / admit / schedule / complete`.
This file is the algorithm; its parts have their own modules, each with a small interface:
readiness of a waiting branch (`readiness.py`: ĥ, the boundary, Ready / Blocked / Other), placement
and memory (`memory.py`: pages, slots, locks, eviction, preemption), state captures (`captures.py`),
the deferred branches' claim (`claims.py`), Blocked groups (`lookup.py`) and the fragment rule
(`rules.py`).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from itertools import islice

from radixflow.cache.eviction import ReuseCosts
from radixflow.cache.pool import ByteBudget, IdPool
from radixflow.cache.radix import RadixIndex
from radixflow.config import SchedulerConfig
from radixflow.core.batch import Batch, ExecResult, Outcome
from radixflow.core.branch import Branch, BranchState
from radixflow.core.captures import Captures
from radixflow.core.claims import Claims, finishes_now
from radixflow.core.handoff import Forward, HandoffCosts, HandoffCostSource
from radixflow.core.integrity import check_scheduler, holds_nothing
from radixflow.core.lookup import Arrival, BlockedGroups, arrival_hashes
from radixflow.core.memory import Memory
from radixflow.core.misses import at_first_selection
from radixflow.core.policies import AdmissionView, Arm
from radixflow.core.readiness import Readiness
from radixflow.core.rules import Rules
from radixflow.core.track import Plan, Track


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
    handoff_rows: int = 0  # dependent rows (SPEC §15)
    levels: int = 1  # recurrent levels in the forward (1: no dependents)
    handoff_time: float = 0.0  # the part of host_time spent in extra levels


class Scheduler:
    # Blocked groups recognised by one key (core/lookup.py); False: a full lookup per branch (the
    # property tests replay every round both ways and require the same batch).
    group_shortcut = True

    def __init__(self, config: SchedulerConfig, arm: Arm, hybrid: bool, costs: ReuseCosts | None = None,
                 handoff_costs: HandoffCosts | None = None) -> None:
        config.validate()
        self.config = config
        self.arm = arm
        self.hybrid = hybrid
        self.rules = rules = Rules(config, hybrid)
        self.block_size = rules.block_size
        self.interval = rules.interval
        self.branch_points = rules.branch_points
        budget = ByteBudget(config.cache_memory_bytes) if config.cache_memory_bytes > 0 else None
        self.pages = IdPool(config.num_kv_pages, "KV page", config.kv_page_bytes, budget)
        self.slots = IdPool(config.num_state_slots if hybrid else 0, "state slot", config.state_slot_bytes, budget)
        self.index = RadixIndex(config.block_size, self.pages, self.slots, config.eviction)
        if hasattr(self.index.eviction, "costs"):  # flop-aware: the model's costs, or units from the config
            self.index.eviction.costs = costs or ReuseCosts(page_bytes=config.kv_page_bytes or 1,
                                                            slot_bytes=config.state_slot_bytes or 1)
        self.memory = Memory(rules, self.index, self.pages, self.slots)
        self.captures = Captures(rules, self.index, self.pages, self.slots, self.memory.ensure, self._known)
        self.memory.captures = self.captures
        self.ready = Readiness(rules, self.index, self.pages, self.slots, self.memory.ensure, handoff_costs)
        self.handoff = hybrid and config.handoff != "off"  # SPEC §15 (full attention never sees Blocked)
        self.handoff_rows = 0
        # `auto`'s costs read at the start of each round (the engine's calibration); None: fixed costs
        self.handoff_source: HandoffCostSource | None = None
        self._forward: Forward | None = None  # this round's producers, when hand-off is on
        self.held: list[Branch] = []
        self.waiting: list[Branch] = []
        self.running: list[Branch] = []
        self.round = 0
        self.rounds: list[RoundRecord] = []
        self.finished: list[Branch] = []
        self.blocked_total = 0
        self.preemptions = 0
        self.claims: Claims | None = None  # the last scan's reservation for D_t (None: nothing deferred)
        self._next_uid = 0
        self._front_seq = 0
        self._last_arrival: Arrival | None = None  # for hash reuse between siblings
        self._deadline: float | None = None
        self._next_sure = False  # this scan: round t+1 runs whatever the rest of the scan does

    def _known(self) -> tuple[Branch, ...]:
        """Every branch the scheduler knows (held, waiting, running): where branch points are looked for."""
        return (*self.held, *self.waiting, *self.running)

    @property
    def handoff_choices(self) -> dict[str, int]:
        """Consumers handed off, left waiting and recomputed by the hand-off rule (SPEC §15)."""
        return dict(self.ready.choices)

    @property
    def max_level(self) -> int:
        """Dependency depth D of the fragments placed so far (SPEC §9's bound)."""
        return self.memory.max_level

    @property
    def exact_checkpoints(self) -> int:
        """Branch-point and exact-end snapshots made (SPEC §14)."""
        return self.captures.exact_checkpoints

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
        branch.sched = tr = Track()
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
                             self.config.max_num_batched_tokens, self.ready.demand)
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
        self._forward = forward = Forward(batch) if self.handoff else None
        if forward is not None and self.handoff_source is not None:
            self.ready.handoff_costs = self.handoff_source.handoff_costs()
        i = 0
        while i < len(self.running) and rows and tokens:
            b = self.running[i]
            n = self.rules.chunk(b.num_computed_tokens, b.num_tokens, tokens, b, b.sched.junction)
            if n == 0:
                i += 1
                continue
            need = self.memory.new_pages(b, b.num_computed_tokens + n)
            # + a working slot for a branch whose own became its partial-tail snapshot (core/partial_hits.py)
            while not self.memory.ensure(need, int(b.sched.partial_tail is not None and b.sched.working is None)):
                victim = self.memory.victim(self.running, i)
                self._preempt(victim)
                preempted = True
                if victim is b:
                    break
            else:
                self.memory.place(b, b.num_computed_tokens, n, batch, now, None)
                if forward is not None:
                    forward.placed(b.uid)
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
            rec = RoundRecord(batch.round, now, batch.num_rows, batch.num_tokens, batch.deferred)
            if forward is not None:
                rec.handoff_rows, rec.levels = forward.dependents, forward.depth + 1
                self.handoff_rows += forward.dependents
            self.rounds.append(rec)
        else:
            self.round -= 1
        return batch

    def complete(self, batch: Batch, result: ExecResult, now: float) -> list[Branch]:
        """After execution: advance counters, sample, publish C_{t+1}, finish branches."""
        if self.rounds and self.rounds[-1].round == batch.round:
            self.rounds[-1].host_time = result.host_time
            self.rounds[-1].capture_time = result.capture_time
            self.rounds[-1].handoff_time = result.handoff_time
            if result.levels is not None:
                self.rounds[-1].levels = result.levels
        done = []
        for i, frag in enumerate(batch.fragments):
            b = frag.branch
            tr: Track = b.sched
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
            self.memory.release(branch, keep_end_snapshot=False)
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
        forward = self._forward
        if forward is not None:
            forward.queue = waiting
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
                    if (tokens < interval or d % interval) and self.rules.chunk(d, b.num_tokens, tokens, b) == 0:
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
            if forward is not None:
                forward.pos = pos
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
            if forward is not None:
                forward.pos = pos
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
        claims = Claims(cfg.max_num_seqs, cfg.max_num_batched_tokens, self.block_size, self.rules.chunk,
                        slot_per_row=1 if self.hybrid else 0)
        ends = {f.branch.uid: f.end for f in batch.fragments}
        for b in self.running:  # placed this round or not (a running row the token budget left out)
            claims.carry(b, ends.get(b.uid, b.num_computed_tokens))
        return claims

    def _check(self, b: Branch, rows: int, tokens: int, allow_split: bool = False, claims: Claims | None = None):
        """σ_t(b | B) at the scan position (core/readiness.py), with this scan's state."""
        return self.ready.check(b, rows, tokens, allow_split, claims, self._next_sure, self.arm.frag, self._forward)

    # ================================================================== placing rows
    def _select(self, b: Branch, plan: Plan, batch: Batch, now: float) -> None:
        tr: Track = b.sched
        start = plan.start
        if b.first_selected_at is None:
            b.first_selected_at = now
            b.cached_tokens = start
            b.identity_hit = plan.match.depth if self.branch_points is None else self.ready.identity(b, plan.match)
            b.misses = at_first_selection(self.index, b.namespace, b.tokens, tr.hashes, b.prompt_len,
                                          b.identity_hit, start, (b.blocked_rounds, b.blocked_tokens))
        b.state = BranchState.RUNNING
        self.running.append(b)
        tr.group_key = tr.next_hash = None
        b.num_computed_tokens = start
        tr.junction = self.rules.junction(plan.match, start) if self.rules.vllm_align else 0
        forward = self._forward
        if plan.after is not None:  # a dependent row of this forward (SPEC §15)
            self.memory.start_dependent(b, plan, now)
            frag = self.memory.place(b, start, plan.num_tokens, batch, now, None, first=True)
            frag.after = plan.after
            forward.placed(b.uid, forward.levels[plan.after] + 1)
            return
        state_in, copy_in = self.memory.start(b, plan, now)
        self.memory.place(b, start, plan.num_tokens, batch, now, state_in, first=True, copy_in=copy_in)
        if forward is not None:
            forward.placed(b.uid)

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
        self.memory.release(b, keep_end_snapshot=True)
        self.running.remove(b)
        b.state = BranchState.FINISHED
        b.finished_at = now
        self.finished.append(b)

    def _preempt(self, b: Branch) -> None:
        """Recompute preemption (as vLLM): drop everything, go back to the front of the queue."""
        self.memory.preempt(b)
        self.running.remove(b)
        self.preemptions += 1
        b.state = BranchState.WAITING
        self._enqueue(b, front=True)

    def _enqueue(self, b: Branch, front: bool = False) -> None:
        """Puts `b` in the waiting queue by (priority, seq): arrival order within a priority; a
        preempted branch goes before every branch of its priority (vLLM's FCFS prepend)."""
        tr: Track = b.sched
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
