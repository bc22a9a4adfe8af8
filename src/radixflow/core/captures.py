"""State captures of hybrid rows (SPEC §2, §13, §14): which depths a row snapshots in its own forward,
and what a finishing branch leaves as its end snapshot.

`Captures.row` lists a row's `state_out` (interval boundaries crossed, chunk ends, vLLM's exported
checkpoint and partial tail, branch points, the end-of-branch candidate, the row's end). The
snapshots it makes are pending until the round is published. `Captures.keep_end` turns a finishing
branch's rolling or working slot into its end snapshot. It allocates from the pools through `ensure`
(the scheduler's memory, which may evict); it is the `SchedulerPools` the helpers in checkpoints.py and
partial_hits.py take.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from radixflow.cache.node import Snapshot
from radixflow.cache.pool import IdPool
from radixflow.cache.radix import RadixIndex
from radixflow.core.branch import Branch
from radixflow.core.checkpoints import attach_exact_end, capture_exact
from radixflow.core.partial_hits import capture_partial
from radixflow.core.rules import Rules
from radixflow.core.vllm_split import internal_checkpoint


class Captures:
    def __init__(self, rules: Rules, index: RadixIndex, pages: IdPool, slots: IdPool,
                 ensure: Callable[[int, int], bool], others: Callable[[], Iterable[Branch]]) -> None:
        self.rules = rules
        self.config = rules.config
        self.block_size = rules.block_size
        self.unit = rules.unit
        self.index = index
        self.pages = pages
        self.slots = slots
        self.ensure = ensure
        self._others = others  # every known branch (held, waiting, running): branch points
        self.exact_checkpoints = 0  # branch-point and exact-end snapshots made (SPEC §14)

    def row(self, b: Branch, start: int, end: int, now: float, copies: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """State captures of a hybrid row: every interval boundary in (start, end], the last page
        boundary (a candidate end-of-branch snapshot) and the row's end (the working state)."""
        r = self.rules
        tr = b.sched
        out: list[tuple[int, int]] = []
        caching = self.config.enable_prefix_caching and not tr.no_cache
        end_slot = None  # where the row's end state goes, when not the working slot
        if caching and r.chunk_end:
            if r.vllm_align:  # a state exported from inside the final chunk (no cut there)
                ckpt = internal_checkpoint(start, end, b.prompt_len, b.num_tokens, r.interval,
                                           self.config.internal_checkpoint, self.unit)
                if ckpt is not None and ckpt % self.block_size == 0:
                    self.at(b, ckpt, start, now, out)
                elif r.partial_hits:  # the working slot may become the partial-tail snapshot
                    end_slot = capture_partial(self, b, start, end, ckpt, now, out, copies)
            if end % r.interval == 0:
                self.at(b, end, start, now, out)
            if r.branch_points is not None:  # our extension on vLLM's grid (docs/checkpoints.md)
                self._branch_points(b, start, end, now, out, copies)
        elif caching:
            first_b = (start // r.interval + 1) * r.interval
            self._boundaries(b, range(first_b, end + 1, r.interval), start, now, out)
            if r.branch_points is not None:  # exact depths; the branch's end is snapshotted at finish
                self._boundaries(b, self._tail(b, start, end), start, now, out)
                self._branch_points(b, start, end, now, out, copies)
                out.append((end - start, tr.working))
                return out
            # End-of-branch snapshot: once past the prompt's last chunk, the state at the last page
            # boundary passed is kept in one extra slot; at finish it becomes the branch's end
            # snapshot (a 1-token branch holds that slot for one round only).
            page_end = end // self.block_size * self.block_size
            if end >= b.prompt_len and page_end > start and page_end % r.interval:
                if tr.rolling is None and self.ensure(0, 1):
                    tr.rolling = self.slots.allocate_one()
                if tr.rolling is not None:
                    out.append((page_end - start, tr.rolling))
                    tr.rolling_depth = page_end
        out.append((end - start, tr.working if end_slot is None else end_slot))
        return out

    def _tail(self, b: Branch, start: int, end: int) -> range:
        """Tail checkpoints (`tail_checkpoints` tokens): the depths every 4 blocks in (start, end] within
        that many tokens before the prompt's end, off the interval grid (those are captured anyway).
        A later prompt that shares this one up to a point inside its last tokens (the next question on
        the same document) then resumes within 4 blocks of it instead of at the last interval boundary
        (a 512-token interval: 256 tokens recomputed on average). llama.cpp's server checkpoints a
        prompt's tail for the same reason (`checkpoint_offsets`)."""
        window = self.config.tail_checkpoints
        if window <= 0:
            return range(0)
        step = 4 * self.block_size
        first = (max(start, b.prompt_len - window) // step + 1) * step
        return range(first, min(end, b.prompt_len - 1) + 1, step)

    def _branch_points(self, b: Branch, start: int, end: int, now: float, out: list[tuple[int, int]],
                       copies: list[tuple[int, int]]) -> None:
        """Branch-point checkpoints of a row (core/checkpoints.py): exact depths in (start, end]."""
        for depth in self.rules.branch_points.depths(b, start, end, self._others(), b.identity_hit or 0):
            if depth % self.block_size == 0:
                self.at(b, depth, start, now, out)
            else:
                capture_exact(self, b, depth, start, now, out, copies)

    def _boundaries(self, b: Branch, depths: range, start: int, now: float, out: list[tuple[int, int]]) -> None:
        """The interval boundaries of a row, shallowest first. Where no slot can be had part way (rows
        of one round capture together, and their snapshots are pending until it ends), each deeper
        boundary takes the slot of this row's shallowest capture made here: what the row keeps is its
        deepest boundaries, the states that serve every request reading its tokens furthest (its
        siblings, its next turn, a consumer waiting on it). With slots to spare nothing moves. Only
        with `--handoff on|auto`, whose rounds run producers side by side (docs/handoff.md, "Snapshot
        slots"); `off` keeps the first boundaries that find a slot, as before."""
        tr = b.sched
        keep_deepest = self.config.handoff != "off"
        mine: list[Snapshot] = []  # this row's new captures, shallowest first
        for depth in depths:
            node = self.index.node_after(tr.hashes, depth // self.block_size)  # registered by Memory.place
            if node.snapshot is not None:
                continue
            snap = self._new(b, node, now)
            if snap is None:
                if not (mine and keep_deepest):
                    continue
                snap = mine.pop(0)
                self.index.move_pending(snap, node)
            mine.append(snap)
        out.extend((s.depth - start, s.slot) for s in mine)

    def at(self, b: Branch, depth: int, start: int, now: float, out: list[tuple[int, int]]) -> None:
        """A pending snapshot at `depth` written by this row, unless one exists or no slot can be had."""
        node = self.index.node_after(b.sched.hashes, depth // self.block_size)  # registered by Memory.place
        if node.snapshot is None and (snap := self._new(b, node, now)) is not None:
            out.append((depth - start, snap.slot))

    def _new(self, b: Branch, node, now: float) -> Snapshot | None:
        """A pending snapshot at the end of `node` that `b`'s row writes; None where no slot can be had."""
        if not self.ensure(0, 1):
            return None
        snap = self.index.attach_snapshot(node, self.slots.allocate_one(), b.uid, now)
        snap.level = b.sched.level
        return snap

    def keep_end(self, b: Branch) -> None:
        """A finishing branch: its rolling slot (boundary mode) or its working slot (branch mode)
        becomes its end snapshot where it can; a slot kept is taken off the branch."""
        tr = b.sched
        if tr.rolling is not None and self._attach_rolling(b):
            tr.rolling = None
        if tr.working is not None and self.rules.branch_points is not None and attach_exact_end(self, b):
            tr.working = None

    def _attach_rolling(self, b: Branch) -> bool:
        tr = b.sched
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
