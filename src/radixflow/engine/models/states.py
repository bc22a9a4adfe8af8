"""Reading a linear layer's initial states for every row, before any row's states are written.

Copy-on-write for snapshots: the initial states of all rows are gathered into fresh tensors first,
so a slot that one row reads as `state_in` and another row lists in `state_out` is read unchanged.
"""

from __future__ import annotations

import torch

from .batch import BatchContext


def initial_states(pool: torch.Tensor, batch: BatchContext) -> torch.Tensor:
    """[R, ...] copy of each row's `state_in` slot from `pool` (zeros for rows with no state_in)."""
    slots, zero = batch.state_in_index
    out = pool.index_select(0, slots)
    if any(r.state_in is None for r in batch.rows):  # decided on the host: no device sync
        out[zero] = 0
    return out


def save_states(pool: torch.Tensor, slots: torch.Tensor, states: torch.Tensor) -> None:
    """Write states [C, ...] into `pool` at `slots` [C]."""
    if slots.numel():
        pool.index_copy_(0, slots, states.to(pool.dtype))
