"""SGLang's radix tree as our policies read it, and the edits our backends make to it: the one module
that touches the private names of SGLang's tree core (`_node_arena`, `_split_node`,
`_delete_unbacked_device_leaf`, `_remove_leaf_from_parent`, `_update_evictable_leaf_sets`,
`_iteratively_delete_tombstone_leaf`, `_is_tracking_unbacked_tokens`, `_tracked_unbacked_tokens`)
and of its cache (`_apply_cache_action`) and FULL component (`_ensure_eviction_strategy`), as SGLang
0.5.23 has them (compat.py refuses others).

- `SGLangTreeView`: `cache/eviction`'s `TreeView` over SGLang's `UnifiedTreeCore` (Python core).
- `LeafSet`: SGLang's evictable leaf set, noting what joins it: the kept orders' change feed.
- `TreeEdits`: the FULL component's removals on a FULL-only device tree, in one SGLang step: whole
  leaves (`_drop_leaf`: SGLang's `_delete_unbacked_device_leaf` without its per-component dispatch)
  and the last one of a cut shortened in place (`_trim`).
"""

from __future__ import annotations

import struct
from types import SimpleNamespace

import torch
from sglang.srt.mem_cache.evict_policy import LRUStrategy
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType, TreeComponent
from sglang.srt.mem_cache.unified_cache.components.full import FullComponent
from sglang.srt.mem_cache.unified_cache.unified_tree_core import get_and_increase_time_counter

from radixflow.cache.eviction import Trim, cut_to
from radixflow.cache.eviction.view import ORDER_TOKENS, trajectory_key

FULL, MAMBA = ComponentType.FULL, ComponentType.MAMBA
# The FULL ledger counts value lengths (no component of SGLang 0.5.23's FULL overrides it): a trim
# frees exactly the tokens it cuts.
PLAIN_LEDGER = FullComponent.reclaimable_value_len is TreeComponent.reclaimable_value_len
ACCESS, LEAF = "rf_access", "rf_leaf"  # keys of the FULL component data's metadata (backend.py)


class SGLangTreeView:
    """`cache/eviction.TreeView` over SGLang's `UnifiedTreeCore` (Python core). Built per eviction
    walk. Depths are memoised by node id (`depths`, kept by the component across walks): a node's end
    depth never changes while it lives (a split keeps it; ids are never reused)."""

    tails_empty: list = []

    def __init__(self, component: FullComponent, depths: dict | None = None, keys: dict | None = None,
                 values: dict | None = None) -> None:
        self.component = component
        self.core = component.tree_core
        # `changes()`: leaves whose place in the kept orders may have moved since last asked
        # (`cache/eviction/kept.py`): nodes that joined SGLang's evictable leaf set (a new leaf, an
        # unlocked one, a parent a deletion exposed), leaves cut in place, leaves whose trajectory key
        # was forgotten; all evictable leaves the first time, and after SGLang replaced its set. The
        # component's own method, bound here (no frame of the view's a call: every pick asks it).
        self.changes = component.drain_changes
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

    def memo_value(self, leaf, value) -> float:
        """`value(self, leaf)` (flop-aware's `efficiency`), memoised by node id with the key object it
        was computed for (SGLang replaces a node's key whenever its span changes)."""
        memo = self.value_memo
        m = memo.get(leaf.id)
        if m is not None and m[0] is leaf.key:
            return m[1]
        v = value(self, leaf)
        memo[leaf.id] = (leaf.key, v)
        return v

    # --------------------------------------------------------------- structure
    def leaves(self) -> list:
        # evictable_device_leaves: unlocked, FULL on device, no device child. A set, whose order differs
        # between processes; ties (flop-aware scores; equal trajectory keys, as when histories start
        # inside the same page of a shared prompt) follow the leaves' order, so give our index's: the
        # order the nodes became leaves in (`leaf_order`).
        order = self.leaf_order
        keyed = [(order(n), n) for n in self.core.evictable_device_leaves]
        keyed.sort(key=_first)
        return [n for _, n in keyed]

    def unordered_leaves(self) -> tuple[list, list]:
        """`leaves()` unsorted, with each one's leaf order (flop-aware ranks by it, sorting once)."""
        leaves = list(self.core.evictable_device_leaves)
        return leaves, [self.leaf_order(n) for n in leaves]

    def is_leaf(self, node) -> bool:
        return node.parent is not None and not node.children and node.id in self.core._node_arena

    def live_leaf(self, node) -> bool:
        """An evictable leaf in SGLang's own set of them."""
        return node in self.core.evictable_device_leaves and self.evictable_leaf(node)

    def evictable_leaf(self, node) -> bool:
        """`is_leaf` and `evictable` in one call (the kept orders ask it of every entry they meet):
        a leaf in the tree (the root has no parent), holding its FULL value, that no request locks."""
        if node.parent is None or node.children or node.id not in self.core._node_arena:
            return False
        if node.component_data[FULL].value is None:
            return False
        for cd in node.component_data:  # a loop, not any(): this runs for every leaf of every walk
            if cd.lock_ref > 0:
                return False
        return True

    def evictable(self, node) -> bool:
        # Asked of childless nodes only (`cut_to` checks `has_children` first): one check with
        # `evictable_leaf`, which every kept order asks of every entry it meets.
        return self.evictable_leaf(node)

    @staticmethod
    def has_children(node) -> bool:
        return bool(node.children)

    @staticmethod
    def children(node):
        return node.children.values()

    @staticmethod
    def num_children(node) -> int:
        return len(node.children)

    @staticmethod
    def tokens(node):
        return node.key.token_ids

    @staticmethod
    def namespace(node) -> str:
        extra = node.key.extra_key
        return "" if extra is None else str(extra)

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
        """Where the leaf's unshared chain starts (`cache/eviction/view.trajectory_key`), encoded so
        that bytes order is the tuple order (`encode_key`: the kept orders' heaps then compare keys
        in one memcmp, not tuple by tuple). Memoised by leaf id (`keys`, kept by the component across
        walks, which forgets a key when the chain can have changed: a child added or deleted above
        it, a split on it)."""
        key = self._keys.get(leaf.id)
        if key is None:
            key = self._keys[leaf.id] = self._trajectory_key(leaf)
        return key

    def _trajectory_key(self, leaf) -> bytes:
        return encode_key(*trajectory_key(self, leaf))

    def split(self, node, depth: int) -> None:
        keep_above = depth - self.start(node)
        _, action = self.core._split_node(node.key, node, keep_above)
        if action is not None:
            self.component.cache._apply_cache_action(action)

    def tails(self) -> list:
        return self.tails_empty

    def leaf_order(self, leaf) -> int:
        """The order the node became a leaf in (`rf_leaf`); one never seen becoming one is placed now."""
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


