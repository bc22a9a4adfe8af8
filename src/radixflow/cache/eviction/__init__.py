"""Eviction policies of the prefix index, chosen by name (`--eviction lru|rr-tail|level-tail|flop-aware`).

A policy frees memory from the two pools of the hybrid cache: KV pages (`evict_pages`) and state
snapshot slots (`evict_snapshots`). It only ever removes tails: an unlocked leaf, or the last pages
of one, so the tree stays prefix-closed and nothing a running branch holds is touched.

One room per concept (docs/eviction.md):
- `view.py`: what a walk reads of a tree (`TreeView`; `IndexView` over our `RadixIndex`), the cut
  (`cut_to`), the trajectory key, and `drive`, which runs a walk.
- `lru.py`: `lru`, node-level LRU; a hit refreshes the whole matched path (`RadixIndex.touch`).
- `tails.py`: `rr-tail` (one tail chunk from each idle trajectory in turn) and `level-tail` (each
  chunk from the deepest idle trajectory: water-filling); on a hybrid cache a cut ends on a state.
- `kept.py`: the orders those keep across calls where the view reports what changed (SGLang's).
- `flops.py`: `flop-aware[:W]`, prefill FLOPs saved per byte blended with recency (Marconi's idea).
- `duel.py`: the duel of shadow caches behind SGLang's `radixflow-adaptive`.
- `registry.py`: the policies by name.

The policies are the index's friends: they use its private helpers (`_remove_leaf`, `_split`, ...),
which keep the hash dict, the leaf set and the snapshot set consistent. The index passes itself in;
`IndexInternals` names all a policy may touch, so this package needs nothing from `cache.radix`.
"""

from radixflow.cache.eviction.duel import DuelRule, FixedRule, Shadow, cut_target, water_level
from radixflow.cache.eviction.flops import RANK_ARRAYS_FROM, FlopAware, ReuseCosts
from radixflow.cache.eviction.kept import DeepestFirst, Rotation
from radixflow.cache.eviction.lru import LRU
from radixflow.cache.eviction.registry import EVICTION_POLICIES, get_eviction, parse_evictions
from radixflow.cache.eviction.tails import LevelTail, RoundRobinTail
from radixflow.cache.eviction.view import (
    EvictionPolicy,
    IndexInternals,
    IndexView,
    TreeView,
    Trim,
    cut_to,
    drive,
)

__all__ = ["EVICTION_POLICIES", "LRU", "RANK_ARRAYS_FROM", "DeepestFirst", "DuelRule", "EvictionPolicy",
           "FixedRule", "FlopAware", "IndexInternals", "IndexView", "LevelTail", "ReuseCosts", "Rotation",
           "RoundRobinTail", "Shadow", "TreeView", "Trim", "cut_target", "cut_to", "drive", "get_eviction",
           "parse_evictions", "water_level"]
