"""Test factories shared across test folders (imported as `factories`; tests/ is on sys.path)."""

from __future__ import annotations

import random

from radixflow.config import SchedulerConfig
from radixflow.core.branch import Branch
from radixflow.workloads.trace import Segment, tokens_of


def make_branches(n_groups: int, doc_len: int, branches_per_group: int = 4, tail: int = 20,
                  same_doc: bool = False, arrival_gap: float = 0.0, seed: int = 0) -> list[Branch]:
    """Groups of branches sharing a document prefix (multi-candidate shape)."""
    rng = random.Random(seed)
    out = []
    t = 0.0
    for g in range(n_groups):
        doc = Segment("doc0" if same_doc else f"doc{g}", doc_len)
        for i in range(branches_per_group):
            toks = tokens_of([doc, Segment(f"g{g}:tail{i}", tail + rng.randint(0, 10))])
            out.append(Branch(f"r{g}", i, toks, namespace="ns", arrival=t))
        t += arrival_gap
    return out


def small_config(**kw) -> SchedulerConfig:
    base = dict(max_num_seqs=4, max_num_batched_tokens=256, block_size=4, state_interval=16,
                num_kv_pages=4096, num_state_slots=512)
    base.update(kw)
    return SchedulerConfig(**base)


def wait_config(**kw) -> SchedulerConfig:
    """small_config on the wait path: `--handoff off`, so a consumer whose state its same-round producer
    writes is Blocked a round (SPEC §3, §12) instead of handed off (SPEC §15, the default `auto`)."""
    return small_config(**{"handoff": "off", **kw})


class KeptOrderView:
    """What the kept orders (`Rotation`, `DeepestFirst`) read of a view: leaves are ints with a key, a
    depth and a leaf order (the int until a cut in place renews it, as the backends do); the leaves a
    lap changed come back from `changes()`."""

    def __init__(self, keys: dict, depths: dict | None = None) -> None:
        self.keys, self.depths, self.orders, self.changed = keys, depths or {}, {}, []

    def is_leaf(self, leaf) -> bool:
        return leaf in self.keys

    def evictable(self, leaf) -> bool:
        return True

    def evictable_leaf(self, leaf) -> bool:
        return leaf in self.keys

    def trajectory_key(self, leaf):
        return self.keys[leaf]

    def leaf_order(self, leaf) -> int:
        return self.orders.get(leaf, leaf)

    def depth(self, leaf) -> int:
        return self.depths[leaf]

    def changes(self) -> list:
        out, self.changed = self.changed, []
        return out
