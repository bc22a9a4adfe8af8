"""The radixflow eviction walks as SGLang radix-cache backends (imports SGLang; see __init__.py).

SGLang's `UnifiedRadixCache` evicts FULL (device KV) through its FULL component: the cache calls
`evict_device_next_node` for one victim leaf at a time and deletes that leaf itself
(`evict_device_leaf`, which also frees the node's Mamba and SWA values and fixes the ledgers and leaf
sets). `RadixflowFullComponent` keeps all of SGLang's FULL component (locks, match, split, frees) and
replaces only that choice: it runs our policy's page walk (`cache/eviction.py`, the same generator
our own `RadixIndex` runs) over `SGLangTreeView`, a read-only view of SGLang's nodes. On a FULL-only
device tree the component removes the victims itself in one SGLang step per evict call: whole leaves
by SGLang's `_delete_unbacked_device_leaf` steps without its per-component dispatch (`_drop_leaf`),
the last one of a cut shortened in place (`_trim`: key and value cut, the suffix's slots freed, the
ledger moved), and rr-tail's and level-tail's calls (and the adaptive's tail calls) are batched
there (about `cuts_per_call` cuts freeing `cut_ahead_factor` times the demand). Elsewhere (Mamba,
SWA) a tail cut splits the leaf with SGLang's own `_split_node` (the node keeps the tail, which
becomes the victim) and SGLang deletes it.
rr-tail's rotation and level-tail's depth order are kept across calls (`cache/eviction.py`
`Rotation`, `DeepestFirst`), fed by `changes()` on every insert and at each call: nodes joining
SGLang's evictable leaf set (`_LeafSet`), leaves trimmed or given a child, trajectory keys forgotten.
flop-aware's order is kept the same way on FULL-only device trees (`GreedyDual`; `flop_order()`),
elsewhere it ranks every leaf per call (`cache/eviction.FlopAware`).

- Locks: a node with any component `lock_ref` (a running or in-flight request holds it) is not
  evictable in the view, and no cut passes it.
- Mamba (hybrid trees): a cut ends on the deepest node at or above `end - chunk` that still holds a
  Mamba state (`component_data[MAMBA].value`), or at the root; the state at a cut's end is never
  taken. SGLang's own Mamba walk (LRU over states, `mamba_num` requests) is left as it is.
- SWA: cuts split nodes with SGLang's split, which redistributes the SWA values and locks; the
  leaf's SWA window goes with it. Nothing here touches SWA values.
- Recency and leaf order, in our `RadixIndex`'s terms (flop-aware ranks recency; all three break
  ties by leaf order): SGLang's `last_access_time` is a counter that its match refreshes and its
  `_split_node` restamps on the suffix, so the component keeps its own, in the FULL component data's
  `metadata` (dies with the node): `rf_access`, stamped on the whole path when a request locks its
  hit (`acquire_component_lock`, our `lock(node, now)`) and when a sequence is inserted
  (`commit_insert_component_data`, our `insert` + `touch`), inherited by the prefix on a split (the
  suffix keeps its own, as `RadixIndex._split`); `rf_leaf`, the order nodes became leaves in (a new
  leaf at insert; a parent when its last child is deleted, `discard_deleted_session_leaf`), as our
  index's leaf dict. A match alone (a scheduler probing its queue, a test reading what is kept)
  refreshes nothing, as in our index.
"""

from __future__ import annotations

import bisect
import heapq
import os
import struct
from types import SimpleNamespace

import torch
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType, TreeComponent
from sglang.srt.mem_cache.unified_cache.components.full import FullComponent
from sglang.srt.mem_cache.unified_cache.unified_tree_core import get_and_increase_time_counter

from radixflow.cache.eviction import DeepestFirst, FlopAware, LevelTail, Rotation, RoundRobinTail, Trim

FULL, MAMBA = ComponentType.FULL, ComponentType.MAMBA
# The FULL ledger counts value lengths (no component of SGLang 0.5.23's FULL overrides it): a trim
# frees exactly the tokens it cuts.
_PLAIN_LEDGER = FullComponent.reclaimable_value_len is TreeComponent.reclaimable_value_len
ACCESS, LEAF = "rf_access", "rf_leaf"  # keys of the FULL component data's metadata (see above)
KEY_TOKENS = 8  # first tokens of a chain in its trajectory key (as cache/eviction._trajectory_key)
DEFAULT_CHUNK_TOKENS = 64  # rr-tail / level-tail chunk, in tokens (our simulator: 4 pages of 16)
DEFAULT_CUTS_PER_CALL = 2  # rr-tail / level-tail: an evict call's demand in at most about this many cuts
DEFAULT_CUT_AHEAD = 1.5  # rr-tail / level-tail: an evict call frees this multiple of its demand


