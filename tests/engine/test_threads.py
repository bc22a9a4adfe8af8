"""The scan's thread count chosen by timing (engine/models/threads.py): with an injected clock the faster
count is picked, re-checked every `recheck` calls, and torch's count is restored after every call."""

from __future__ import annotations

import contextlib

import pytest
import torch

from radixflow.engine.models import threads
from radixflow.engine.models.threads import ScanThreads, configure, shape_class


class FakeClock:
    """Seconds advance only inside the scan: `cost[threads]` per call at the thread count it runs with."""

    def __init__(self, cost: dict[int, float]):
        self.now = 0.0
        self.cost = cost
        self.seen: list[int] = []

    def __call__(self) -> float:
        return self.now

    def scan(self) -> int:
        n = torch.get_num_threads()
        self.seen.append(n)
        self.now += self.cost[n]
        return n


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_picks_the_faster_and_restores(two_threads):
    clock = FakeClock({1: 1.0, 2: 3.0})
    st = ScanThreads(candidates=(1, 2), recheck=8, clock=clock)
    for _ in range(6):
        st.run("k", clock.scan)
        assert torch.get_num_threads() == 2
    # warm-up at the caller's count, one trial each, then the faster (1 thread)
    assert clock.seen == [2, 1, 2, 1, 1, 1]
    assert st.choice("k") == 1


def test_prefers_all_threads_when_faster(two_threads):
    clock = FakeClock({1: 2.0, 2: 1.0})
    st = ScanThreads(candidates=(1, 2), clock=clock)
    for _ in range(5):
        st.run("k", clock.scan)
    assert clock.seen[3:] == [2, 2]
    assert st.choice("k") == 2


def test_rechecks_every_nth_call_and_follows_a_change(two_threads):
    clock = FakeClock({1: 1.0, 2: 3.0})
    st = ScanThreads(candidates=(1, 2), recheck=8, clock=clock)
    for _ in range(7):
        st.run("k", clock.scan)
    assert clock.seen[3:] == [1, 1, 1, 1]
    clock.cost = {1: 5.0, 2: 3.0}        # the load moved: one thread is now the slower
    st.run("k", clock.scan)               # call 8: the other candidate re-timed (3.0)
    assert clock.seen[-1] == 2
    st.run("k", clock.scan)               # 1 thread still holds its old 1.0: runs, re-timed at 5.0
    assert clock.seen[-1] == 1
    st.run("k", clock.scan)
    assert clock.seen[-1] == 2 and st.choice("k") == 2


def test_classes_are_measured_apart(two_threads):
    clock = FakeClock({1: 1.0, 2: 3.0})
    st = ScanThreads(candidates=(1, 2), clock=clock)
    for _ in range(3):
        st.run("a", clock.scan)
    assert st.choice("a") == 1 and st.choice("b") is None
    assert shape_class("gdn", 4000, 16) == shape_class("gdn", 4096, 16) != shape_class("gdn", 4097, 16)


def test_restores_threads_when_the_scan_raises(two_threads):
    clock = FakeClock({1: 1.0, 2: 3.0})
    st = ScanThreads(fixed=1, clock=clock)

    def boom():
        assert torch.get_num_threads() == 1
        raise RuntimeError("scan failed")

    with pytest.raises(RuntimeError, match="scan failed"):
        st.run("k", boom)
    assert torch.get_num_threads() == 2


def test_configure_modes_and_bad_input():
    saved = threads.SCAN_THREADS
    try:
        assert configure("auto").fixed is None
        assert configure("1").fixed == 1 and configure(3).fixed == 3
        with pytest.raises(ValueError, match="'auto' or a count"):
            configure("fast")
        with pytest.raises(ValueError, match=">= 1"):
            configure(0)
    finally:
        threads.SCAN_THREADS = saved


