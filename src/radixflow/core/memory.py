"""Placement and memory: the pages, slots and tree locks of the rows a round places (nano-vllm's
block manager, in the scheduler's terms).

`Memory` makes room (`ensure`, evicting cached tails and snapshots), starts a selected branch on its
hit (`start`: the matched path locked, its pages, the snapshot it restores from), places a row
(`place`: the fragment's pages, its full pages registered in the tree at once, its captures) and
gives everything back (`release`, `preempt`). It never decides who runs; the scheduler does.
"""

from __future__ import annotations

from radixflow.cache.pool import IdPool
from radixflow.cache.radix import RadixIndex, chain_hashes
from radixflow.core.batch import Batch, Fragment
from radixflow.core.branch import Branch
from radixflow.core.captures import Captures
from radixflow.core.partial_hits import continue_partial, release_partial
from radixflow.core.rules import Rules
from radixflow.core.track import Plan


class Memory:
    def __init__(self, rules: Rules, index: RadixIndex, pages: IdPool, slots: IdPool) -> None:
        self.rules = rules
        self.config = rules.config
        self.block_size = rules.block_size
        self.index = index
        self.pages = pages
        self.slots = slots
        self.captures: Captures | None = None  # set by the scheduler (captures allocate through `ensure`)
        self.max_level = 0  # dependency depth D of the fragments placed so far

    def ensure(self, pages: int, slots: int) -> bool:
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

    def new_pages(self, b: Branch, end: int) -> int:
        """Pages a row of `b` ending at `end` adds to its page table."""
        return max(0, -(-end // self.block_size) - len(b.sched.page_table))

    def start(self, b: Branch, plan: Plan, now: float) -> tuple[int | None, tuple[int, int] | None]:
        """A selected branch takes its hit: the matched path locked, its pages, the snapshot it restores
        from (locked for the round; a tail snapshot's page copied into a private one) and a working
        slot. Returns (state_in, copy_in) for its first row."""
        tr = b.sched
        start = plan.start
        self.index.request_begins(b.namespace, b.tokens, plan.match)
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
        if self.rules.hybrid:
            tr.working = self.slots.allocate_one()
        return state_in, copy_in

    def start_dependent(self, b: Branch, plan: Plan, now: float) -> None:
        """A dependent row (SPEC §15) takes the producer's path: the matched path locked, the pages below
        its start d from the tree (the producer's, pending), a working slot the engine fills with the
        producer's state at d. A page that d cuts is the row's own (`place` allocates it; the engine
        forks the producer's first d % block_size rows into it). Nothing is read from the cache."""
        tr = b.sched
        node = plan.match.node
        self.index.request_begins(b.namespace, b.tokens, plan.match)
        self.index.lock(node, now)
        tr.node = node
        tr.page_table = self.index.pages_upto(plan.match, plan.start // self.block_size)
        tr.level = plan.snapshot.level  # the chain depth D, as if it had waited for the snapshot
        tr.working = self.slots.allocate_one()

    def place(self, b: Branch, start: int, n: int, batch: Batch, now: float, state_in: int | None,
              first: bool = False, copy_in: tuple[int, int] | None = None) -> Fragment:
        """Row [start, start + n) of `b` into `batch`: its pages (the caller made room), its full pages
        registered in the tree (pending), its state captures."""
        tr = b.sched
        bs = self.block_size
        end = start + n
        if tr.partial_tail is not None and tr.working is None:
            # its state is in the snapshot, not a working slot
            state_in = continue_partial(self.captures, b, start)
        table = tr.page_table
        first_new = len(table)
        new = -(-end // bs) - first_new
        if new > 0:
            table.extend([self.pages.allocate_one()] if new == 1 else self.pages.allocate(new))
        full = end // bs
        adopted = full  # the tree holds pages [adopted, full) of the table; the rest are the row's own
        if self.config.enable_prefix_caching and full:
            cuts = None
            r = self.rules
            if r.hybrid and not r.chunk_end and r.branch_points is None:  # Captures.row's depths
                step = r.interval // bs
                cuts = range((start // r.interval + 1) * step, full, step)
            adopted = self.register(b, full, now, cuts, start // bs)
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
        if self.rules.hybrid:
            if not first and state_in is None:
                state_in = tr.working
            frag.state_in = state_in
            frag.state_out = self.captures.row(b, start, end, now, frag.copies_after)
        batch.fragments.append(frag)
        b.num_fragments += 1
        return frag

    def register(self, b: Branch, full: int, now: float, cuts: range | None = None, known: int = 0) -> int:
        """Registers the branch's full pages in the index (pending: usable by full attention this round).
        `known`: pages expected in the tree already (the row's start; `RadixIndex.match` checks it).
        Returns the first page the tree adopted (`full` when none); the caller keeps `private` in step."""
        tr = b.sched
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

    def release(self, b: Branch, keep_end_snapshot: bool) -> None:
        """Gives back everything `b` holds; a finishing branch first leaves its end snapshot."""
        tr = b.sched
        if keep_end_snapshot and (tr.rolling is not None or tr.working is not None):
            self.captures.keep_end(b)
        if tr.rolling is not None:
            self.slots.free([tr.rolling])
            tr.rolling = None
        if tr.working is not None:
            self.slots.free([tr.working])
            tr.working = None
        if tr.read_snapshot is not None:
            tr.read_snapshot.lock -= 1
            tr.read_snapshot = None
        release_partial(b)
        if keep_end_snapshot:
            self.index.request_ends(tr.node, b.cached_tokens or 0)
        self.index.unlock(tr.node)
        tr.node = None
        self.pages.free(sorted(tr.private))
        tr.private.clear()
        tr.page_table = []
        tr.rolling_depth = 0

    def preempt(self, b: Branch) -> None:
        """Recompute preemption (as vLLM): drop everything; the branch starts again from its hit."""
        self.release(b, keep_end_snapshot=False)
        b.num_computed_tokens = 0
        b.num_preemptions += 1

    @staticmethod
    def victim(running: list[Branch], first: int) -> Branch:
        """The running branch to preempt: the lowest priority (largest value), newest started among
        equals, and never one already placed in this round (running[:first])."""
        return running[max(range(first, len(running)), key=lambda j: (running[j].priority, j))]
