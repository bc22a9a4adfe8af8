"""Fixed-size pools of integer ids: KV pages and state-snapshot slots."""

from __future__ import annotations


class IdPool:
    """A free list over ids 0..capacity-1; the owner of an allocated id is tracked elsewhere."""

    def __init__(self, capacity: int, name: str) -> None:
        if capacity < 0:
            raise ValueError(f"{name} pool capacity must be >= 0, got {capacity}")
        self.name = name
        self.capacity = capacity
        self._free = list(range(capacity - 1, -1, -1))
        self._is_free = bytearray(b"\x01") * capacity

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.capacity - len(self._free)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise MemoryError(f"{self.name} pool: asked for {n}, {len(self._free)} free")
        if n == 0:
            return []
        ids = self._free[-n:]
        del self._free[-n:]
        for i in ids:
            self._is_free[i] = 0
        return ids

    def allocate_one(self) -> int:
        return self.allocate(1)[0]

    def free(self, ids) -> None:
        for i in ids:
            if self._is_free[i]:
                raise AssertionError(f"{self.name} pool: double free of {i}")
            self._is_free[i] = 1
            self._free.append(i)

    def free_ids(self) -> set[int]:
        return set(self._free)
