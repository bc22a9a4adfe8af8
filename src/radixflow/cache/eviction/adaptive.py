"""`adaptive`: lru, or the tail rule over the coldest share of the idle histories, chosen per evict
call by the duel of shadow caches (`duel.py`), on our own `RadixIndex` (SGLang's `radixflow-adaptive`
runs the same duel in integrations/sglang/adaptive.py).

The duel learns from the requests: the scheduler tells the index when a request takes its hit
(`RadixIndex.request_begins`) and when it ends with its sequence inserted (`request_ends`); the
index passes both on to a policy that `observes`. An evict call the duel answers with lru is
`LRU`'s, victim for victim; a tail call cuts the cold share's deepest leaves down to one level
(`duel.cold_level_walk`). Snapshots are dropped as lru drops them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixflow.cache.eviction.duel import DuelRule, Evidence, cold_level_walk
from radixflow.cache.eviction.lru import LRU
from radixflow.cache.eviction.view import IndexInternals, IndexView, drive


@dataclass
class Adaptive:
    """The duel's choice per evict call: `LRU`'s walk, or the tail rule at a cold share."""

    rule: DuelRule = field(default_factory=DuelRule)
    name: str = "adaptive"
    observes = True  # the index passes on the requests' hits and ends (`begin`, `end`)
    SHARED_EVERY = 32  # requests between two measures of the shared prefix tokens

    def __post_init__(self) -> None:
        self.lru = LRU()
        self.evidence = Evidence(self.rule)
        self.lru_calls = self.tail_calls = 0
        self._ends = 0
        self._shared = 0

    def evict_pages(self, index: IndexInternals, need: int) -> int:
        q = self.rule.decide()
        if q is None:
            self.lru_calls += 1
            return self.lru.evict_pages(index, need)
        self.tail_calls += 1
        view = IndexView(index)
        bs = index.block_size  # the walk counts tokens, the index pages
        return drive(cold_level_walk(view, need * bs, q), lambda victim: view.remove(victim) * bs) // bs

    def evict_snapshots(self, index: IndexInternals, need: int) -> int:
        return self.lru.evict_snapshots(index, need)

    # ------------------------------------------------------------------ evidence
    def begin(self, index: IndexInternals, namespace: str, tokens, depth: int, node) -> None:
        """A request takes its hit; its tokens matched `depth` tokens of the tree, the last page in
        `node` (None: nothing matched)."""
        view = IndexView(index)
        if node is not None and view.depth(node) != depth:
            node = None  # the match ends inside `node`: the request branches off there
        self.evidence.begin(self.evidence.match_key(view, namespace, tokens, node, depth))

    def end(self, index: IndexInternals, node, hit: int) -> None:
        """A request ended: its sequence is in the tree down to `node`; the cache gave it `hit` tokens."""
        if node is None:
            return
        if self._ends % self.SHARED_EVERY == 0:
            self._shared = shared_tokens(index)
        self._ends += 1
        bs = index.block_size
        budget = max(0, (index.pages.num_free + index.num_cached_pages) * bs - self._shared)
        self.evidence.inserted(IndexView(index), node, hit, budget)


def shared_tokens(index: IndexInternals) -> int:
    """Tree tokens on no leaf's unshared chain: the shared prefixes."""
    private = 0
    for leaf in index._leaves:
        n = leaf
        while not n.is_root:
            private += len(n.key)
            up = n.parent
            if up.is_root or len(up.children) != 1:
                break
            n = up
    return max(0, index.num_cached_pages * index.block_size - private)
