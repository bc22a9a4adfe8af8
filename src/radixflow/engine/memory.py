"""Sizing the KV page pool and the state slot pool from a memory budget.

The default budget (no `--kv-cache-memory`; docs/server.md "Defaults"): the KV pages get what they
always had, (1 - state share) of `memory_fraction` of the machine's memory (5% of RAM on CPU, of free
GPU memory on CUDA), and the state slots the larger of their share of it and `ROW_SLOTS` slots per row
of a round (`max_num_seqs`): a running slot and a capture for each row, and as many again for the
snapshots and checkpoints kept between rounds. The sum is capped at half of the memory available now
(after the weights are in); where the cap leaves fewer than 2 slots per row, a warning names the flag.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

ROW_SLOTS = 4  # state slots the default budget gives each row of a round

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


def available_memory(device: torch.device) -> int:
    """Bytes that can be taken now: free GPU memory, or the kernel's MemAvailable (physical RAM if
    /proc/meminfo cannot be read)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class PoolPlan:
    """The pools an engine builds: the budget and where it came from, pages and slots, their bytes."""

    budget: int
    source: str           # "--kv-cache-memory" or how the default was sized
    pages: int
    slots: int
    page_bytes: int
    slot_bytes: int
    warning: str | None   # fewer slots than every row of a round needs, and the flag that fixes it

    def describe(self) -> str:
        return (f"{self.pages} KV pages ({self.pages * self.page_bytes / 2**20:.0f} MiB), {self.slots} state slots "
                f"({self.slots * self.slot_bytes / 2**20:.0f} MiB, {self.slot_bytes / 2**20:.2f} MiB each) from "
                f"{self.budget / 2**20:.0f} MiB ({self.source})")


def default_split(device: torch.device, fraction: float, state_fraction: float, state_bytes: int,
                  max_num_seqs: int, hybrid: bool, available: int | None = None) -> tuple[int, float, str]:
    """(budget, state share, how it was sized) of the default rule (the module docstring)."""
    base = default_budget(device, fraction)
    if not hybrid or state_bytes == 0:
        return base, state_fraction, f"default: {fraction:.0%} of {'free GPU' if device.type == 'cuda' else 'RAM'}"
    kv = base * (1 - state_fraction)
    state = max(base * state_fraction, ROW_SLOTS * max_num_seqs * state_bytes)
    total = kv + state
    cap = (available_memory(device) if available is None else available) // 2
    how = (f"default: KV {kv / 2**20:.0f} MiB + state {state / 2**20:.0f} MiB, at least {ROW_SLOTS} slots per row of "
           f"--max-num-seqs")
    if total > cap:
        how += f", capped at half the available memory ({cap / 2**20:.0f} MiB)"
        total = cap
    # half a slot over the state's share: the slot count pool_sizes floors is the one sized here
    return int(total), min(1.0, (state + state_bytes / 2) / (kv + state)), how


def plan_pools(config, device: torch.device, kv_bytes_per_token: int, state_bytes: int, hybrid: bool,
               available: int | None = None) -> PoolPlan:
    """The pools of an EngineConfig (`kv_cache_memory`, `memory_fraction`, `state_memory_fraction`,
    the scheduler's block size and max_num_seqs, `max_model_len`); ValueError where the budget is too
    small for one branch (naming the flags)."""
    sc = config.scheduler
    if config.kv_cache_memory:
        budget, share, source = config.kv_cache_memory, config.state_memory_fraction, "--kv-cache-memory"
    else:
        budget, share, source = default_split(device, config.memory_fraction, config.state_memory_fraction,
                                              state_bytes, sc.max_num_seqs, hybrid, available)
    pages, slots = pool_sizes(budget, kv_bytes_per_token, state_bytes, sc.block_size, config.max_model_len,
                              sc.max_num_seqs, hybrid, share)
    warning = None
    if hybrid and slots < 2 * sc.max_num_seqs:  # a row runs on a slot and captures into another
        per_row = 2 * state_bytes / max(share, 1e-9)
        warning = (f"KV cache memory of {budget / 2**20:.0f} MiB ({source}) holds {slots} state slots of "
                   f"{state_bytes / 2**20:.1f} MiB: about {max(1, slots // 2)} of --max-num-seqs "
                   f"{sc.max_num_seqs} rows can run in a round; --kv-cache-memory "
                   f"{-(-per_row * sc.max_num_seqs // 2**20):.0f}MiB or more lets all of them run"
                   + ("" if config.kv_cache_memory else ", or lower --max-num-seqs"))
    return PoolPlan(budget, source, pages, slots, kv_bytes_per_token * sc.block_size, state_bytes, warning)
