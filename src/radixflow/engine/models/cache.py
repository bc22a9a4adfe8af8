"""The engine's side of the hybrid prefix cache: row descriptions and the tensors they point into.

`RowInput` is what the engine hands a model for one row of a round; `ModelCache` owns the paged KV
tensors of the full-attention layers and the pooled state slots (`conv` window + recurrent `rec`)
of the linear layers (Gated DeltaNet or Mamba-2). Which page or slot belongs to whom is decided
elsewhere (the prefix index); this module only stores and copies.
"""

from __future__ import annotations

import mmap
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from .host_memory import keep_freed_blocks


@dataclass
class RowInput:
    """One row of a batched forward (see the engine contract in docs/models.md)."""

    token_ids: list[int]
    start: int
    page_table: list[int]
    state_in: int | None = None
    state_out: list[tuple[int, int]] = field(default_factory=list)
    logits_at: list[int] = field(default_factory=list)
    # SPEC §15: index of an earlier row of the same call whose state at `start` this row starts from
    # (its producer); `state_in` is then None (docs/models.md, "Dependent rows")
    after: int | None = None


@dataclass(frozen=True)
class StateShape:
    """Shapes of one linear layer's per-slot state: causal-conv window and recurrent state."""

    conv: tuple[int, ...]
    rec: tuple[int, ...]


@dataclass(frozen=True)
class CacheLayout:
    """What a model needs stored: one KV head layout per attention layer, one state per linear layer."""

    num_kv_layers: int
    num_kv_heads: int
    head_dim: int
    states: tuple[StateShape, ...]


class ModelCache:
    """Paged KV for full-attention layers and slot-pooled states for linear layers.

    k[i], v[i]: `[num_pages, block_size, n_kv_heads, head_dim]` for the i-th attention layer.
    conv[j]: `[num_slots, *conv_shape]`, rec[j]: `[num_slots, *rec_shape]` for the j-th linear layer.
    The recurrent state is kept in fp32 whatever `dtype` is: it accumulates over thousands of
    tokens and bf16 drift would make a resumed prompt differ from an uninterrupted one.
    """

    def __init__(self, layout: CacheLayout, num_pages: int, block_size: int, num_state_slots: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> None:
        if num_pages < 1 or block_size < 1:
            raise ValueError(f"num_pages ({num_pages}) and block_size ({block_size}) must be >= 1")
        if layout.states and num_state_slots < 1:
            raise ValueError("a hybrid model needs num_state_slots >= 1")
        self.layout = layout
        if torch.device(device).type == "cpu":  # forwards over this cache reuse their large temporaries
            keep_freed_blocks()
        self.num_pages, self.block_size = num_pages, block_size
        self.num_state_slots = num_state_slots if layout.states else 0
        self.device, self.dtype = torch.device(device), dtype
        kv_shape = (num_pages, block_size, layout.num_kv_heads, layout.head_dim)
        self.k = [_zeros(kv_shape, device, dtype) for _ in range(layout.num_kv_layers)]
        self.v = [_zeros(kv_shape, device, dtype) for _ in range(layout.num_kv_layers)]
        n = self.num_state_slots
        self.conv = [_zeros((n, *s.conv), device, dtype) for s in layout.states]
        self.rec = [_zeros((n, *s.rec), device, torch.float32) for s in layout.states]

    def touch(self) -> None:
        """Write every pool page once (zeros over zeros), so no round pays for faulting its pages in.

        The pools are fresh anonymous mappings (`_zeros`): the kernel maps a page on its first write,
        zeroed. A round that first writes a state slot (19 MiB at qwen3.5-0.8b) or a KV page faults it
        in inside the forward, on both torch threads at once: measured on a scoring round of qwen3.5-0.8b
        that wrote 6 new slots, the step took 762 ms against 528 ms with the pools touched before (the
        touch itself: ~2 s for 2 GB on a quiet 2-core machine, once, at start-up)."""
        if self.device.type == "cpu":
            for pool in (*self.k, *self.v, *self.conv, *self.rec):
                pool.zero_()

    def copy_state(self, src_slot: int, dst_slot: int) -> None:
        """Copy every linear layer's (conv, rec) state from one slot to another."""
        self._check_slot(src_slot)
        self._check_slot(dst_slot)
        for pool in (*self.conv, *self.rec):
            pool[dst_slot].copy_(pool[src_slot])

    def copy_page(self, src_page: int, dst_page: int) -> None:
        """Copy one KV page (all attention layers)."""
        for p in (src_page, dst_page):
            if not 0 <= p < self.num_pages:
                raise IndexError(f"page {p} out of range [0, {self.num_pages})")
        for pool in (*self.k, *self.v):
            pool[dst_page].copy_(pool[src_page])

    @property
    def kv_bytes_per_token(self) -> int:
        per_layer = 2 * self.layout.num_kv_heads * self.layout.head_dim * _itemsize(self.dtype)
        return per_layer * self.layout.num_kv_layers

    @property
    def state_bytes_per_slot(self) -> int:
        conv = sum(_numel(s.conv) for s in self.layout.states) * _itemsize(self.dtype)
        rec = sum(_numel(s.rec) for s in self.layout.states) * _itemsize(torch.float32)
        return conv + rec

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.num_state_slots:
            raise IndexError(f"state slot {slot} out of range [0, {self.num_state_slots})")


def _zeros(shape: tuple[int, ...], device: torch.device | str, dtype: torch.dtype) -> torch.Tensor:
    """Zeros; on CPU an anonymous private mapping of its own, whose pages the kernel maps, zeroed, on
    first touch: nothing is written at allocation, and `ModelCache.touch` faults them in at 3-4 GB/s.
    (calloc served these pools from the heap once `keep_freed_blocks` raised the mmap threshold:
    first touches there ran at ~1.3 GB/s, 1.6 s against 0.5 s for 2 GB on the same machine.)"""
    nbytes = _numel(shape) * _itemsize(dtype)
    if torch.device(device).type != "cpu" or nbytes == 0:
        return torch.zeros(shape, device=device, dtype=dtype)
    try:
        buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (AttributeError, OSError):   # no anonymous mappings here: calloc's lazy zero pages
        buf = np.zeros(nbytes, dtype=np.uint8)
    with warnings.catch_warnings():     # frombuffer keeps `buf` alive for as long as the tensor lives
        warnings.simplefilter("ignore")
        return torch.frombuffer(buf, dtype=torch.uint8).view(dtype).view(shape)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