def test_scan_results_identical_at_any_thread_count(two_threads):
    """The chosen count must not change a bit: one GDN and one SSD layer, 1 vs 2 threads."""
    from radixflow.engine.models import RowInput, build_model
    from radixflow.engine.tiny import TINY_CONFIGS, random_weights

    saved = threads.SCAN_THREADS
    try:
        for name in ("tiny-qwen3.5", "tiny-nemotron-h"):
            cfg = TINY_CONFIGS[name]
            model = build_model(cfg)
            model.load_state_dict(random_weights(cfg, 0), strict=False)
            gen = torch.Generator().manual_seed(1)
            lengths = (300, 70, 129)
            rows, page = [], 0
            for i, n in enumerate(lengths):
                ids = torch.randint(0, 256, (n,), generator=gen).tolist()
                pages = list(range(page, page + -(-n // 16)))
                page += len(pages)
                rows.append(RowInput(ids, 0, pages, None, [(n, i)], [n - 1]))
            outs = []
            for mode in ("1", "2", "auto", "auto", "auto", "auto"):
                if mode != "auto" or threads.SCAN_THREADS.fixed is not None:
                    configure(mode)
                cache = model.allocate_cache(page, 16, len(rows))
                outs.append(model(rows, cache))
            for o in outs[1:]:
                assert torch.equal(o, outs[0]), name
    finally:
        threads.SCAN_THREADS = saved


def test_host_memory_settings_apply_once_and_can_be_left_alone(monkeypatch):
    from radixflow.engine.models import host_memory

    monkeypatch.setattr(host_memory, "_applied", None)
    monkeypatch.setenv("RADIXFLOW_MALLOC", "default")
    assert host_memory.keep_freed_blocks() is False
    monkeypatch.setattr(host_memory, "_applied", None)
    monkeypatch.delenv("RADIXFLOW_MALLOC")
    import platform

    expected = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert host_memory.keep_freed_blocks() is expected
    assert host_memory.keep_freed_blocks() is expected   # once: the cached answer


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_glibc_defaults_returns_a_freed_large_block_and_restores_the_setting(monkeypatch):
    """Inside `glibc_defaults()` a freed 256 MB block goes back to the system (mapped, or trimmed on
    exit), where under the kept-heap setting it stays in the process; the setting is back afterwards."""
    import platform

    from radixflow.engine.models import host_memory

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        with host_memory.glibc_defaults():   # off glibc: a no-op that still runs its body
            pass
        return
    monkeypatch.delenv("RADIXFLOW_MALLOC", raising=False)
    monkeypatch.setattr(host_memory, "_applied", None)
    assert host_memory.keep_freed_blocks()
    n = 64 << 20   # 256 MB of float32, under the kept setting's 1 GB mmap threshold

    def grown(ctx) -> int:
        before = _rss_bytes()
        with ctx:
            x = torch.ones(n)
            del x
        return _rss_bytes() - before

    host_memory.release_freed()
    kept = grown(contextlib.nullcontext())
    host_memory.release_freed()
    lifted = grown(host_memory.glibc_defaults())
    assert kept > (n * 4) // 2, kept            # the heap kept the freed block
    assert lifted < (n * 4) // 8, lifted        # returned
    again = grown(contextlib.nullcontext())     # the setting is back: kept again
    host_memory.release_freed()
    assert again > (n * 4) // 2, again


def test_split_heads_covers_every_head_once_and_restores_the_count(two_threads):
    seen: list[tuple[int, int, int, bool]] = []

    def part(lo: int, hi: int) -> None:
        seen.append((lo, hi, torch.get_num_threads(), torch.is_inference_mode_enabled()))

    with torch.inference_mode():
        threads.split_heads(5, part)
    assert sorted((lo, hi) for lo, hi, _, _ in seen) == [(0, 2), (2, 5)]
    assert all(n == 1 and inf for _, _, n, inf in seen)   # one torch thread each, the caller's mode
    assert torch.get_num_threads() == 2
    seen.clear()
    threads.split_heads(1, part)                           # one head: run directly
    assert [(lo, hi) for lo, hi, _, _ in seen] == [(0, 1)] and seen[0][2] == 2
    assert threads.head_ranges(16, 3) == [(0, 5), (5, 10), (10, 16)]
    torch.set_num_threads(3)   # more threads than heads: two ranges, the caller's 3 put back
    try:
        seen.clear()
        threads.split_heads(2, part)
        assert sorted((lo, hi) for lo, hi, _, _ in seen) == [(0, 1), (1, 2)]
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(2)


def test_split_heads_raises_a_worker_error_after_every_part_ends(two_threads):
    done = []

    def part(lo: int, hi: int) -> None:
        if lo > 0:
            raise ValueError("bad head range")
        done.append(lo)

    with pytest.raises(ValueError, match="bad head range"):
        threads.split_heads(4, part)
    assert done == [0] and torch.get_num_threads() == 2


def test_scans_flush_denormals_on_every_thread_and_clear_it_after(two_threads):
    """Inside run_scan (and on each split worker) a float32 denormal product is flushed to zero; outside
    it is not: the flag never stays on for other code."""
    tiny = torch.tensor([1e-39])
    if not torch.set_flush_denormal(True):   # a CPU without FTZ/DAZ: the scans run as before
        return
    torch.set_flush_denormal(False)
    seen: list[float] = []

    def part(lo: int, hi: int) -> None:
        seen.append(float((tiny * 1.0)[0]))

    saved = threads.SCAN_THREADS
    try:
        configure("2")
        threads.run_scan(("t", 1, 1), lambda: threads.split_heads(2, part))
    finally:
        threads.SCAN_THREADS = saved
    assert seen == [0.0, 0.0]                       # caller's thread and the worker
    assert float((tiny * 1.0)[0]) > 0.0              # cleared after
    seen.clear()
    threads.split_heads(1, part)                     # outside a scan, one range: the caller's setting
    assert seen[0] > 0.0