def make_policy(kind: str, page_size: int):
    """A fresh policy for one cache. RADIXFLOW_SGLANG_CHUNK_TOKENS sets the tail chunk (tokens),
    RADIXFLOW_SGLANG_RECENCY_WEIGHT flop-aware's recency weight. `adaptive` has no walk of
    cache/eviction.py (its component, adaptive.DuelFullComponent, chooses): None."""
    if kind == "adaptive":
        return None
    if kind == "flop-aware":
        return FlopAware(recency_weight=float(os.environ.get("RADIXFLOW_SGLANG_RECENCY_WEIGHT", "0.5")))
    try:
        chunk = int(os.environ.get("RADIXFLOW_SGLANG_CHUNK_TOKENS", DEFAULT_CHUNK_TOKENS))
    except ValueError:
        raise ValueError("RADIXFLOW_SGLANG_CHUNK_TOKENS must be a number of tokens") from None
    pages = max(1, chunk // page_size)
    return (LevelTail if kind == "level-tail" else RoundRobinTail)(chunk_pages=pages)


def flop_order() -> str:
    """RADIXFLOW_SGLANG_FLOP_ORDER: `kept` (default; FULL-only device trees: flop-aware's order kept
    across calls as a GreedyDual heap, `GreedyDual`) or `ranked` (every leaf ranked per call, our
    `RadixIndex`'s walk, `cache/eviction.FlopAware`; Mamba and SWA trees always rank)."""
    raw = os.environ.get("RADIXFLOW_SGLANG_FLOP_ORDER", "kept")
    if raw not in ("kept", "ranked"):
        raise ValueError(f"RADIXFLOW_SGLANG_FLOP_ORDER must be kept or ranked, got {raw!r}")
    return raw


def cut_ahead_factor() -> float:
    """RADIXFLOW_SGLANG_CUT_AHEAD (default 1.5; 1: off): rr-tail / level-tail, and the adaptive's tail
    calls, free this multiple of what an evict call asks for, so fewer calls come (it moves cuts
    earlier; docs/eviction.md, "Cost")."""
    raw = os.environ.get("RADIXFLOW_SGLANG_CUT_AHEAD", str(DEFAULT_CUT_AHEAD))
    try:
        f = float(raw)
    except ValueError:
        f = 0.0
    if not f >= 1.0:
        raise ValueError(f"RADIXFLOW_SGLANG_CUT_AHEAD must be a factor >= 1, got {raw!r}")
    return f


def cuts_per_call() -> int:
    """RADIXFLOW_SGLANG_CUTS_PER_CALL (default 2; 0: off): rr-tail / level-tail cut an evict call's
    demand in chunks of max(chunk, demand / this), and the adaptive's tail calls cut each cold history
    at least demand / this down (`adaptive.cut_target`), so one call makes about this many cuts however
    much it asks for (docs/eviction.md, "Cost")."""
    raw = os.environ.get("RADIXFLOW_SGLANG_CUTS_PER_CALL", str(DEFAULT_CUTS_PER_CALL))
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"RADIXFLOW_SGLANG_CUTS_PER_CALL must be a count >= 0 (0: off), got {raw!r}")
    return n


class SGLangTreeView:
    """`cache/eviction.TreeView` over SGLang's `UnifiedTreeCore` (Python core). Built per eviction
    walk. Depths are memoised by node id (`depths`, kept by the component across walks): a node's end
    depth never changes while it lives (a split keeps it; ids are never reused)."""

    tails_empty: list = []

    def __init__(self, component: FullComponent, depths: dict | None = None, keys: dict | None = None,
                 values: dict | None = None) -> None:
        self.component = component
        self.core = component.tree_core
        self.unit = self.core.page_size
        self.hybrid = MAMBA in self.core.components_by_type
        core = self.core
        # In-place cuts on FULL-only device trees: no SWA / Mamba values to redistribute, no host copies,
        # no per-page hashes or KV events to keep, no T-LRU depths (see RadixflowFullComponent._trim).
        self.trims = (set(core.components_by_type) == {FULL} and not core.is_write_back
                      and not core.tlru_bookkeeping and not core.enable_storage
                      and not getattr(core.kv_events, "enabled", False))
        self._depth: dict[int, int] = {} if depths is None else depths
        self._keys: dict[int, tuple] = {} if keys is None else keys  # trajectory keys by leaf id
        # flop-aware's leaf values by node id, with the key object they were computed for (SGLang
        # replaces a node's key whenever its span changes: `_split_node`, our `_trim`).
        self.value_memo: dict[int, tuple] = {} if values is None else values

    # --------------------------------------------------------------- structure
    def leaves(self) -> list:
        # evictable_device_leaves: unlocked, FULL on device, no device child. A set, whose order differs
        # between processes; ties (flop-aware scores; equal trajectory keys, as when histories start
        # inside the same page of a shared prompt) follow the leaves' order, so give our index's: the
        # order the nodes became leaves in (`rf_leaf`; one never seen becoming one is placed now).
        component = self.component
        keyed = []
        for n in self.core.evictable_device_leaves:
            md = n.component_data[FULL].metadata
            seq = md.get(LEAF)
            if seq is None:
                seq = md[LEAF] = component.next_leaf_seq()
            keyed.append((seq, n))
        keyed.sort(key=_first)
        return [n for _, n in keyed]

    def unordered_leaves(self) -> tuple[list, list]:
        """`leaves()` unsorted, with each one's leaf order (flop-aware ranks by it, sorting once)."""
        component = self.component
        leaves = list(self.core.evictable_device_leaves)
        order = []
        for n in leaves:
            seq = n.component_data[FULL].metadata.get(LEAF)
            if seq is None:
                seq = n.component_data[FULL].metadata[LEAF] = component.next_leaf_seq()
            order.append(seq)
        return leaves, order

    def is_leaf(self, node) -> bool:
        return node.parent is not None and not node.children and node.id in self.core._node_arena

    def evictable(self, node) -> bool:
        if node is self.core.root_node or node.component_data[FULL].value is None:
            return False
        for cd in node.component_data:  # a loop, not any(): this runs for every leaf of every walk
            if cd.lock_ref > 0:
                return False
        return True

    @staticmethod
    def has_children(node) -> bool:
        return bool(node.children)

    @staticmethod
    def parent(node):
        return node.parent

    def is_root(self, node) -> bool:
        return node is self.core.root_node

    def depth(self, node) -> int:
        memo = self._depth
        d = memo.get(node.id)
        if d is not None:
            return d
        chain = []
        n = node
        while n is not self.core.root_node and n.id not in memo:
            chain.append(n)
            n = n.parent
        d = 0 if n is self.core.root_node else memo[n.id]
        for x in reversed(chain):
            d += len(x.key)
            memo[x.id] = d
        return d

    def start(self, node) -> int:
        return self.depth(node) - len(node.key)

    def has_state(self, node) -> bool:
        return node.component_data[MAMBA].value is not None

    def states(self, node) -> list:
        if not self.hybrid or not self.has_state(node):
            return []
        # The state came with the insert that stamped its node; the node's stamp never falls below it.
        return [SimpleNamespace(depth=self.depth(node), tail=(), last_access=self.last_access(node))]

    def num_pages(self, node) -> int:
        return len(node.key) // self.unit

    @staticmethod
    def last_access(node) -> float:
        return node.component_data[FULL].metadata.get(ACCESS, 0)

    def trajectory_key(self, leaf) -> bytes:
        """Where the leaf's unshared chain starts (as `cache/eviction._trajectory_key`), encoded so
        that bytes order is the tuple order (`encode_key`: the kept orders' heaps then compare keys
        in one memcmp, not tuple by tuple). Memoised by leaf id (`keys`, kept by the component across
        walks, which forgets a key when the chain can have changed: a child added or deleted above
        it, a split on it)."""
        key = self._keys.get(leaf.id)
        if key is None:
            key = self._keys[leaf.id] = self._trajectory_key(leaf)
        return key

    def _trajectory_key(self, leaf) -> bytes:
        root = self.core.root_node
        node, up = leaf, leaf.parent
        while up is not root and len(up.children) == 1:
            node, up = up, up.parent
        key = node.key
        extra = key.extra_key
        return encode_key("" if extra is None else str(extra), self.depth(up) if up is not root else 0,
                          key.token_ids[:KEY_TOKENS])

    def split(self, node, depth: int) -> None:
        keep_above = depth - self.start(node)
        _, action = self.core._split_node(node.key, node, keep_above)
        if action is not None:
            self.component.cache._apply_cache_action(action)

    def tails(self) -> list:
        return self.tails_empty

    def changes(self) -> list:
        """Leaves whose place in the kept orders may have moved since last asked (`cache/eviction.py`
        `Rotation`, `DeepestFirst`): nodes that joined SGLang's evictable leaf set (a new leaf, an
        unlocked one, a parent a deletion exposed), leaves cut in place, leaves whose trajectory key
        was forgotten. All evictable leaves the first time, and after SGLang replaced its set."""
        return self.component.drain_changes()

    def leaf_order(self, leaf) -> int:
        md = leaf.component_data[FULL].metadata
        seq = md.get(LEAF)
        if seq is None:
            seq = md[LEAF] = self.component.next_leaf_seq()
        return seq

    @staticmethod
    def has_tail(snap) -> bool:
        return False


