"""Sizing the KV page pool and the state slot pool from a memory budget."""

from __future__ import annotations

import os

import torch

_BOOKKEEPING_PAGES = 1 << 20  # cap on the byte-free pages of an attention-free model


def default_budget(device: torch.device, fraction: float) -> int:
    """`fraction` of free GPU memory, or of host memory on CPU."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * fraction)
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(pages * fraction)


def pool_sizes(budget: int, kv_bytes_per_token: int, state_bytes: int, block_size: int, max_model_len: int,
               max_num_seqs: int, hybrid: bool, state_fraction: float = 0.3) -> tuple[int, int]:
    """(pages, slots) for `budget` bytes; refuses a budget too small for one maximal branch."""
    if budget <= 0:
        raise ValueError(f"KV cache memory must be > 0 bytes, got {budget}")
    page_bytes = kv_bytes_per_token * block_size
    need_pages = -(-max_model_len // block_size)
    if page_bytes == 0:
        # no attention layer: pages hold no bytes, they only index positions in the prefix tree, so
        # the whole budget goes to slots and every slot's branch may reach max_model_len
        slots = budget // state_bytes if hybrid else 0
        pages = min(need_pages * max(slots, max_num_seqs), max(_BOOKKEEPING_PAGES, need_pages * max_num_seqs))
    elif not hybrid:
        pages, slots = budget // page_bytes, 0
    else:
        slots = int(budget * state_fraction) // state_bytes
        pages = (budget - slots * state_bytes) // page_bytes
    need_slots = 2 if hybrid else 0  # a running state and one capture
    if pages < need_pages or slots < need_slots:
        need = need_pages * page_bytes + need_slots * state_bytes
        raise ValueError(f"KV cache memory of {budget / 2**20:.1f} MiB holds {pages} pages and {slots} state "
                         f"slots; one branch of --max-model-len {max_model_len} needs {need_pages} pages"
                         f"{' and 2 slots' if hybrid else ''} (~{need / 2**20:.1f} MiB): raise "
                         f"--kv-cache-memory or lower --max-model-len")
    return int(pages), int(slots)