class LeafSet(set):
    """SGLang's `evictable_device_leaves`, noting every node that joins it (`fresh`): the feed of
    the kept orders. SGLang adds to and discards from the set in one place
    (`_update_evictable_leaf_sets`; our `_drop_leaf` discards too) and replaces it only on `reset`."""

    __slots__ = ("fresh",)

    def add(self, node) -> None:
        if node not in self:
            self.fresh[node] = None
        set.add(self, node)


class LeafSetWithDepartures(LeafSet):
    """`LeafSet` noting every node that leaves the set too: for an order that counts the set's
    members exactly (the adaptive's cold share); the others' sets keep C's `discard`."""

    __slots__ = ()

    def discard(self, node) -> None:
        if node in self:
            self.fresh[node] = None
        set.discard(self, node)


def join_frees(device_frees) -> None:
    """One allocator free for the step's FULL frees (page-exact segments stay so)."""
    frees = device_frees[FULL]
    if len(frees) > 1:
        frees[:] = [torch.cat(frees)]


class TreeEdits:
    """What the FULL component does to SGLang's tree itself (mixed into `RadixflowFullComponent`,
    whose memos `_depths`, `_keys`, `_changed` and counters it keeps in step)."""

    def arena_size(self) -> int:
        """Nodes in the tree."""
        return len(self.tree_core._node_arena)

    def tree_nodes(self):
        return self.tree_core._node_arena.values()

    def lru_priority(self):
        """SGLang's FULL eviction priority (its strategy, built on first use), and whether it is
        lru's own (the node's access counter), not a session-aware one."""
        self._ensure_eviction_strategy()
        prio = self.session_ref_eviction_strategy
        return prio, getattr(prio, "__func__", None) is LRUStrategy.get_priority

    INLINE_CUTS = True  # `_cut_tail` walks the cut itself: the victims `cut_to` gives (test_sglang_inline_cuts.py)

    def _cut_tail(self, leaf, target: int) -> int:
        """`cut_to(view, leaf, target)` over this call's view, within a step that may remove (`_io`:
        the step's I/O; the policy's `cut`), each victim removed at once (`_remove`: whole leaves up
        the single-child chain, the last one shortened in place). What it freed. The batched calls'
        hot loop, so the cut's walk is inline (no generator, no view calls): the same victims in the
        same order as `cut_to`, which runs instead with `INLINE_CUTS` off."""
        tracker, device_frees, host_frees, cache_actions = self._io
        before = tracker[FULL]
        if not self.INLINE_CUTS:
            for victim in cut_to(self._view, leaf, target):
                self._remove(victim, tracker, device_frees, host_frees, cache_actions)
            return tracker[FULL] - before
        root = self.tree_core.root_node
        depths = self._depths
        node = leaf
        depth = depths.get(node.id)  # (the policy read it to set `target`: memoised)
        if depth is None:
            depth = self._view.depth(node)
        while depth > target and node is not root:  # `cut_to`'s walk on a FULL-only tree
            if node.children:
                break
            cds = node.component_data
            if cds[FULL].value is None:
                break
            for c in cds:
                if c.lock_ref > 0:
                    break
            else:
                key = node.key   # a plain key's length without RadixKey.__len__'s two Python calls
                start = depth - (len(key.token_ids) if not key.is_bigram and key.limit is None else len(key))
                self.victims += 1
                if start < target:  # the last victim: shortened in place
                    self._trim(node, target, tracker, device_frees[FULL], depth)
                    break
                parent = node.parent
                depths.pop(node.id, None)
                self._drop_leaf(node, tracker, device_frees, host_frees, cache_actions)
                node = parent
                depth = start
                continue
            break  # locked
        return tracker[FULL] - before

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
        """A walk may remove its victims itself (`_cut_tail`, `drop_now`: `_io` holds the step's I/O):
        this call runs in one step."""
        return self._io is not None

    def _remove(self, victim, tracker, device_frees, host_frees, cache_actions) -> int:
        """Removes a victim of the walk in this step: a leaf (SGLang's own deletion) or a `Trim`."""
        self.victims += 1
        before = tracker[FULL]
        if isinstance(victim, Trim):
            self._trim(victim.node, victim.depth, tracker, device_frees[FULL])
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
            n = value.shape[0] if PLAIN_LEDGER else self.reclaimable_value_len(node)
            core.component_evictable_size_[FULL] -= n
            tracker[FULL] += n
            if core._is_tracking_unbacked_tokens and n > 0:  # (no host copy: returned above)
                core._tracked_unbacked_tokens += n
        for lru in (core.lru_lists[FULL], core.host_lru_lists[FULL]):
            if lru.cache and lru.in_list(node):  # (the lists are empty on trees that trim)
                lru.remove_node(node)
        core.evictable_device_leaves.discard(node)
        core.evictable_host_leaves.discard(node)
        parent = node.parent
        core._remove_leaf_from_parent(node)
        core._update_evictable_leaf_sets(parent)
        if parent is not core.root_node and not parent.children and parent.component_data[FULL].value is None:
            core._iteratively_delete_tombstone_leaf(node, tracker, device_frees, host_frees, cache_actions)

    def _trim(self, node, depth: int, tracker, frees, end: int | None = None) -> None:
        """Shortens leaf `node` in place to end at `depth` tokens: the suffix's slots go to SGLang's
        frees (drained after this step), the key and value keep the prefix, the evictable ledger
        loses what was freed. What `_split_node` and the deletion of the suffix would leave (the
        node keeps its id, recency and leaf order), with neither a new node nor a leaf-set pass."""
        key = node.key
        plain = not key.is_bigram and key.limit is None  # SGLang's slice, without its Python dispatch
        if end is None:  # the node's depth (its end), when the caller has not read it
            end = self._depths.get(node.id)  # (the cut read it: memoised)
            if end is None:
                end = self._kept_view().depth(node)
        keep = depth - end + (len(key.token_ids) if plain else len(key))
        cd = node.component_data[FULL]
        value = cd.value
        n = value.shape[0]
        before = n if PLAIN_LEDGER else self.reclaimable_value_len(node)
        head, tail = value.split_with_sizes((keep, n - keep))  # (views, as tensor_split's; one dispatch less)
        frees.append(tail)
        cd.value = head
        node.key = type(key)(key.token_ids[:keep], key.extra_key, cache_salt=key.cache_salt) if plain else key[:keep]
        freed = before - (keep if PLAIN_LEDGER else self.reclaimable_value_len(node))
        self.tree_core.component_evictable_size_[FULL] -= freed
        tracker[FULL] += freed
        self._depths[node.id] = depth
        # As after a split and the suffix's deletion: the kept prefix is a leaf from now on (leaf
        # order), its chain may start at a shorter key, and SGLang's counter sees a fresh node.
        cd.metadata[LEAF] = self.next_leaf_seq()
        up = node.parent
        if keep < ORDER_TOKENS and (up is self.tree_core.root_node or len(up.children) != 1):
            self._keys.pop(node.id, None)  # its chain starts here: the key's first tokens were cut
        self._changed[node] = None  # a new depth, a new leaf order, perhaps a new key
        node.last_access_time = get_and_increase_time_counter()