_TOKEN_BIAS = 1 << 63  # token ids are int64: biased to unsigned, their order kept


def encode_key(extra: str, depth: int, tokens) -> bytes:
    """The trajectory key (extra key, branch depth, first tokens) as bytes whose order is the
    tuple's: the extra key's UTF-8 then a NUL (a shorter name that is a prefix sorts first, as the
    str), the depth and each token as 8 big-endian bytes (a token prefix sorts first, as the tuple)."""
    if "\0" in extra:
        raise ValueError(f"extra key {extra!r} holds a NUL character (the trajectory key ends it with one)")
    return (extra.encode() + b"\0" + depth.to_bytes(8, "big")
            + struct.pack(f">{len(tokens)}Q", *[t + _TOKEN_BIAS for t in tokens]))


def _first(pair):
    return pair[0]


class _LeafSet(set):
    """SGLang's `evictable_device_leaves`, noting every node that joins it (`fresh`): the feed of
    the kept orders. SGLang adds to and discards from the set in one place
    (`_update_evictable_leaf_sets`; our `_drop_leaf` discards too) and replaces it only on `reset`."""

    __slots__ = ("fresh",)

    def add(self, node) -> None:
        if node not in self:
            self.fresh[node] = None
        set.add(self, node)


class _LeafSetWithDepartures(_LeafSet):
    """`_LeafSet` noting every node that leaves the set too: for an order that counts the set's
    members exactly (the adaptive's cold share); the others' sets keep C's `discard`."""

    __slots__ = ()

    def discard(self, node) -> None:
        if node in self:
            self.fresh[node] = None
        set.discard(self, node)


