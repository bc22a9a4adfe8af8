"""The radixflow eviction walks as SGLang radix-cache backends (imports SGLang; see __init__.py).

SGLang's `UnifiedRadixCache` evicts FULL (device KV) through its FULL component: the cache calls
`evict_device_next_node` for one victim leaf at a time and deletes that leaf itself
(`evict_device_leaf`, which also frees the node's Mamba and SWA values and fixes the ledgers and leaf
sets). `RadixflowFullComponent` keeps all of SGLang's FULL component (locks, match, split, frees) and
replaces only that choice: it runs our policy (`cache/eviction/`, the same walks our own `RadixIndex`
runs) over `SGLangTreeView`, a read-only view of SGLang's nodes (tree.py, which alone touches
SGLang's private tree-core names). On a FULL-only device tree the component removes the victims
itself in one SGLang step per evict call (tree.py `TreeEdits`: whole leaves by SGLang's
`_delete_unbacked_device_leaf` steps without its per-component dispatch, the last one of a cut
shortened in place), and rr-tail's and level-tail's calls (and the adaptive's tail calls) are
batched there (about `cuts_per_call` cuts freeing `cut_ahead_factor` times the demand: the policy's
`cuts`, each removed whole). Elsewhere (Mamba, SWA) a tail cut splits the leaf with SGLang's own
split (the node keeps the tail, which becomes the victim) and SGLang deletes it.
rr-tail's rotation and level-tail's depth order are kept across calls (`cache/eviction/kept.py`
`Rotation`, `DeepestFirst`), fed by `changes()` on every insert (the policy's `enter_changes`) and at
each call: nodes joining SGLang's evictable leaf set (`LeafSet`), leaves trimmed or given a child,
trajectory keys forgotten. flop-aware's order is kept the same way on FULL-only device trees
(`GreedyDual`; RADIXFLOW_SGLANG_FLOP_ORDER), elsewhere it ranks every leaf per call (`FlopAware`).
The RADIXFLOW_SGLANG_* settings are read once per cache (settings.py).

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

import itertools

from sglang.srt.mem_cache.unified_cache.components.full import FullComponent

from radixflow.cache.eviction import FlopAware, RoundRobinTail
from radixflow.cache.eviction.kept import GreedyDual
from radixflow.integrations.sglang.settings import (  # noqa: F401  (the settings' readers, as before)
    Settings,
    cut_ahead_factor,
    cuts_per_call,
    flop_order,
    make_policy,
)
from radixflow.integrations.sglang.tree import (  # noqa: F401  (encode_key, MAMBA: as before)
    ACCESS,
    FULL,
    LEAF,
    MAMBA,
    LeafSet,
    LeafSetWithDepartures,
    SGLangTreeView,
    TreeEdits,
    encode_key,
    join_frees,
)


class RadixflowFullComponent(TreeEdits, FullComponent):
    """SGLang's FULL component with the victim choice of a radixflow policy (`policy_kind`), and the
    recency and leaf order that policy reads, kept as our `RadixIndex` keeps them."""

    policy_kind = "rr-tail"
    leaves_gone_feed = False  # the feed reports leaves leaving SGLang's set too (`LeafSetWithDepartures`)

    def __init__(self, cache, params) -> None:
        super().__init__(cache, params)
        self.settings = Settings.read()  # RADIXFLOW_SGLANG_*, once per cache
        self.policy = make_policy(self.policy_kind, params.page_size, self.settings)
        self._walk = None
        self._mark = 0
        self._depths: dict[int, int] = {}
        self._values: dict[int, tuple] = {}  # flop-aware's leaf values (SGLangTreeView.value_memo)
        self._keys: dict[int, tuple] = {}  # trajectory keys by leaf id (SGLangTreeView.trajectory_key)
        self._clock = 0  # one tick per access (a lock, an insert): our index's `now`, as a counter
        # the leaf-order stamp: 1, 2, 3, ... (a C-level counter: stamped on every trim and new leaf)
        self.next_leaf_seq = itertools.count(1).__next__
        self.victims = 0  # leaves handed to the cache (tests read it)
        self._changed: dict = {}  # leaves to re-order (see SGLangTreeView.changes)
        self._view = None
        self._view_kept = None
        self._sent = 0  # what the last victim removed in a step freed (sent to the walk at the next)
        self._whole = False  # this call runs in one step
        self.cut_ahead = self.settings.cut_ahead
        self.cuts = self.settings.cuts_per_call
        # flop-aware's order kept across calls (`GreedyDual`; FULL-only device trees, `trims`)
        self._flop_kept = isinstance(self.policy, FlopAware) and self.settings.flop_order == "kept"
        self._greedy: GreedyDual | None = None
        self._io = None  # this step's (tracker, device frees, host frees, actions) while a walk may remove

    # --------------------------------------------------------------- the kept orders' feed
    def drain_changes(self) -> list:
        leaves = self.tree_core.evictable_device_leaves
        kind = LeafSetWithDepartures if self.leaves_gone_feed else LeafSet
        if type(leaves) is not kind:  # first use, or SGLang's reset made a new set
            wrapped = kind(leaves)
            wrapped.fresh = {}
            self.tree_core.evictable_device_leaves = wrapped
            self._orders_reset()
            if isinstance(self.policy, RoundRobinTail):
                self.policy.forget_orders()  # the kept orders start afresh (the cursor stays)
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
        pol.enter_changes(view, changes)

    def _kept_view(self) -> SGLangTreeView:
        view = self._view_kept
        if view is None:  # one view for the cache's life (it holds no state of its own)
            view = self._view_kept = SGLangTreeView(self, depths=self._depths, keys=self._keys, values=self._values)
        return view

    def _bound_feed(self) -> None:
        """The feed is drained only by FULL evict calls of rr-tail and level-tail: where they do not
        come (pressure on Mamba slots alone, whose own eviction deletes nodes) it would keep dead
        nodes, so past twice the tree's nodes it is dropped, and the next walk enters every leaf
        afresh (the same orders: they are the whole walks' by construction). The memos by node id
        keep the ids of nodes SGLang deleted on its own paths: past four times the tree's nodes they
        start afresh (values recomputed as asked: no decision moves). Checked at every insert."""
        size = self.arena_size()
        limit = 2 * size + 64
        leaves = self.tree_core.evictable_device_leaves
        wrapped = isinstance(leaves, LeafSet)
        if len(self._changed) > limit or (wrapped and len(leaves.fresh) > limit):
            self._changed.clear()
            if wrapped:
                self.tree_core.evictable_device_leaves = set(leaves)
        limit = 4 * size + 64
        if len(self._depths) > limit:
            self._depths.clear()
        if len(self._values) > limit:
            self._values.clear()

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
        """`FlopAware.efficiency` of a leaf, through the view's memo."""
        return self._kept_view().memo_value(leaf, self.policy.efficiency)

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
        return pol.page_walk(view, need)  # (batched tail calls run in `_tail_call`)

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
                view = self._view = self._kept_view()
                size = self.tree_core.full_evictable_size()
                self._whole = view.trims and need < size
                pol = self.policy
                if self._whole and isinstance(pol, RoundRobinTail):
                    need = min(int(need * self.cut_ahead), size)
                    if self.cuts:  # a batched tail call: the whole call here, no generators
                        pages = max(pol.chunk_pages, -(-need // (self.cuts * view.unit)))
                        self._io = (tracker, device_frees, host_frees, cache_actions)
                        try:
                            self._tail_call(view, pol, need, pages)
                        finally:
                            self._io = None
                            join_frees(device_frees)
                        return None
                self._walk = self._start_walk(view, need)
                if self._whole:  # the walk may remove victims itself, within this step (`removes_now`)
                    self._io = (tracker, device_frees, host_frees, cache_actions)
                    try:
                        victim = next(self._walk)
                    except StopIteration:
                        join_frees(device_frees)
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
                    join_frees(device_frees)
        except StopIteration:
            self._walk = None
            return None
        self._mark = done
        self.victims += 1
        self._depths.pop(victim.id, None)  # the cache deletes it now
        return victim.id

    def _tail_call(self, view, pol, need: int, pages: int) -> None:
        """A batched rr-tail / level-tail call on a tree that `trims`, within a step that removes
        (`_io`): the policy's cuts (`pol.cuts(view, need, pages)`), each removed whole as it is
        chosen (`_cut_tail`, called by the policy's loop itself: no generator switch a cut)."""
        for _ in pol.cuts(view, need, pages, self._cut_tail):  # runs to its end at the first `next`
            raise AssertionError("cuts yielded a cut while given `cut`")

    def _evict_device_end(self) -> None:
        if self._walk is not None:
            self._walk.close()
        self._walk = None
        self._view = None
