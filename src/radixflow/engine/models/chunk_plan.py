"""Flat chunk layout of a batch's multi-token rows, for the chunked linear scans (GDN and SSD).

Each row is cut into segments at its state_out points and every segment is zero-padded to a
multiple of `chunk`: zero padding leaves a gated-delta or SSD state untouched, so the state after
a segment's last chunk is exactly the state after that many tokens. The chunks of all rows are
stacked step-major with the rows sorted by chunk count (longest first), so at scan step s the
active rows are the first n_s local rows and their chunks a contiguous range: every per-step
access in the sequential scan is a view, never a gather.

A plan covers the rows of one recurrent level (SPEC §15): a row's `handoffs` are cut like its captures,
and the state there is handed to a dependent row of the next level instead of written to a slot.

Folded dependents (`folded`, batch.py `row_levels`): a dependent of a multi-token producer runs in the
producer's own plan. Its chunks start at the scan step after the producer's step that reaches the
dependent's start (a cut, like a capture), and its local state is the producer's state there (`folds`:
copied inside the scan). The local rows are then ordered folded rows first, so that at each step the
active rows are one contiguous run wherever possible (`_fold_schedule`); a step whose active rows are not
contiguous is split into one scan call per run. `base_calls` is what the plan would take without its
folded rows: the fold's extra sequential calls are `fold_calls`, and they are exactly the calls whose
rows are all folded rows (`fold_only`: the rows without a producer are one run at every step, so each
step with one of them active has one call holding them). With a `timer` (level_clock.py `LevelClock`, set
while the engine calibrates) `blocked_scan` times those calls and the state copies at the fold points:
the fold's measured cost, beside its price.

The chunk is chosen by measured cost (`ScanCosts.choose`) when the caller gives scan costs: per level,
or once for every level (`ScanCosts.fixed`: the engine picks it for segments of its state interval, so
a cache hit and a cold run of the same prompt cut the same chunks). Rows cut at every 16-token state
boundary and short dependent tails then run with a small chunk instead of padding every segment to the
model's 64; without costs, the model's chunk.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

import torch


@dataclass
class ChunkPlan:
    rows: list[int]                 # batch row index of each local row, in scan order
    chunk: int
    num_slots: int                  # M * chunk token slots, padding included
    token_index: torch.Tensor       # [Np] packed indices of these rows' tokens, ascending
    flat_index: torch.Tensor        # [Np] where each of those tokens sits in the [M * chunk] layout
    # per scan call: (first chunk id, first active local row, number of active local rows); the calls
    # of one step are consecutive, one per contiguous run of active local rows
    steps: list[tuple[int, int, int]]
    captures: dict[int, tuple[torch.Tensor, torch.Tensor]]  # call -> (local rows, slots) saved after it
    # call -> (local rows, dependent batch rows) whose initial state is the state after that call
    handoffs: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    # call -> (local rows, local rows of folded dependents) whose state starts from theirs after that call
    folds: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    all_tokens: bool = False        # token_index is every packed token, in order (no 1-token rows)
    base_calls: int = 0             # scan calls of the same plan without its folded rows
    fold_only: frozenset[int] = frozenset()  # the calls running folded rows only (len == fold_calls)
    timer: FoldTimer | None = None  # times the fold_only calls and the fold copies (None: not measured)

    @property
    def fold_calls(self) -> int:
        """The sequential scan calls the folded rows add (more steps, or steps split into runs)."""
        return len(self.steps) - self.base_calls

    def prepare(self) -> None:
        """Build the lazily made parts now (before several threads run scans over the one plan)."""
        _ = self.row_index, self.runs

    @cached_property
    def row_index(self) -> torch.Tensor:
        """`rows` as a tensor (built once per plan, not once per recurrent layer)."""
        return torch.tensor(self.rows, dtype=torch.long, device=self.token_index.device)

    @cached_property
    def runs(self) -> list[tuple[int, int, int, int]]:
        """(chunk, first of its tokens in token_index order, that token's packed index, token count) of
        every chunk that holds tokens. A chunk's tokens are consecutive tokens of one row, at the
        chunk's first positions (padding only at its end): each chunk is one slice of the packed rows."""
        slots = self.flat_index.tolist()
        tokens = self.token_index.tolist()
        runs: list[tuple[int, int, int, int]] = []
        for j, slot in enumerate(slots):
            m, pos = divmod(slot, self.chunk)
            if pos == 0:
                runs.append((m, j, tokens[j], 1))
            else:
                prev = runs[-1]
                assert prev[0] == m and prev[1] + pos == j and prev[2] + pos == tokens[j], "chunk not a slice"
                runs[-1] = (m, prev[1], prev[2], pos + 1)
        return runs

    def to_chunks(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """Packed parts [N, H, d_i] (or [N, H]) -> one [M, H, chunk, sum(d_i)] tensor, zero padded.

        On CPU each chunk is one slice of the packed rows, copied (transposed) straight into its place:
        every input is read once and the layout written once, only the padding is zeroed. On GPU one
        scatter per part (a kernel per chunk would be a launch per chunk).
        """
        parts = [p[..., None] if p.dim() == 2 else p for p in parts]
        width = sum(p.shape[-1] for p in parts)
        heads = parts[0].shape[1]
        buf = parts[0].new_empty(self.num_slots // self.chunk, heads, self.chunk, width)
        if buf.is_cuda:
            return self._scatter(parts, buf)
        bounds = []
        col = 0
        for p in parts:
            bounds.append((col, col + p.shape[-1], p.transpose(0, 1)))    # [H, N, d]: a chunk is a slice
            col += p.shape[-1]
        empty = set(range(buf.shape[0]))
        with one_thread():
            for m, _, t0, n in self.runs:
                dst = buf[m]
                for lo, hi, src in bounds:
                    dst[:, :n, lo:hi].copy_(src[:, t0:t0 + n])
                if n < self.chunk:
                    dst[:, n:].zero_()
                empty.discard(m)
            for m in empty:   # a chunk with no token (row_chunks makes none; kept correct regardless)
                buf[m].zero_()
        return buf

    def _scatter(self, parts: list[torch.Tensor], buf: torch.Tensor) -> torch.Tensor:
        buf.zero_()
        view = buf.transpose(1, 2)                                   # [M, chunk, H, width]
        chunk_of = torch.div(self.flat_index, self.chunk, rounding_mode="floor")
        pos = self.flat_index.remainder(self.chunk)
        col = 0
        for p in parts:
            src = p if self.all_tokens else p.index_select(0, self.token_index)
            view[..., col:col + p.shape[-1]].index_put_((chunk_of, pos), src)
            col += p.shape[-1]
        return buf

    def from_chunks(self, chunks: torch.Tensor, out: torch.Tensor) -> None:
        """Chunk outputs [M, H, >= chunk, d] (their first `chunk` positions) -> out [N, H, d] at the
        plan's tokens, the inverse of `to_chunks` (CPU: one transposed slice copy per chunk)."""
        if chunks.is_cuda:
            view = chunks.transpose(1, 2)
            chunk_of = torch.div(self.flat_index, self.chunk, rounding_mode="floor")
            out.index_copy_(0, self.token_index, view[chunk_of, self.flat_index.remainder(self.chunk)])
            return
        with one_thread():
            for m, _, t0, n in self.runs:
                out[t0:t0 + n].copy_(chunks[m, :, :n].transpose(0, 1))


@contextmanager
def one_thread() -> Iterator[None]:
    """Torch on one thread inside (the caller's count restored): for loops of many small CPU kernels,
    each of which would otherwise be a parallel region that waits for every thread (on a loaded
    machine, for a descheduled one)."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class FoldTimer(Protocol):
    """What `blocked_scan` reports the fold's own work to (level_clock.py `LevelClock`)."""

    def fold_start(self) -> object: ...

    def fold_stop(self, token: object) -> None: ...


def blocked_scan(plan: ChunkPlan, inputs: tuple[torch.Tensor, ...], state: torch.Tensor,
                 intra: Callable[..., tuple[torch.Tensor, ...]],
                 step: Callable[..., tuple[torch.Tensor, torch.Tensor]],
                 out: torch.Tensor, save: Callable[[torch.Tensor, torch.Tensor], None],
                 hand: Callable[[torch.Tensor, torch.Tensor], None] | None = None) -> None:
    """Run a chunked scan over the plan: `intra` on blocks of chunks, then `step` chunk by chunk.

    inputs: [M, ...] chunk tensors; state: [R, ...] per local row, updated in place; out: [M, ...].
    `intra` runs on blocks of consecutive steps (about `_BLOCK_ELEMS` elements per chunk-by-chunk
    matrix) instead of all chunks at once, so on CPU its intermediates stay in cache while the
    scan consumes them. save(local_rows, slots) is called after each call that has captures, and
    hand(local_rows, dependent_rows) after each call that has hand-offs; a folded dependent's state is
    copied from its producer's local row after the producer's call that reaches its start. With
    `plan.timer`, the calls of folded rows only and those copies are timed (the fold's measured cost).
    """
    timer = plan.timer if plan.folds else None
    per_chunk = inputs[0][0].numel() // max(inputs[0].shape[-1], 1) * plan.chunk  # ~ H * C * C
    budget = len(plan.steps) * len(plan.rows) if inputs[0].is_cuda else max(1, _BLOCK_ELEMS // per_chunk)
    for c0, c1, group in _step_groups(plan, budget):
        pre = intra(*(t[c0:c1] for t in inputs))
        for s, first, lo, n in group:
            f = first - c0
            tick = timer.fold_start() if timer is not None and s in plan.fold_only else None
            # active rows are local lo..lo+n-1 and their chunks first..first+n-1: views, no gathers
            out[first:first + n], state[lo:lo + n] = step(state[lo:lo + n], *(t[f:f + n] for t in pre))
            if tick is not None:
                timer.fold_stop(tick)
            if s in plan.captures:
                save(*plan.captures[s])
            if hand is not None and s in plan.handoffs:
                hand(*plan.handoffs[s])
            if s in plan.folds:
                tick = timer.fold_start() if timer is not None else None
                src, dst = plan.folds[s]
                state.index_copy_(0, dst, state.index_select(0, src))
                if tick is not None:
                    timer.fold_stop(tick)


# torch's vectorised CPU exp keeps its fast path (~0.2 ns an element here) only while the result is a
# normal float: an exponent below ~-87.34 (a denormal or zero result), above ~88.7 or -inf sends every
# such element down a scalar path of ~35 ns (measured on this machine's AVX-512 build, FTZ on or off).
# The scans' cumulative log-decays reach -100 and beyond inside a chunk on real models, and the decay
# masks were made by exp(-inf) above the diagonal: that path was a fifth of an SSD layer's time.
EXP_FLOOR = -87.0   # exp(-87) = 1.6e-38, the smallest normal floats' range: a product with it is
#                     flushed (the scans run with FTZ/DAZ) or lost in rounding, as the denormal was


def decay_exp(x: torch.Tensor) -> torch.Tensor:
    """exp(x) for log-decays x <= 0, floored at exp(EXP_FLOOR) (see above): a new tensor."""
    return x.clamp(min=EXP_FLOOR).exp_()


def decay_mask(cum: torch.Tensor) -> torch.Tensor:
    """[..., C, C] with exp(cum_i - cum_j) for j <= i and exactly 0 above the diagonal, from the
    within-chunk cumulative log-decays cum [..., C] (nonincreasing, so every kept exponent is <= 0):
    exponents clamped to [EXP_FLOOR, 0] (the upper triangle's positive ones to 0) before the exp and
    the upper triangle zeroed after it, instead of exp(-inf)."""
    c = cum.shape[-1]
    seg = (cum[..., :, None] - cum[..., None, :]).clamp_(EXP_FLOOR, 0.0).exp_()
    return seg.masked_fill_(~_lower(c, cum.device), 0.0)


@functools.lru_cache(maxsize=16)
def _lower(c: int, device: torch.device) -> torch.Tensor:
    return torch.ones(c, c, dtype=torch.bool, device=device).tril()


_BLOCK_ELEMS = 1 << 19


def _step_groups(plan: ChunkPlan, budget: int) -> list[tuple[int, int, list[tuple[int, int, int, int]]]]:
    """Consecutive calls grouped so a group spans at most `budget` chunks (at least one call)."""
    groups: list[tuple[int, int, list[tuple[int, int, int, int]]]] = []
    for s, (first, lo, n) in enumerate(plan.steps):
        if groups and first + n - groups[-1][0] <= budget:
            c0, _, members = groups[-1]
            groups[-1] = (c0, first + n, members + [(s, first, lo, n)])
        else:
            groups.append((first, first + n, [(s, first, lo, n)]))
    return groups


def row_chunks(offset: int, n: int, cuts: list[tuple[int, int]], chunk: int,
               hands: Sequence[tuple[int, int]] = ()) -> tuple[list[list[int]], list[tuple[int, int]],
                                                           list[tuple[int, int]]]:
    """Chunks of one row (packed token index per slot, -1 = padding), its (step, slot) captures and
    its (step, dependent row) hand-offs; `cuts` are (k, slot), `hands` are (k, dependent row)."""
    slots_at: dict[int, list[int]] = {}
    for k, slot in cuts:
        slots_at.setdefault(k, []).append(slot)
    deps_at: dict[int, list[int]] = {}
    for k, dep in hands:
        deps_at.setdefault(k, []).append(dep)
    chunks: list[list[int]] = []
    captures: list[tuple[int, int]] = []
    handed: list[tuple[int, int]] = []
    prev = 0
    for cut in sorted(set(slots_at) | set(deps_at) | {n}):
        toks = list(range(offset + prev, offset + cut))
        toks += [-1] * (-len(toks) % chunk)
        chunks.extend(toks[i:i + chunk] for i in range(0, len(toks), chunk))
        captures.extend((len(chunks) - 1, slot) for slot in slots_at.get(cut, []))
        handed.extend((len(chunks) - 1, dep) for dep in deps_at.get(cut, []))
        prev = cut
    return chunks, captures, handed


def plan_shape(rows: list[tuple[int, int, int, list[tuple[int, int]]]], chunk: int,
               hands: dict[int, list[tuple[int, int]]] | None = None) -> tuple[int, int]:
    """(token slots, scan steps) of `build_chunk_plan(rows, chunk, ...)`, from the host-side lengths only."""
    hands = hands or {}
    slots = steps = 0
    for i, _, n, cuts in rows:
        prev, count = 0, 0
        for cut in sorted({k for k, _ in cuts} | {k for k, _ in hands.get(i, ())} | {n}):
            count += -(-(cut - prev) // chunk)
            prev = cut
        slots += count * chunk
        steps = max(steps, count)
    return slots, steps


@dataclass
class ScanCosts:
    """Measured cost of a chunked scan at each chunk size: seconds per token slot (padding included)
    and per sequential step, for all recurrent layers of a model together (`engine/calibration.py`
    measures them). `choose` picks the chunk a level runs with."""

    per_slot: dict[int, float]
    per_step: dict[int, float]
    fixed: int | None = None  # every level runs this chunk (an engine's choice for its state interval)

    def predict(self, chunk: int, slots: int, steps: int) -> float:
        return self.per_slot[chunk] * slots + self.per_step[chunk] * steps

    def choose(self, shapes: dict[int, tuple[int, int]]) -> int:
        """The chunk of least predicted time among `shapes` (chunk -> (slots, steps)); ties: the larger."""
        if self.fixed is not None and self.fixed in shapes:
            return self.fixed
        known = [c for c in shapes if c in self.per_slot]
        if not known:
            return max(shapes)
        return min(known, key=lambda c: (self.predict(c, *shapes[c]), -c))


# Without measured costs, the chunk a CPU scan runs with (at most the model's): the chunked forms' products
# per token grow with the chunk (C x d per token for the intra-chunk terms) while their state terms do
# not, and on CPU eager kernels the extra sequential steps of a smaller chunk cost less than that. One
# layer's scan on engine_profile's case (b) rows at real widths (docs/engine_speed.md): GDN 32 vs 64
# x1.32 on 1 thread, x1.00-1.06 on 2; SSD 64 vs 128 x0.98 on 1 thread, x1.12 on 2.
CPU_CHUNK = {"gdn": 32, "ssd": 64}


def unmeasured_chunk(kind: str, model_chunk: int, device: torch.device, costs: ScanCosts | None) -> int:
    """The chunk handed to a level's plan: the model's when costs are measured (they choose among it and
    its halvings) or on GPU; on CPU without costs, at most CPU_CHUNK[kind]."""
    if costs is not None or device.type != "cpu":
        return model_chunk
    return min(model_chunk, CPU_CHUNK[kind])


def chunk_candidates(chunk: int, smallest: int = 8) -> list[int]:
    """The model's chunk and its halvings down to `smallest` (each divides the one before)."""
    out = [chunk]
    while out[-1] % 2 == 0 and out[-1] // 2 >= smallest:
        out.append(out[-1] // 2)
    return out


def build_chunk_plan(rows: list[tuple[int, int, int, list[tuple[int, int]]]], chunk: int, num_tokens: int,
                     device: torch.device, hands: dict[int, list[tuple[int, int]]] | None = None,
                     folded: dict[int, int] | None = None) -> ChunkPlan:
    """rows: (batch row index, packed offset, length, state_out) of each multi-token row; hands: batch
    row -> (k, dependent row) of the rows whose state after k tokens a dependent starts from; folded:
    dependent batch row -> its producer's batch row, both in `rows` (the dependent runs in this plan)."""
    hands = hands or {}
    folded = folded or {}
    per_row = [row_chunks(off, n, cuts, chunk, hands.get(i, ())) for i, off, n, cuts in rows]
    order, start, calls = _fold_schedule(rows, per_row, folded)
    num_folded = sum(rows[r][0] in folded for r in order)  # folded rows are the first local rows
    local_of = {r: lane for lane, r in enumerate(order)}
    lane_of_row = {rows[r][0]: lane for lane, r in enumerate(order)}
    slot_of: dict[int, int] = {}        # packed token index -> slot in the [M * chunk] layout
    steps: list[tuple[int, int, int]] = []
    call_of: dict[tuple[int, int], int] = {}  # (row, its chunk) -> the scan call that runs it
    num_slots = 0
    for s, lo, n in calls:
        steps.append((num_slots // chunk, lo, n))
        for lane in range(lo, lo + n):
            r = order[lane]
            call_of[r, s - start[r]] = len(steps) - 1
            for j, tok in enumerate(per_row[r][0][s - start[r]]):
                if tok >= 0:
                    slot_of[tok] = num_slots + j
            num_slots += chunk
    captures: dict[int, list[tuple[int, int]]] = {}
    handed: dict[int, list[tuple[int, int]]] = {}
    folds: dict[int, list[tuple[int, int]]] = {}
    for r, local in local_of.items():
        for c, slot in per_row[r][1]:
            captures.setdefault(call_of[r, c], []).append((local, slot))
        for c, dep in per_row[r][2]:
            if dep in folded:
                folds.setdefault(call_of[r, c], []).append((local, lane_of_row[dep]))
            else:
                handed.setdefault(call_of[r, c], []).append((local, dep))

    def t(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    tokens = sorted(slot_of)
    base = max((len(per_row[r][0]) for r in range(len(rows)) if rows[r][0] not in folded), default=0)
    return ChunkPlan([rows[r][0] for r in order], chunk, num_slots, t(tokens), t([slot_of[k] for k in tokens]),
                     steps, _pairs(captures, t), _pairs(handed, t), _pairs(folds, t),
                     all_tokens=len(tokens) == num_tokens, base_calls=base,
                     fold_only=frozenset(k for k, (_, lo, n) in enumerate(calls) if lo + n <= num_folded))


def _fold_schedule(rows: list[tuple[int, int, int, list[tuple[int, int]]]],
                   per_row: list[tuple[list[list[int]], list[tuple[int, int]], list[tuple[int, int]]]],
                   folded: dict[int, int]) -> tuple[list[int], list[int], list[tuple[int, int, int]]]:
    """Local row order, first scan step of each row, and the scan calls (step, first local row, count).

    Rows without a producer in the plan start at step 0 and are ordered longest first (without folded
    rows: today's plan exactly, one call per step over a prefix). A folded row starts at the step after
    its producer's call that reaches its start; folded rows come first in the order, earliest start
    (then latest end) next to the other rows, so the active folded rows at a step are usually a run
    that joins the active prefix of the others. Active rows that are not contiguous are split."""
    pos = {row[0]: r for r, row in enumerate(rows)}
    start = [0] * len(rows)
    for r in sorted(range(len(rows)), key=lambda r: rows[r][0]):  # producers come before their dependents
        for c, dep in per_row[r][2]:
            if dep in folded and folded[dep] == rows[r][0]:
                start[pos[dep]] = start[r] + c + 1
    end = [start[r] + len(per_row[r][0]) for r in range(len(rows))]
    roots = sorted((r for r in range(len(rows)) if rows[r][0] not in folded), key=lambda r: -len(per_row[r][0]))
    deps = sorted((r for r in range(len(rows)) if rows[r][0] in folded), key=lambda r: (start[r], -end[r]))
    order = deps[::-1] + roots
    calls: list[tuple[int, int, int]] = []
    for s in range(max(end, default=0)):
        lo = None
        for lane, r in enumerate(order):
            if start[r] <= s < end[r]:
                if lo is None:
                    lo = lane
            elif lo is not None:
                calls.append((s, lo, lane - lo))
                lo = None
        if lo is not None:
            calls.append((s, lo, len(order) - lo))
    return order, start, calls


def _pairs(by_step: dict[int, list[tuple[int, int]]], t: Callable[[list[int]], torch.Tensor]
           ) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    return {s: (t([p[0] for p in v]), t([p[1] for p in v])) for s, v in by_step.items()}
