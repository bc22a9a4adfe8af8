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

`glibc_defaults()` lifts the setting for a stretch of code that allocates differently (another
system's forward in the same process, e.g. benchmarks/engine_peers.py's transformers and llama.cpp):
blocks above glibc's largest adaptive mmap threshold (32 MB) are mapped and unmapped again, as in a
process that never applied the setting, and on exit the freed heap is returned (`malloc_trim`) before
the setting is put back. A 16-row transformers decode cache (7.5 GB, per-layer `cat`s a few KB larger
than the blocks they free) grows a kept heap by a cache's size a step; mapped, it does not.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3      # glibc's malloc.h
DEFAULT_MMAP_MAX = 32 << 20                        # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
MMAP_THRESHOLD = 1 << 30
TRIM_THRESHOLD = (1 << 31) - 1                    # mallopt takes an int
_applied: bool | None = None


def keep_freed_blocks() -> bool:
    """Apply the settings once per process; True when they are in force."""
    global _applied
    if _applied is None:
        _applied = _apply()
    return _applied


@contextlib.contextmanager
def glibc_defaults():
    """Within: glibc's own large-block behaviour (blocks > 32 MB mapped, a freed heap top over 64 MB
    returned); on exit the freed heap is trimmed and the setting, if it was in force, restored."""
    libc = _libc()
    if libc is None:
        yield
        return
    if _applied:
        _set(libc, DEFAULT_MMAP_MAX, 2 * DEFAULT_MMAP_MAX)
    try:
        yield
    finally:
        libc.malloc_trim(0)
        if _applied:
            _set(libc, MMAP_THRESHOLD, TRIM_THRESHOLD)


def release_freed() -> None:
    """Return the heap's free pages to the system (`malloc_trim(0)`); a no-op off glibc."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def _libc():
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


def _set(libc, mmap_threshold: int, trim_threshold: int) -> bool:
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(libc.mallopt(_M_TRIM_THRESHOLD,
                                                                                       trim_threshold))


def _apply() -> bool:
    if os.environ.get("RADIXFLOW_MALLOC", "").strip().lower() == "default":
        return False
    libc = _libc()
    return libc is not None and _set(libc, MMAP_THRESHOLD, TRIM_THRESHOLD)
