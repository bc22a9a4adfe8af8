"""Packing a list of `RowInput`s into the index tensors one batched forward needs.

Everything here is computed once per forward and shared by all layers: token ids and positions of
the packed tokens, where each token's K/V goes in the paged cache, which cache slots each row's
attention reads, and the layouts the linear layers use (flat conv windows, flat scan chunks).

Dependent rows (SPEC §15, `RowInput.after`): a row may start from the state its producer row, earlier
in the same call, reaches at the row's `start`. A dependent of a multi-token producer is *folded* into
its producer's chunked scan (`row_levels`: the producer's level; chunk_plan.py `_fold_schedule`): its
chunks run as further rows of the same scan, from the step after the producer's step that reaches its
start. Only a dependent of a 1-token (decode) producer, which has no chunk step to fold into, runs in a
separate level (its producer's level + 1), each level handing its rows' states at the dependents' depths
to the next. `FOLD = False` runs every dependent in a separate level (the pre-fold engine). The conv
windows and the KV page a dependent's start cuts are taken from the producer in one pass
(`ConvPlan.hand_dst/src`, `kv_forks`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property

import torch

from .cache import RowInput
from .chunk_plan import ChunkPlan, ScanCosts, build_chunk_plan, chunk_candidates, plan_shape
from .level_clock import LevelClock

FOLD = True  # dependents of multi-token producers run in their producer's scan (False: separate levels)


def row_levels(after: Sequence[int | None], lengths: Sequence[int], fold: bool | None = None) -> list[int]:
    """Each row's recurrent level: 0 without a producer; a dependent of a multi-token producer shares its
    producer's level when folding (`fold`, default the module's `FOLD`), otherwise the producer's + 1.
    Producers come before their dependents (`validate_rows`)."""
    fold = FOLD if fold is None else fold
    out: list[int] = []
    for a in after:
        out.append(0 if a is None else out[a] + (0 if fold and lengths[a] > 1 else 1))
    return out


def validate_rows(rows: list[RowInput], block_size: int, num_pages: int, num_slots: int,
                  hybrid: bool) -> None:
    """Raise ValueError naming the row and field when a row cannot be executed."""
    for i, r in enumerate(rows):
        n = len(r.token_ids)
        if n < 1:
            raise ValueError(f"row {i}: token_ids is empty")
        if r.start < 0:
            raise ValueError(f"row {i}: start {r.start} < 0")
        need = -(-(r.start + n) // block_size)
        if len(r.page_table) < need:
            raise ValueError(f"row {i}: page_table has {len(r.page_table)} pages, positions "
                             f"[0, {r.start + n}) need {need}")
        if any(not 0 <= p < num_pages for p in r.page_table[:need]):
            raise ValueError(f"row {i}: page_table has a page id outside [0, {num_pages})")
        if any(not 0 <= j < n for j in r.logits_at):
            raise ValueError(f"row {i}: logits_at must be local indices in [0, {n})")
        if r.after is not None:
            _validate_after(i, rows, block_size)
        if hybrid:
            _validate_states(i, r, n, num_slots)


def _validate_after(i: int, rows: list[RowInput], block_size: int) -> None:
    """A dependent row: an earlier producer row p with p.start < start <= p.end, no state_in, and its own
    page where `start` cuts one. Its pages below that hold the same tokens' K/V as p's (p's own, or the
    tree's copy where p keeps a private duplicate), so they are not checked against p's."""
    r, j = rows[i], rows[i].after
    if not isinstance(j, int) or isinstance(j, bool):
        raise ValueError(f"row {i}: after must be a row index, got {j!r}")
    if not 0 <= j < i:
        chain, k = [i], j
        while k is not None and 0 <= k < len(rows) and k not in chain:
            chain.append(k)
            k = rows[k].after
        if k in chain:
            path = " -> ".join(map(str, chain[chain.index(k):] + [k]))
            raise ValueError(f"row {i}: after={j} makes a cycle of producers ({path})")
        if not 0 <= j < len(rows):
            raise ValueError(f"row {i}: after={j} names no row of this call (rows 0..{len(rows) - 1})")
        raise ValueError(f"row {i}: after={j} names a later row; a producer must come before its dependents")
    p = rows[j]
    a, b, d = p.start, p.start + len(p.token_ids), r.start
    if not a < d <= b:
        raise ValueError(f"row {i}: start {d} is outside its producer row {j}'s (start, end] = ({a}, {b}]")
    if r.state_in is not None:
        raise ValueError(f"row {i}: state_in is {r.state_in} but the row starts from producer row {j}'s state "
                         f"(after={j}); a dependent has no state_in")
    q = d // block_size
    if d % block_size and r.page_table[q] == p.page_table[q]:
        raise ValueError(f"row {i}: page {q}, which its start {d} cuts, is producer row {j}'s page "
                         f"{p.page_table[q]}; a dependent needs its own page there")


def _validate_states(i: int, r: RowInput, n: int, num_slots: int) -> None:
    if r.state_in is None and r.start != 0 and r.after is None:
        raise ValueError(f"row {i}: state_in is None but start = {r.start} (zero state only at 0)")
    if r.state_in is not None and not 0 <= r.state_in < num_slots:
        raise ValueError(f"row {i}: state_in slot {r.state_in} outside [0, {num_slots})")
    for k, slot in r.state_out:
        if not 1 <= k <= n:
            raise ValueError(f"row {i}: state_out point {k} outside [1, {n}]")
        if not 0 <= slot < num_slots:
            raise ValueError(f"row {i}: state_out slot {slot} outside [0, {num_slots})")


@dataclass
class ConvPlan:
    """Flat layout for a depthwise causal conv: per row, its K-1 saved inputs then its tokens."""

    width: int                      # K - 1
    state_pos: torch.Tensor         # [R * width] flat positions of the saved inputs
    token_pos: torch.Tensor         # [N] flat positions of the packed tokens
    total: int
    capture_pos: torch.Tensor       # [C, width] flat positions of the window after n tokens
    capture_slots: torch.Tensor     # [C]
    # dependents' saved inputs: flat[hand_dst] = flat[hand_src] (the producer's inputs before the
    # dependent's start, chains resolved); None when the call has no dependent row
    hand_dst: torch.Tensor | None = None
    hand_src: torch.Tensor | None = None


class BatchContext:
    """Index tensors for one batched forward, built lazily and cached per chunk size / kernel."""

    def __init__(self, rows: list[RowInput], block_size: int, device: torch.device,
                 clock: LevelClock | None = None, scan_costs: ScanCosts | None = None) -> None:
        self.rows, self.block_size, self.device = rows, block_size, device
        self.clock = clock
        self.scan_costs = scan_costs  # measured: each level picks its scan chunk (None: the model's)
        self.lengths = [len(r.token_ids) for r in rows]
        self.offsets = [0]
        for n in self.lengths:
            self.offsets.append(self.offsets[-1] + n)
        self.num_tokens = self.offsets[-1]
        self.extras: dict[str, object] = {}
        self._conv_plans: dict[int, ConvPlan] = {}
        self.dependents = [i for i, r in enumerate(rows) if r.after is not None]
        level = row_levels([r.after for r in rows], self.lengths)  # validated: producers come first
        self.level_of = level
        # dependents run in their producer's scan (same level): dependent row -> producer row
        self.folded = {i: rows[i].after for i in self.dependents if level[i] == level[rows[i].after]}  # type: ignore[index]
        # hand-offs per producer row: (tokens of the producer's row before the dependent starts, dependent)
        self.hands: dict[int, list[tuple[int, int]]] = {}
        for i in self.dependents:
            p = rows[i].after
            self.hands.setdefault(p, []).append((rows[i].start - rows[p].start, i))  # type: ignore[index]
        self.levels = [Level(self, [i for i in range(len(rows)) if level[i] == k], k)
                       for k in range(max(level, default=0) + 1)]

    def _t(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    @cached_property
    def token_ids(self) -> torch.Tensor:
        return self._t([t for r in self.rows for t in r.token_ids])

    @cached_property
    def positions(self) -> torch.Tensor:
        return self._t([r.start + i for r in self.rows for i in range(len(r.token_ids))])

    @cached_property
    def logits_index(self) -> torch.Tensor:
        return self._t([self.offsets[i] + j for i, r in enumerate(self.rows) for j in r.logits_at])

    # ---- attention -------------------------------------------------------------------------
    def _slots(self, page_table: list[int], positions: torch.Tensor) -> torch.Tensor:
        pages = self._t(page_table)[positions // self.block_size]
        return pages * self.block_size + positions % self.block_size

    @cached_property
    def kv_write_index(self) -> torch.Tensor:
        """[N] flat `page * block_size + offset` cache index of each packed token."""
        parts = [self._slots(r.page_table, self.positions[self.offsets[i]:self.offsets[i + 1]])
                 for i, r in enumerate(self.rows)]
        return torch.cat(parts)

    def context_index(self, i: int) -> torch.Tensor:
        """Flat cache indices of positions [0, start + len) of row i (what its attention reads)."""
        key = f"ctx{i}"
        if key not in self.extras:
            r = self.rows[i]
            pos = torch.arange(r.start + self.lengths[i], device=self.device)
            self.extras[key] = self._slots(r.page_table, pos)
        return self.extras[key]  # type: ignore[return-value]

    def context_runs(self, i: int) -> list[tuple[int, int]]:
        """Row i's context [0, start + len) as runs of consecutive flat cache slots, (first, end) each:
        pages allocated one after another form one run, so attention reads the pool through a view
        (one run) or a few slice copies, never a per-token gather."""
        key = f"runs{i}"
        if key not in self.extras:
            r, bs = self.rows[i], self.block_size
            n = r.start + self.lengths[i]
            runs: list[tuple[int, int]] = []
            for q in range(-(-n // bs)):
                lo = r.page_table[q] * bs
                hi = lo + min(bs, n - q * bs)
                if runs and runs[-1][1] == lo:
                    runs[-1] = (runs[-1][0], hi)
                else:
                    runs.append((lo, hi))
            self.extras[key] = runs
        return self.extras[key]  # type: ignore[return-value]

    def decode_groups(self) -> list[tuple[int, int, list[int]]]:
        """1-token rows resuming at start > 0 (not dependents), grouped by the first cache slot of their
        context: (first slot a, shared length m, rows), the rows' contexts all beginning with slots
        [a, a + m), m <= each row's start (so the shared part needs no causal mask)."""
        key = "decode_groups"
        if key not in self.extras:
            groups: dict[int, list[int]] = {}
            for i, r in enumerate(self.rows):
                if self.lengths[i] == 1 and r.start > 0 and r.after is None:
                    groups.setdefault(self.context_runs(i)[0][0], []).append(i)
            out = []
            for a, rows in groups.items():
                m = min(min(self.context_runs(i)[0][1] - a, self.rows[i].start) for i in rows)
                out.append((a, m, rows))
            self.extras[key] = out
        return self.extras[key]  # type: ignore[return-value]

    def decode_group_tokens(self, rows: list[int]) -> torch.Tensor:
        key = f"decode_tok{rows}"
        if key not in self.extras:
            self.extras[key] = self._t([self.offsets[i] for i in rows])
        return self.extras[key]  # type: ignore[return-value]

    def decode_group_rest(self, a: int, m: int, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The slots of each row's context after the shared [a, a + m): [G, R] (padded with the row's
        last slot) and [G, R] validity (None when every row has R)."""
        key = f"decode_rest{a},{m},{rows}"
        if key not in self.extras:
            rests = []
            for i in rows:
                runs = list(self.context_runs(i))
                runs[0] = (runs[0][0] + m, runs[0][1])
                rests.append([s for lo, hi in runs for s in range(lo, hi)])
            width = max(len(x) for x in rests)
            idx = self._t([x + [x[-1]] * (width - len(x)) for x in rests])
            valid = None
            if any(len(x) < width for x in rests):
                valid = torch.tensor([[j < len(x) for j in range(width)] for x in rests], dtype=torch.bool,
                                     device=self.device)
            self.extras[key] = (idx, valid)
        return self.extras[key]  # type: ignore[return-value]

    def causal_mask(self, i: int) -> torch.Tensor | None:
        """Bool mask [len, start+len] for a row resuming at start > 0 (None when not needed)."""
        r, n = self.rows[i], self.lengths[i]
        if n == 1 or r.start == 0:
            return None
        key = f"mask{i}"
        if key not in self.extras:
            q_pos = torch.arange(r.start, r.start + n, device=self.device)
            self.extras[key] = torch.arange(r.start + n, device=self.device)[None, :] <= q_pos[:, None]
        return self.extras[key]  # type: ignore[return-value]

    @cached_property
    def kv_forks(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(destination, source) flat cache indices that fork the page a dependent's start cuts: rows
        [0, start % block_size) of the producer's page into the dependent's own page, applied after
        every row's K/V write; a fork of a fork reads the original. None when there is nothing to fork."""
        bs, src_of, dst = self.block_size, {}, []
        for i in self.dependents:
            r = self.rows[i]
            p = self.rows[r.after]  # type: ignore[index]
            q, cut = divmod(r.start, bs)
            for t in range(cut):
                d, s = r.page_table[q] * bs + t, p.page_table[q] * bs + t
                src_of[d] = src_of.get(s, s)
                dst.append(d)
        if not dst:
            return None
        return self._t(dst), self._t([src_of[d] for d in dst])

    # ---- linear layers ---------------------------------------------------------------------
    @cached_property
    def states_in_place(self) -> list[tuple[int, list[int]]] | None:
        """(slot, other capture slots) of each row when the recurrent layers may step every row's state
        IN ITS SLOT: every row is one decode token that reads its state from a slot it also writes back
        (its running state), no two rows share that slot, and no row captures into a slot another row
        reads. A decode round of the server is this (each stream on its own working slot); the state is
        then never copied out of the pool and back (2 of a decode step's ~6 passes over every state), only
        into a row's extra capture slots (a snapshot at a page or interval boundary). None otherwise."""
        if self.dependents or any(n != 1 for n in self.lengths):
            return None
        ins = [r.state_in for r in self.rows]
        if None in ins or len(set(ins)) != len(ins):
            return None
        read = set(ins)
        out = []
        for r in self.rows:
            caps = [slot for _, slot in r.state_out]
            extra = [slot for slot in caps if slot != r.state_in]
            if r.state_in not in caps or read.intersection(extra):
                return None
            out.append((r.state_in, extra))
        return out

    @cached_property
    def state_in_index(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(slot per row, 0 where none; bool mask of rows starting from the zero state)."""
        slots = [r.state_in if r.state_in is not None else 0 for r in self.rows]
        zero = [r.state_in is None for r in self.rows]
        return self._t(slots), torch.tensor(zero, dtype=torch.bool, device=self.device)

    def conv_plan(self, kernel: int) -> ConvPlan:
        if kernel not in self._conv_plans:
            self._conv_plans[kernel] = self._build_conv_plan(kernel - 1)
        return self._conv_plans[kernel]

    def _build_conv_plan(self, w: int) -> ConvPlan:
        state_pos, token_pos, cap_pos, cap_slots = [], [], [], []
        bases = []
        base = 0
        for r, n in zip(self.rows, self.lengths):
            bases.append(base)
            state_pos.extend(range(base, base + w))
            token_pos.extend(range(base + w, base + w + n))
            for k, slot in r.state_out:
                # the last w inputs after k tokens sit at [base + k, base + k + w)
                cap_pos.append(list(range(base + k, base + k + w)))
                cap_slots.append(slot)
            base += w + n
        cap = self._t(cap_pos).view(len(cap_slots), w)
        plan = ConvPlan(w, self._t(state_pos), self._t(token_pos), base, cap, self._t(cap_slots))
        if self.dependents and w:
            # a dependent's saved inputs are its producer's last w inputs before the dependent's start,
            # which reach into the producer's own saved inputs when the producer ran fewer than w tokens
            src_of: dict[int, int] = {}
            for i in self.dependents:
                p = self.rows[i].after
                k = self.rows[i].start - self.rows[p].start  # type: ignore[index]
                for t in range(w):
                    s = bases[p] + k + t  # type: ignore[index]
                    src_of[bases[i] + t] = src_of.get(s, s)
            plan.hand_dst, plan.hand_src = self._t(list(src_of)), self._t(list(src_of.values()))
        return plan


class Level:
    """The rows of one recurrent level and what they need: decode rows, the chunk plan of the
    multi-token rows, their captures, and their hand-offs to the next level's rows."""

    def __init__(self, batch: BatchContext, rows: list[int], depth: int) -> None:
        self.batch, self.rows, self.depth = batch, rows, depth
        self._chunk_plans: dict[int, ChunkPlan] = {}

    @contextmanager
    def timed(self) -> Iterator[None]:
        """Count this level's recurrent work into the call's LevelClock (by depth), if it has one."""
        if self.batch.clock is not None:
            with self.batch.clock.measure(self.depth):
                yield
        else:
            yield

    def _t(self, values: list[int]) -> torch.Tensor:
        return self.batch._t(values)

    @cached_property
    def decode_rows(self) -> list[int]:
        """1-token rows run by the recurrence directly (not folded: their initial state is known first)."""
        return [i for i in self.rows if self.batch.lengths[i] == 1 and i not in self.batch.folded]

    @cached_property
    def prefill_rows(self) -> list[int]:
        """Rows of the chunked scan: multi-token rows and folded dependents (even of one token)."""
        return [i for i in self.rows if self.batch.lengths[i] > 1 or i in self.batch.folded]

    @cached_property
    def decode_row_index(self) -> torch.Tensor:
        return self._t(self.decode_rows)

    @cached_property
    def decode_token_index(self) -> torch.Tensor:
        return self._t([self.batch.offsets[i] for i in self.decode_rows])

    @cached_property
    def _decode_all_rows(self) -> bool:
        return self.decode_rows == list(range(len(self.batch.rows)))

    def decode_states(self, init: torch.Tensor) -> torch.Tensor:
        """The decode rows' initial states [R, ...]: `init` itself when they are all the call's rows in order
        (`init` is the call's own copy: the step updates it in place), else a copy of their rows."""
        return init if self._decode_all_rows else init[self.decode_row_index]

    def decode_saved(self, states: torch.Tensor) -> torch.Tensor:
        """The decode rows' states to save at `decode_captures`' slots: `states` itself when every decode
        row captures once, in order (no copy), else the capturing rows' copies."""
        local, _ = self.decode_captures
        return states if self._captures_all else states[local]

    @cached_property
    def _captures_all(self) -> bool:
        return self.decode_captures[0].tolist() == list(range(len(self.decode_rows)))

    @cached_property
    def decode_captures(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(local decode-row index, slot) of every state_out of the 1-token rows."""
        rows = self.batch.rows
        pairs = [(d, slot) for d, i in enumerate(self.decode_rows) for _, slot in rows[i].state_out]
        return self._t([p[0] for p in pairs]), self._t([p[1] for p in pairs])

    @cached_property
    def decode_hands(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(local decode-row index, dependent row) of the 1-token rows that have dependents; None if none."""
        pairs = [(d, dep) for d, i in enumerate(self.decode_rows) for _, dep in self.batch.hands.get(i, ())]
        if not pairs:
            return None
        return self._t([p[0] for p in pairs]), self._t([p[1] for p in pairs])

    @cached_property
    def _plan_rows(self) -> list[tuple[int, int, int, list[tuple[int, int]]]]:
        b = self.batch
        return [(i, b.offsets[i], b.lengths[i], b.rows[i].state_out) for i in self.prefill_rows]

    def chunk_plan(self, chunk: int) -> ChunkPlan:
        if chunk not in self._chunk_plans:
            b = self.batch
            self._chunk_plans[chunk] = build_chunk_plan(self._plan_rows, chunk, b.num_tokens, b.device, b.hands,
                                                        b.folded)
        return self._chunk_plans[chunk]

    def scan_plan(self, chunk: int) -> ChunkPlan:
        """The plan this level's scan runs: at the model's `chunk`, or, with measured scan costs, at the
        candidate chunk (`chunk` and its halvings) of least predicted time for this level's own segments."""
        costs = self.batch.scan_costs
        if costs is None:
            return self.chunk_plan(chunk)
        key = -chunk  # the choice, cached per model chunk
        if key not in self._chunk_plans:
            candidates = chunk_candidates(chunk)
            if costs.fixed in candidates:  # what `choose` returns whatever the shapes: skip measuring them
                pick = costs.fixed
            else:
                pick = costs.choose({c: plan_shape(self._plan_rows, c, self.batch.hands) for c in candidates})
            plan = self._chunk_plans[key] = self.chunk_plan(pick)
            clock = self.batch.clock
            if clock is not None and plan.folds:  # once per forward and level (every recurrent layer runs it)
                clock.fold(plan.fold_calls, plan.fold_calls * costs.per_step.get(plan.chunk, 0.0), len(plan.folds),
                           sum(plan.steps[k][2] for k in plan.fold_only),
                           sum(len(dst) for _, dst in plan.folds.values()))
                if clock.time_fold:
                    plan.timer = clock
        return self._chunk_plans[key]