class GreedyDual:
    """flop-aware's order kept across calls (FULL-only device trees): GreedyDual-Size with
    frequency-free values (Cao & Irani), a heap keyed by one number per leaf, so a call costs
    O((changes + victims) log L), not a ranking of every leaf.

    A leaf's priority is H = level(at its last access) + k * efficiency, with efficiency its
    prefill FLOPs per byte (`FlopAware`'s value of a full-attention leaf) and k = (1 - w) / w for
    the recency weight w (w = 1: recency alone; w = 0: efficiency alone). The lowest H goes first
    (worthless leaves before all; ties: the least recent, then leaf order); the `level` rises to
    each victim's H, so a leaf not accessed for a while falls below newer ones by how much it
    saves: recency and FLOPs per byte blended in one key that never moves while the leaf is
    idle. The level in force at an access is looked up from its history (one entry per evict
    call that raised it), so a parent a deletion exposes keeps the priority of its last access.
    Entries are entered from the component's change feed (joined the evictable set, split,
    re-stamped) and checked when popped (superseded, locked, no longer a leaf: skipped)."""

    __slots__ = ("heap", "entry", "level", "clocks", "levels", "k", "_uid")

    def __init__(self, recency_weight: float) -> None:
        self.heap: list = []
        self.entry: dict = {}  # leaf -> its live entry
        self.level = 0.0
        self.clocks: list[int] = []  # the access clock at which the level rose to `levels[i]`
        self.levels: list[float] = []
        self.k = (1 - recency_weight) / recency_weight if recency_weight > 0 else None
        self._uid = 0

    def level_at(self, access: int) -> float:
        """The level in force when an access stamped `access` happened."""
        i = bisect.bisect_left(self.clocks, access) - 1
        return self.levels[i] if i >= 0 else 0.0

    def priority(self, access: int, eff: float) -> float:
        return eff if self.k is None else self.level_at(access) + self.k * eff

    def enter(self, view, leaves, eff) -> None:
        core_leaves = view.core.evictable_device_leaves
        for leaf in leaves:
            if leaf in core_leaves and view.is_leaf(leaf) and view.evictable(leaf):
                acc = view.last_access(leaf)
                e_ = eff(leaf)
                self._uid += 1
                e = (e_ > 0, self.priority(acc, e_), acc, view.leaf_order(leaf), self._uid, leaf)
                self.entry[leaf] = e
                heapq.heappush(self.heap, e)
            else:
                self.entry.pop(leaf, None)

    def pop(self, view):
        """The live entry of least priority, off the heap (None: no evictable leaf)."""
        heap, entry = self.heap, self.entry
        core_leaves = view.core.evictable_device_leaves
        while heap:
            e = heapq.heappop(heap)
            leaf = e[5]
            if entry.get(leaf) is not e:
                continue
            del entry[leaf]
            if leaf in core_leaves and view.is_leaf(leaf) and view.evictable(leaf):
                return e
        return None

    def raise_level(self, h: float, clock: int) -> None:
        if h <= self.level:
            return
        self.level = h
        if self.clocks and self.clocks[-1] == clock:
            self.levels[-1] = h
        else:
            self.clocks.append(clock)
            self.levels.append(h)

    def clear(self) -> None:
        """Drops the entries (the feed re-enters every leaf), keeps the level's history."""
        self.heap = []
        self.entry = {}

    def compact(self) -> None:
        live = self.entry
        if len(self.heap) > 3 * len(live) // 2 + 32:
            self.heap[:] = [e for e in self.heap if live.get(e[5]) is e]
            heapq.heapify(self.heap)

    def order(self, view) -> list:
        """The leaves in the order the walk would take them now, less what it would skip (tests)."""
        live = self.entry
        core_leaves = view.core.evictable_device_leaves
        return [e[5] for e in sorted(self.heap) if live.get(e[5]) is e and e[5] in core_leaves
                and view.is_leaf(e[5]) and view.evictable(e[5])]


