"""Fixed-size pools of integer ids (KV pages, state-snapshot slots), optionally drawing on one shared
byte budget: vLLM's hybrid allocator gives KV blocks and Mamba state blocks one pool of memory, so
a page and a slot compete for the same bytes."""

from __future__ import annotations


class ByteBudget:
    def __init__(self, total: int) -> None:
        if total <= 0:
            raise ValueError(f"cache memory must be > 0 bytes, got {total}")
        self.total = total
        self.used = 0

    @property
    def free(self) -> int:
        return self.total - self.used


class IdPool:
    """A free list over ids 0..capacity-1; the owner of an allocated id is tracked elsewhere.

    Ids come out in ascending runs: a fresh pool hands out 0, 1, 2, ... (one `allocate(n)` as well as n
    `allocate_one`s), and ids freed together come back in the order they were freed. A prompt's KV pages
    are then consecutive in the pool, so attention reads its context through a view of the pool, not a
    gather per token (models/batch.py `context_runs`; descending ids made every page a run of its own)."""

    def __init__(self, capacity: int, name: str, unit_bytes: int = 0, budget: ByteBudget | None = None) -> None:
        if capacity < 0:
            raise ValueError(f"{name} pool capacity must be >= 0, got {capacity}")
        self.name = name
        self.unit_bytes = unit_bytes
        self.budget = budget
        self.capacity = capacity
        self._free = list(range(capacity - 1, -1, -1))
        self._used: set[int] = set()  # allocated ids (a set: allocate marks a run of ids at C speed)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.capacity - len(self._free)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free) and (self.budget is None or n * self.unit_bytes <= self.budget.free)

    def allocate(self, n: int) -> list[int]:
        if not self.can_allocate(n):
            raise MemoryError(f"{self.name} pool: asked for {n}, {len(self._free)} free"
                              + (f", {self.budget.free} bytes left" if self.budget else ""))
        if n == 0:
            return []
        if self.budget is not None:
            self.budget.used += n * self.unit_bytes
        ids = self._free[-n:]
        ids.reverse()                       # the free list's tail holds the lowest ids, last first
        del self._free[-n:]
        self._used.update(ids)
        return ids

    def allocate_one(self) -> int:
        if not self._free or self.budget is not None:
            return self.allocate(1)[0]
        i = self._free.pop()
        self._used.add(i)
        return i

    def free(self, ids) -> None:
        used = self._used
        for i in reversed(ids if isinstance(ids, (list, tuple)) else list(ids)):   # come back in this order
            if i not in used:
                raise AssertionError(f"{self.name} pool: double free of {i} (or never allocated)")
            used.discard(i)
            self._free.append(i)
            if self.budget is not None:
                self.budget.used -= self.unit_bytes

    def free_ids(self) -> set[int]:
        return set(self._free)
