"""Large CPU temporaries reused from the heap instead of mapped afresh for every use (glibc malloc).

A forward over a round (~8k tokens) allocates and frees hundreds of temporaries of 30-200 MB (the
projections' outputs, the conv's flat layout, the scans' chunk tensors). glibc serves every block
above its mmap threshold (at most 32 MB, however it adapts) with a fresh `mmap` and unmaps it on free,
so each use faults its pages in again, one 4 KB page at a time, zeroed by the kernel. On the shared
2-core VM of docs/engine_speed.md a fault costs ~30 us: one Qwen3.5 GDN layer over 6.6k tokens took
~500k faults and 41-53 s with glibc's defaults, 0-50k faults and 17-25 s with the settings below.

`keep_freed_blocks()` raises the mmap threshold to 1 GB, so these blocks come from the heap and a freed
one is reused by the next, and the trim threshold to 2 GB, so the heap's free top is not returned to
the system after every forward. The process keeps up to that much freed memory, as a caching allocator
would. Set RADIXFLOW_MALLOC=default to leave glibc's settings alone; a no-op off glibc.
"""

from __future__ import annotations

import ctypes
import os
import platform

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3      # glibc's malloc.h
MMAP_THRESHOLD = 1 << 30
TRIM_THRESHOLD = (1 << 31) - 1                    # mallopt takes an int
_applied: bool | None = None


def keep_freed_blocks() -> bool:
    """Apply the settings once per process; True when they are in force."""
    global _applied
    if _applied is None:
        _applied = _apply()
    return _applied


def _apply() -> bool:
    if os.environ.get("RADIXFLOW_MALLOC", "").strip().lower() == "default":
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
