"""Packing a list of `RowInput`s into the index tensors one batched forward needs.

Everything here is computed once per forward and shared by all layers: token ids and positions of
the packed tokens, where each token's K/V goes in the paged cache, which cache slots each row's
attention reads, and the layouts the linear layers use (flat conv windows, flat scan chunks).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from .cache import RowInput
from .chunk_plan import ChunkPlan, build_chunk_plan


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
        if hybrid:
            _validate_states(i, r, n, num_slots)


def _validate_states(i: int, r: RowInput, n: int, num_slots: int) -> None:
    if r.state_in is None and r.start != 0:
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


class BatchContext:
    """Index tensors for one batched forward, built lazily and cached per chunk size / kernel."""

    def __init__(self, rows: list[RowInput], block_size: int, device: torch.device) -> None:
        self.rows, self.block_size, self.device = rows, block_size, device
        self.lengths = [len(r.token_ids) for r in rows]
        self.offsets = [0]
        for n in self.lengths:
            self.offsets.append(self.offsets[-1] + n)
        self.num_tokens = self.offsets[-1]
        self.extras: dict[str, object] = {}
        self._chunk_plans: dict[int, ChunkPlan] = {}
        self._conv_plans: dict[int, ConvPlan] = {}

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

    # ---- linear layers ---------------------------------------------------------------------
    @cached_property
    def state_in_index(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(slot per row, 0 where none; bool mask of rows starting from the zero state)."""
        slots = [r.state_in if r.state_in is not None else 0 for r in self.rows]
        zero = [r.state_in is None for r in self.rows]
        return self._t(slots), torch.tensor(zero, dtype=torch.bool, device=self.device)

    @cached_property
    def decode_rows(self) -> list[int]:
        return [i for i, n in enumerate(self.lengths) if n == 1]

    @cached_property
    def prefill_rows(self) -> list[int]:
        return [i for i, n in enumerate(self.lengths) if n > 1]

    @cached_property
    def decode_row_index(self) -> torch.Tensor:
        return self._t(self.decode_rows)

    @cached_property
    def decode_token_index(self) -> torch.Tensor:
        return self._t([self.offsets[i] for i in self.decode_rows])

    @cached_property
    def decode_captures(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(local decode-row index, slot) of every state_out of the 1-token rows."""
        pairs = [(d, slot) for d, i in enumerate(self.decode_rows) for _, slot in self.rows[i].state_out]
        return self._t([p[0] for p in pairs]), self._t([p[1] for p in pairs])

    def conv_plan(self, kernel: int) -> ConvPlan:
        if kernel not in self._conv_plans:
            self._conv_plans[kernel] = self._build_conv_plan(kernel - 1)
        return self._conv_plans[kernel]

    def _build_conv_plan(self, w: int) -> ConvPlan:
        state_pos, token_pos, cap_pos, cap_slots = [], [], [], []
        base = 0
        for r, n in zip(self.rows, self.lengths):
            state_pos.extend(range(base, base + w))
            token_pos.extend(range(base + w, base + w + n))
            for k, slot in r.state_out:
                # the last w inputs after k tokens sit at [base + k, base + k + w)
                cap_pos.append(list(range(base + k, base + k + w)))
                cap_slots.append(slot)
            base += w + n
        cap = self._t(cap_pos).view(len(cap_slots), w)
        return ConvPlan(w, self._t(state_pos), self._t(token_pos), base, cap, self._t(cap_slots))

    def chunk_plan(self, chunk: int) -> ChunkPlan:
        if chunk not in self._chunk_plans:
            self._chunk_plans[chunk] = self._build_chunk_plan(chunk)
        return self._chunk_plans[chunk]

    def _build_chunk_plan(self, chunk: int) -> ChunkPlan:
        rows = [(i, self.offsets[i], self.lengths[i], self.rows[i].state_out) for i in self.prefill_rows]
        return build_chunk_plan(rows, chunk, self.num_tokens, self.device)