class RadixflowFullComponent(FullComponent):
    """SGLang's FULL component with the victim choice of a radixflow policy (`policy_kind`), and the
    recency and leaf order that policy reads, kept as our `RadixIndex` keeps them."""

    policy_kind = "rr-tail"
    leaves_gone_feed = False  # the feed reports leaves leaving SGLang's set too (`_LeafSetWithDepartures`)

    def __init__(self, cache, params) -> None:
        super().__init__(cache, params)
        self.policy = make_policy(self.policy_kind, params.page_size)
        self._walk = None
        self._mark = 0
        self._depths: dict[int, int] = {}
        self._values: dict[int, tuple] = {}  # flop-aware's leaf values (SGLangTreeView.value_memo)
        self._keys: dict[int, tuple] = {}  # trajectory keys by leaf id (SGLangTreeView.trajectory_key)
        self._clock = 0  # one tick per access (a lock, an insert): our index's `now`, as a counter
        self._leaf_seq = 0
        self.victims = 0  # leaves handed to the cache (tests read it)
        self._changed: dict = {}  # leaves to re-order (see SGLangTreeView.changes)
        self._view = None
        self._view_kept = None
        self._sent = 0  # what the last victim removed in a step freed (sent to the walk at the next)
        self._whole = False  # this call runs in one step
        self.cut_ahead = cut_ahead_factor()
        self.cuts = cuts_per_call()
        # flop-aware's order kept across calls (`GreedyDual`; FULL-only device trees, `trims`)
        self._flop_kept = isinstance(self.policy, FlopAware) and flop_order() == "kept"
        self._greedy: GreedyDual | None = None
        self._io = None  # this step's (tracker, device frees, host frees, actions) while a walk may remove

    # --------------------------------------------------------------- the kept orders' feed
    def drain_changes(self) -> list:
        leaves = self.tree_core.evictable_device_leaves
        kind = _LeafSetWithDepartures if self.leaves_gone_feed else _LeafSet
        if type(leaves) is not kind:  # first use, or SGLang's reset made a new set
            wrapped = kind(leaves)
            wrapped.fresh = {}
            self.tree_core.evictable_device_leaves = wrapped
            self._orders_reset()
            for order in ("_rotation", "_deepest"):  # the kept orders start afresh (the cursor stays)
                if hasattr(self.policy, order):
                    setattr(self.policy, order, None)
            if self._greedy is not None:
                self._greedy.clear()  # every leaf is entered again (the level's history stays)
            self._changed.clear()
            return sorted(wrapped, key=self._view_order)
        out = list(leaves.fresh)
        leaves.fresh.clear()
        if self._changed:
            out += self._changed
            self._changed.clear()
        return out

    def _orders_reset(self) -> None:
        """The feed starts afresh (its next drain is every evictable leaf): orders kept by a
        subclass drop what they hold."""

    @staticmethod
    def _view_order(node):
        return node.component_data[FULL].metadata.get(LEAF, 1 << 62), node.id

    # --------------------------------------------------------------- recency, leaf order
    def next_leaf_seq(self) -> int:
        self._leaf_seq += 1
        return self._leaf_seq

    def _stamp_path(self, node) -> None:
        """Our `touch(node, now)`: the whole path to the root gets this access's tick."""
        self._clock += 1
        now = self._clock
        root = self.tree_core.root_node
        while node is not None and node is not root:
            node.component_data[FULL].metadata[ACCESS] = now
            node = node.parent

    def acquire_component_lock(self, node, result, lock_host: bool = False):
        result = super().acquire_component_lock(node, result, lock_host)
        if not lock_host:
            self._stamp_path(node)  # a request takes its hit: our `lock(node, now)`
        return result

    def commit_insert_component_data(self, node, is_new_leaf, params, result, cache_actions) -> None:
        super().commit_insert_component_data(node, is_new_leaf, params, result, cache_actions)
        if is_new_leaf:
            node.component_data[FULL].metadata[LEAF] = self.next_leaf_seq()
            parent = node.parent
            if parent is not None:
                parent.component_data[FULL].metadata.pop(LEAF, None)  # not a leaf any more
                count = len(parent.children)
                self._children_changed(parent, count, node, added=True)
                if parent is self.tree_core.root_node:
                    self._depths[node.id] = len(node.key)
                else:
                    d = self._depths.get(parent.id)
                    if d is not None:  # its end depth, without a walk up at the next evict call
                        self._depths[node.id] = d + len(node.key)
                    if count == 1:  # a former leaf's chain goes on through it: the same key
                        key = self._keys.get(parent.id)
                        if key is not None:
                            self._keys[node.id] = key
                self._changed[parent] = None  # leaves the kept orders now, not when a walk meets it
        self._stamp_path(node)  # our `insert(..., now)` then `touch(node, now)`
        if (self._flop_kept or self.leaves_gone_feed) and not is_new_leaf:
            self._changed[node] = None  # a leaf re-stamped in the evictable set moves in the kept order
        self._bound_feed()
        self._enter_changes()

    def _enter_changes(self) -> None:
        """rr-tail / level-tail: enters what changed into the kept order now, on the request path (an
        insert), so that an evict call only enters what changed since the last request. The same
        orders: the feed reports every change after a drain, and a lap's own changes still enter when
        it closes (no walk runs here)."""
        pol = self.policy
        if self._walk is not None or not (self._flop_kept or isinstance(pol, RoundRobinTail)):
            return
        view = self._kept_view()
        if not view.trims:
            return  # the orders are fed at evict time only where calls run in one step
        changes = view.changes()
        if self._flop_kept:
            greedy = self._greedy_order()
            greedy.enter(view, changes, self._efficiency)
            greedy.compact()
            return
        if isinstance(pol, LevelTail):
            if pol._deepest is None:
                pol._deepest = DeepestFirst()
            pol._deepest.enter(view, changes)
            pol._deepest.compact()
        else:
            if pol._rotation is None:
                pol._rotation = Rotation()
            pol._rotation.enter(view, changes, pol._page_cursor)
            pol._rotation.compact()

    def _kept_view(self) -> SGLangTreeView:
        view = self._view_kept
        if view is None:  # one view for the cache's life (it holds no state of its own)
            view = self._view_kept = SGLangTreeView(self, depths=self._depths, keys=self._keys, values=self._values)
        return view

    def _bound_feed(self) -> None:
        """The feed is drained only by FULL evict calls of rr-tail and level-tail: where they do not
        come (pressure on Mamba slots alone, whose own eviction deletes nodes) it would keep dead
        nodes, so past twice the tree's nodes it is dropped, and the next walk enters every leaf
        afresh (the same orders: they are the whole walks' by construction)."""
        limit = 2 * len(self.tree_core._node_arena) + 64
        leaves = self.tree_core.evictable_device_leaves
        wrapped = isinstance(leaves, _LeafSet)
        if len(self._changed) > limit or (wrapped and len(leaves.fresh) > limit):
            self._changed.clear()
            if wrapped:
                self.tree_core.evictable_device_leaves = set(leaves)

    def redistribute_on_node_split(self, new_parent, child) -> None:
        super().redistribute_on_node_split(new_parent, child)
        stamp = child.component_data[FULL].metadata.get(ACCESS)
        if stamp is not None:  # the prefix inherits the recency, the suffix keeps its own
            new_parent.component_data[FULL].metadata[ACCESS] = stamp
        self._forget_keys(new_parent)  # the chain through `child` may now start at a shorter key
        if self._flop_kept:
            self._changed[child] = None  # a shorter span: a new efficiency

    def discard_deleted_session_leaf(self, node) -> None:
        super().discard_deleted_session_leaf(node)
        parent = node.parent  # SGLang deletes `node` from it right after this hook
        key = self._keys.pop(node.id, None)
        if parent is not None:
            count = len(parent.children) - 1
            self._children_changed(parent, count, node, added=False)
            if count == 0 and key is not None and parent is not self.tree_core.root_node:
                self._keys[parent.id] = key  # its only child's chain ran through it: the same key
            if parent is not self.tree_core.root_node and len(parent.children) == 1:
                parent.component_data[FULL].metadata[LEAF] = self.next_leaf_seq()  # a leaf from now on

    def _children_changed(self, parent, count: int, changed, added: bool) -> None:
        """`parent` now has `count` children (`changed` was added, or is being deleted). A chain starts
        where its parent has other than one child, so keys move only when `count` crosses one: at 0
        `parent` is a leaf (its own key), at 1 after a delete the chain of the one other child now runs
        through `parent`, and at 2 after an add that other child's chain now stops below it."""
        keys = self._keys
        if not keys or parent is self.tree_core.root_node:
            return
        if count == 0:
            keys.pop(parent.id, None)
        elif count == (2 if added else 1):
            for child in parent.children.values():
                if child is not changed:
                    self._forget_chain(child)
            keys.pop(parent.id, None)

    def _forget_chain(self, child) -> None:
        n = child
        while len(n.children) == 1:
            (n,) = n.children.values()
        if not n.children:
            self._keys.pop(n.id, None)
            self._changed[n] = None

    def _forget_keys(self, node) -> None:
        """Drops the trajectory keys a change of `node`'s children can change: `node`'s own, and those
        of the leaves that end the single-child chains below it (a chain starts where its parent has
        more than one child, so only these can move)."""
        keys = self._keys
        if not keys:
            return
        keys.pop(node.id, None)
        for child in node.children.values():
            n = child
            while len(n.children) == 1:
                (n,) = n.children.values()
            if not n.children:
                keys.pop(n.id, None)
                self._changed[n] = None

    def _evict_device_start(self, request_cnt: int) -> None:
        self._request = request_cnt
        self._walk = None
        self._started = False
        self._sent = 0

    def _greedy_order(self) -> GreedyDual:
        if self._greedy is None:
            self._greedy = GreedyDual(self.policy.recency_weight)
        return self._greedy

    def _efficiency(self, leaf) -> float:
        """`FlopAware`'s value per byte of a full-attention leaf (the same floats as
        `FlopAware._full_leaf_values`), memoised by node id with its key object (`value_memo`)."""
        memo = self._values
        m = memo.get(leaf.id)
        if m is not None and m[0] is leaf.key:
            return m[1]
        view = self._kept_view()
        c = self.policy.costs
        end = view.depth(leaf)
        start = view.start(leaf)
        k = max(0, end - start)
        pairs = k * start + k * (k + 1) / 2
        held = view.num_pages(leaf) * c.page_bytes
        eff = ((c.flops_per_token + c.recurrent_flops_per_token) * k + c.flops_per_pair * pairs) / max(held, 1e-9)
        memo[leaf.id] = (leaf.key, eff)
        return eff

    def greedy_walk(self, view, need: int):
        """flop-aware over its kept order (`GreedyDual`): the least priority first, whole leaves,
        a victim's exposed parent entered before the next pick, the level raised to each victim's."""
        greedy = self._greedy_order()
        freed = 0
        while freed < need:
            greedy.enter(view, view.changes(), self._efficiency)
            e = greedy.pop(view)
            if e is None:
                return
            got = yield e[5]
            greedy.raise_level(e[1], self._clock)
            freed += got

    def _start_walk(self, view, need: int):
        pol = self.policy
        if self._flop_kept and view.trims:
            return self.greedy_walk(view, need)
        if self.cuts and self._whole and isinstance(pol, RoundRobinTail):  # a real demand: batched chunks
            pages = max(pol.chunk_pages, -(-need // (self.cuts * view.unit)))
            return pol.page_walk(view, need, pages)
        return pol.page_walk(view, need)

    def _evict_device_next_node(self, tracker, device_frees, host_frees, cache_actions):
        """One SGLang step. On a tree that `trims` the component removes its victims itself (whole
        leaves by `_drop_leaf`, the last one shortened in place),
        the whole call in one step when SGLang asked for a count; one victim per step when it asked
        for more than the tree holds (`evict_for_alloc` runs to a target and checks it between
        steps). Elsewhere each step hands SGLang one leaf to delete."""
        done = tracker[FULL]
        try:
            if not self._started:
                self._started = True
                need = self._request - done
                if need <= 0:
                    return None
                if len(self._depths) > 4 * len(self.tree_core._node_arena) + 64:
                    self._depths.clear()  # nodes SGLang deleted on its own paths
                if len(self._values) > 4 * len(self.tree_core._node_arena) + 64:
                    self._values.clear()
                view = self._view = self._kept_view()
                size = self.tree_core.full_evictable_size()
                self._whole = view.trims and need < size
                pol = self.policy
                if self._whole and isinstance(pol, RoundRobinTail):
                    need = min(int(need * self.cut_ahead), size)
                    if self.cuts:  # a batched tail call: the whole call here, no generators
                        pages = max(pol.chunk_pages, -(-need // (self.cuts * view.unit)))
                        try:
                            self._tail_call(view, pol, need, pages, tracker, device_frees, host_frees,
                                            cache_actions)
                        finally:
                            frees = device_frees[FULL]
                            if len(frees) > 1:
                                frees[:] = [torch.cat(frees)]
                        return None
                self._walk = self._start_walk(view, need)
                if self._whole:  # the walk may remove victims itself, within this step (`removes_now`)
                    self._io = (tracker, device_frees, host_frees, cache_actions)
                    try:
                        victim = next(self._walk)
                    except StopIteration:
                        frees = device_frees[FULL]
                        if len(frees) > 1:
                            frees[:] = [torch.cat(frees)]
                        raise
                    finally:
                        self._io = None
                else:
                    victim = next(self._walk)
            elif self._walk is None:
                return None
            elif self._view.trims:
                victim = self._walk.send(self._sent)
            else:
                victim = self._walk.send(done - self._mark)  # what deleting the last victim freed
            if self._view.trims:
                try:
                    while True:
                        self._sent = self._remove(victim, tracker, device_frees, host_frees, cache_actions)
                        if not self._whole:
                            return None  # progress made: SGLang drains the frees and asks again
                        self._io = (tracker, device_frees, host_frees, cache_actions)
                        try:
                            victim = self._walk.send(self._sent)
                        finally:
                            self._io = None
                finally:
                    frees = device_frees[FULL]
                    if len(frees) > 1:  # one allocator free for the step (page-exact segments stay so)
                        frees[:] = [torch.cat(frees)]
        except StopIteration:
            self._walk = None
            return None
        self._mark = done
        self.victims += 1
        self._depths.pop(victim.id, None)  # the cache deletes it now
        return victim.id

    def _tail_call(self, view, pol, need: int, pages: int, tracker, device_frees, host_frees, cache_actions) -> None:
        """A batched rr-tail / level-tail call on a tree that `trims`, in one loop: the victims of
        `pol.page_walk(view, need, pages)` (the kept `Rotation` / `DeepestFirst`, `cut_to`'s cuts),
        each removed as it is chosen, without the generators' frames and sends (same decisions)."""
        if isinstance(pol, LevelTail):
            order = pol._deepest
            if order is None:
                order = pol._deepest = DeepestFirst()
            freed = 0
            span = pages * view.unit
            while freed < need:
                order.enter(view, view.changes())
                pick = order.deepest(view)
                if pick is None:
                    return
                d = view.depth(pick)
                got = self._cut_tail(view, pick, d - span if d > span else 0, tracker, device_frees, host_frees,
                                     cache_actions)
                if not got:
                    return
                freed += got
            return
        rot = pol._rotation
        if rot is None:
            rot = pol._rotation = Rotation()
        rot.enter(view, view.changes(), pol._page_cursor)
        entry = rot.entry
        is_leaf, evictable = view.is_leaf, view.evictable
        pop = heapq.heappop
        span = pages * view.unit
        freed = 0
        while freed < need:
            progressed = False
            visited = rot.visited = []
            try:
                for phase, heap in enumerate(rot.laps()):
                    rot._phase = phase
                    while heap:
                        e = pop(heap)
                        leaf = e[3]
                        if entry.get(leaf) is not e:
                            continue  # superseded or dropped
                        visited.append(e)
                        if not is_leaf(leaf) or not evictable(leaf):
                            del entry[leaf]
                            continue
                        pol._page_cursor = e[0]
                        d = view.depth(leaf)
                        got = self._cut_tail(view, leaf, d - span if d > span else 0, tracker, device_frees,
                                             host_frees, cache_actions)
                        progressed |= got > 0
                        freed += got
                        if freed >= need:
                            break
                    else:
                        continue
                    break
            finally:
                rot.close_lap(view, pol._page_cursor)
            if not progressed:
                return

    def _cut_tail(self, view, leaf, target: int, tracker, device_frees, host_frees, cache_actions) -> int:
        """`cut_to(view, leaf, target)` on a FULL-only tree that trims, each victim removed at once:
        whole leaves up the single-child chain (`_drop_leaf`'s steps, inline where the leaf has no
        host copy), the last one shortened in place (`_trim`'s). What it freed."""
        core = self.tree_core
        root = core.root_node
        frees = device_frees[FULL]
        sizes = core.component_evictable_size_
        leaves = core.evictable_device_leaves
        host_leaves = core.evictable_host_leaves
        depths = self._depths
        lean = _PLAIN_LEDGER and not core.lru_lists[FULL].cache and not core.host_lru_lists[FULL].cache
        before = tracker[FULL]
        node = leaf
        depth = view.depth(node)
        while depth > target and node is not root:
            if node.children:
                break
            cds = node.component_data
            cd = cds[FULL]
            value = cd.value
            if value is None:
                break
            for c in cds:
                if c.lock_ref > 0:
                    break
            else:
                key = node.key
                plain = lean and not key.is_bigram and key.limit is None
                start = depth - (len(key.token_ids) if plain else len(key))
                self.victims += 1
                if start < target:  # the last victim: shortened in place
                    if plain:
                        self._trim_plain(node, cd, key, value, target - start, target, tracker, frees)
                    else:
                        self._trim(node, target, tracker, device_frees)
                    break
                parent = node.parent
                depths.pop(node.id, None)
                if not lean or cd.host_value is not None:
                    self._drop_leaf(node, tracker, device_frees, host_frees, cache_actions)
                else:  # `_drop_leaf` on a leaf without host copy, its LRU lists empty
                    n = value.shape[0]
                    frees.append(value)
                    sizes[FULL] -= n
                    tracker[FULL] += n
                    if core._is_tracking_unbacked_tokens and n > 0:
                        core._tracked_unbacked_tokens += n
                    leaves.discard(node)
                    host_leaves.discard(node)
                    core._remove_leaf_from_parent(node)
                    core._update_evictable_leaf_sets(parent)
                    if parent is not root and not parent.children and parent.component_data[FULL].value is None:
                        core._iteratively_delete_tombstone_leaf(node, tracker, device_frees, host_frees,
                                                                cache_actions)
                node = parent
                depth = start
                continue
            break  # locked
        return tracker[FULL] - before

    def _trim_plain(self, node, cd, key, value, keep: int, depth: int, tracker, frees) -> None:
        """`_trim` of a plain key (no bigrams, no limit) on the plain ledger: the same steps."""
        n = value.shape[0]
        head, tail = value.tensor_split((keep,))
        frees.append(tail)
        cd.value = head
        node.key = type(key)(key.token_ids[:keep], key.extra_key, cache_salt=key.cache_salt)
        freed = n - keep
        self.tree_core.component_evictable_size_[FULL] -= freed
        tracker[FULL] += freed
        self._depths[node.id] = depth
        self._leaf_seq += 1
        cd.metadata[LEAF] = self._leaf_seq
        if keep < KEY_TOKENS:
            up = node.parent
            if up is self.tree_core.root_node or len(up.children) != 1:
                self._keys.pop(node.id, None)
        self._changed[node] = None
        node.last_access_time = get_and_increase_time_counter()

    def drop_now(self, leaf) -> int:
        """For a walk of a whole-call step on a tree that trims (`removes_now`): deletes the
        evictable leaf at once (`_drop_leaf`) instead of yielding it; what it freed."""
        tracker = self._io[0]
        before = tracker[FULL]
        self.victims += 1
        self._depths.pop(leaf.id, None)
        self._drop_leaf(leaf, *self._io)
        return tracker[FULL] - before

    @property
    def removes_now(self) -> bool:
        """A walk may remove its victims itself (`_cut_tail` with `_io`, `drop_now`): this call runs in one step."""
        return self._io is not None

    def _remove(self, victim, tracker, device_frees, host_frees, cache_actions) -> int:
        """Removes a victim of the walk in this step: a leaf (SGLang's own deletion) or a `Trim`."""
        self.victims += 1
        before = tracker[FULL]
        if isinstance(victim, Trim):
            self._trim(victim.node, victim.depth, tracker, device_frees)
        else:
            self._depths.pop(victim.id, None)
            self._drop_leaf(victim, tracker, device_frees, host_frees, cache_actions)
        return tracker[FULL] - before

    def _drop_leaf(self, node, tracker, device_frees, host_frees, cache_actions) -> None:
        """SGLang's `_delete_unbacked_device_leaf` on a FULL-only device tree (`trims`), step for step
        without its per-component and per-layer dispatch: the value to the frees and off the ledger
        (and the step's unbacked count), off the LRU lists and the leaf sets, out of its parent
        (SGLang's own `_remove_leaf_from_parent`: the components' hooks, the arena), the parent's
        leaf-set place renewed; a parent left a childless tombstone goes SGLang's own way."""
        core = self.tree_core
        cd = node.component_data[FULL]
        if cd.host_value is not None:  # a host copy (not on trees that trim): SGLang's own deletion
            core._delete_unbacked_device_leaf(node, tracker, device_frees, host_frees, cache_actions)
            return
        value = cd.value
        if value is not None:
            device_frees[FULL].append(value)
            n = value.shape[0] if _PLAIN_LEDGER else self.reclaimable_value_len(node)
            core.component_evictable_size_[FULL] -= n
            tracker[FULL] += n
            if core._is_tracking_unbacked_tokens and n > 0 and cd.host_value is None:
                core._tracked_unbacked_tokens += n
        for lru in (core.lru_lists[FULL], core.host_lru_lists[FULL]):
            if lru.in_list(node):
                lru.remove_node(node)
        core.evictable_device_leaves.discard(node)
        core.evictable_host_leaves.discard(node)
        parent = node.parent
        core._remove_leaf_from_parent(node)
        core._update_evictable_leaf_sets(parent)
        if parent is not core.root_node and not parent.children and parent.component_data[FULL].value is None:
            core._iteratively_delete_tombstone_leaf(node, tracker, device_frees, host_frees, cache_actions)

    def _trim(self, node, depth: int, tracker, device_frees) -> None:
        """Shortens leaf `node` in place to end at `depth` tokens: the suffix's slots go to SGLang's
        frees (drained after this step), the key and value keep the prefix, the evictable ledger
        loses what was freed. What `_split_node` and the deletion of the suffix would leave (the
        node keeps its id, recency and leaf order), with neither a new node nor a leaf-set pass."""
        key = node.key
        plain = not key.is_bigram and key.limit is None  # SGLang's slice, without its Python dispatch
        keep = depth - self._view.depth(node) + (len(key.token_ids) if plain else len(key))
        cd = node.component_data[FULL]
        value = cd.value
        before = value.shape[0] if _PLAIN_LEDGER else self.reclaimable_value_len(node)
        device_frees[FULL].append(value[keep:])
        cd.value = value[:keep]
        node.key = type(key)(key.token_ids[:keep], key.extra_key, cache_salt=key.cache_salt) if plain else key[:keep]
        freed = before - (keep if _PLAIN_LEDGER else self.reclaimable_value_len(node))
        self.tree_core.component_evictable_size_[FULL] -= freed
        tracker[FULL] += freed
        self._depths[node.id] = depth
        # As after a split and the suffix's deletion: the kept prefix is a leaf from now on (leaf
        # order), its chain may start at a shorter key, and SGLang's counter sees a fresh node.
        cd.metadata[LEAF] = self.next_leaf_seq()
        up = node.parent
        if keep < KEY_TOKENS and (up is self.tree_core.root_node or len(up.children) != 1):
            self._keys.pop(node.id, None)  # its chain starts here: the key's first tokens were cut
        self._changed[node] = None  # a new depth, a new leaf order, perhaps a new key
        node.last_access_time = get_and_increase_time_counter()

    def _evict_device_end(self) -> None:
        if self._walk is not None:
            self._walk.close()
        self._walk = None
        self._view = None
