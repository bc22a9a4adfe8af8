"""Eviction policies of the prefix index: behaviour on small trees and properties under random use."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factories import KeptOrderView
from radixflow.cache.eviction import EVICTION_POLICIES, LRU, FlopAware, ReuseCosts, get_eviction, parse_evictions
from radixflow.cache.pool import IdPool
from radixflow.cache.radix import RadixIndex, chain_hashes

BS = 2


def make_index(policy: str, pages: int = 256, slots: int = 0, bs: int = BS) -> RadixIndex:
    return RadixIndex(bs, IdPool(pages, "KV page"), IdPool(slots, "state slot"), policy)


def put(index: RadixIndex, tokens, ns: str = "", now: float = 0.0, snapshot: bool = False):
    """Caches `tokens` (whole pages) like a finished branch would; returns the node at its end."""
    bs = index.block_size
    hashes = chain_hashes(ns, tokens, bs)
    n = len(hashes)
    m = index.match(hashes)
    have = m.depth // bs
    if have < n and not index.pages.can_allocate(n - have):
        index.evict_pages(n - have - index.pages.num_free)
        m = index.match(hashes)
        have = m.depth // bs
        if not index.pages.can_allocate(n - have):
            return None
    table = index.pages_upto(m, have) + index.pages.allocate(n - have)
    node, adopted = index.insert(ns, tokens, hashes, table, n, now)
    assert adopted == have
    index.publish()
    index.touch(node, now)
    if snapshot and index.slots.capacity:
        end = index.node_at(index.match(hashes))
        if end.snapshot is None and (index.slots.num_free or index.evict_snapshots(1)):
            if index.slots.num_free:
                index.attach_snapshot(end, index.slots.allocate_one(), None, now)
    return index.node_at(index.match(hashes))


def cached_len(index: RadixIndex, tokens, ns: str = "") -> int:
    return index.match(chain_hashes(ns, tokens, index.block_size)).depth


def path_tokens(node) -> tuple[int, ...]:
    return tuple(t for n in reversed(list(node.path())) for t in n.key)


def check_prefix_closed(index: RadixIndex) -> None:
    """Every cached path is a valid prefix: its chain hashes are those of its tokens from the root."""
    nodes = list(index._iter_nodes())
    for n in nodes:
        toks = path_tokens(n)
        assert chain_hashes(n.namespace, toks, index.block_size)[-len(n.hashes):] == n.hashes
    alive = set(nodes)
    for n in index._snap_nodes:
        assert n in alive, "snapshot on a node that left the tree"
        assert all(p in alive for p in n.path()), "snapshot without its KV path"
    index.check_integrity()
    assert len(index.check_integrity()[0]) + index.pages.num_free == index.pages.capacity


# ----------------------------------------------------------------------------- registry
def test_registry_names_and_chunk():
    assert set(EVICTION_POLICIES) >= {"lru", "rr-tail", "level-tail"}
    assert isinstance(get_eviction("lru"), LRU)
    assert get_eviction("rr-tail:8").chunk_pages == 8
    assert parse_evictions("lru, rr-tail") == ["lru", "rr-tail"]
    with pytest.raises(ValueError, match="choose from"):
        get_eviction("fifo")
    with pytest.raises(ValueError, match="rr-tail:N"):
        get_eviction("lru:3")
    with pytest.raises(ValueError):
        get_eviction("rr-tail:0")


def test_default_is_lru():
    assert isinstance(RadixIndex(BS, IdPool(4, "p"), IdPool(0, "s")).eviction, LRU)


# ----------------------------------------------------------------------------- behaviour
def agents(index: RadixIndex, n: int, length: int):
    system = tuple(range(1000, 1008))  # 4 shared pages
    trajs = []
    for a in range(n):
        toks = system + tuple(10_000 * (a + 1) + i for i in range(length))
        put(index, toks, now=float(a))
        trajs.append(toks)
    return system, trajs


def test_lru_evicts_whole_oldest_agents():
    index = make_index("lru")
    system, trajs = agents(index, 4, 20)  # 10 private pages each
    index.evict_pages(12)
    kept = [cached_len(index, t) - len(system) for t in trajs]
    assert kept[0] == 0 and kept[1] == 0 and kept[2:] == [20, 20]
    check_prefix_closed(index)


def test_rr_tail_spreads_the_cut_over_idle_agents():
    index = make_index("rr-tail:2")
    system, trajs = agents(index, 4, 20)
    index.evict_pages(16)  # two rounds of 2-page chunks over 4 agents
    kept = [cached_len(index, t) - len(system) for t in trajs]
    assert kept == [12, 12, 12, 12]
    index.evict_pages(4)  # the rotation goes on where it stopped
    kept = sorted(cached_len(index, t) - len(system) for t in trajs)
    assert kept == [8, 8, 12, 12]
    check_prefix_closed(index)


def test_level_tail_cuts_the_deepest_idle_history_first():
    index = make_index("level-tail:2")
    system = tuple(range(1000, 1008))
    lens = [8, 16, 24]
    trajs = [system + tuple(10_000 * (a + 1) + i for i in range(n)) for a, n in enumerate(lens)]
    for t in trajs:
        put(index, t)
    index.evict_pages(8)  # 24 → 16 first, then the two 16s in turn down to 12
    assert [cached_len(index, t) - len(system) for t in trajs] == [8, 12, 12]
    check_prefix_closed(index)


def test_rr_tail_never_touches_a_locked_path():
    index = make_index("rr-tail:2")
    system, trajs = agents(index, 3, 20)
    locked = index.node_at(index.match(chain_hashes("", trajs[1], BS)))
    index.lock(locked)
    freed = index.evict_pages(1000)
    assert cached_len(index, trajs[1]) == len(trajs[1])
    assert cached_len(index, trajs[0]) == len(system) == cached_len(index, trajs[2])
    assert freed == 20  # both idle agents whole; the shared system prompt is on the locked path
    index.unlock(locked)
    check_prefix_closed(index)


def test_rr_tail_hybrid_cuts_end_on_snapshots():
    index = make_index("rr-tail:1", slots=64)
    system = tuple(range(1000, 1008))
    toks = system + tuple(range(5000, 5024))  # 8 + 24 tokens
    for end in (16, 24, 32):  # snapshots at 16, 24 and 32 tokens
        put(index, toks[:end], snapshot=True)
    put(index, toks + (7, 7, 7, 7))  # 4 more tokens of KV with no snapshot: not resumable
    index.evict_pages(1)
    assert cached_len(index, toks + (7, 7, 7, 7)) == 32  # the dead KV goes first, down to a snapshot
    index.evict_pages(1)
    assert cached_len(index, toks) == 24  # then one snapshot interval at a time
    assert all(n.snapshot is None or n.depth <= 24 for n in index._snap_nodes)
    check_prefix_closed(index)


def test_rr_tail_snapshot_eviction_takes_trajectory_ends_in_turn():
    index = make_index("rr-tail", slots=64)
    system = tuple(range(1000, 1008))
    ends = []
    for a in range(3):
        toks = system + tuple(10_000 * (a + 1) + i for i in range(16))
        for end in (16, 24):
            put(index, toks[:end], snapshot=True)
        ends.append(toks)
    assert index.num_snapshots == 6
    index.evict_snapshots(3)
    depths = sorted(n.depth for n in index._snap_nodes)
    assert depths == [16, 16, 16]  # one end snapshot from each agent, not three from one
    check_prefix_closed(index)


# ----------------------------------------------------------------------------- properties
ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from(["", "b"]),
                  st.lists(st.integers(0, 2), min_size=BS, max_size=14), st.booleans()),
        st.tuples(st.just("lock"), st.integers(0, 50)),
        st.tuples(st.just("unlock"), st.integers(0, 50)),
        st.tuples(st.just("evict"), st.integers(1, 12)),
        st.tuples(st.just("evict_snap"), st.integers(1, 4)),
        st.tuples(st.just("lock_snap"), st.integers(0, 50)),
    ),
    max_size=40,
)


@pytest.mark.parametrize("policy", ["lru", "rr-tail", "rr-tail:1", "rr-tail:3", "level-tail:2", "flop-aware",
                                    "flop-aware:0", "flop-aware:1"])
@pytest.mark.parametrize("slots", [0, 6])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seq=ops)
def test_random_eviction_sequences_keep_the_invariants(policy, slots, seq):
    index = make_index(policy, pages=24, slots=slots)
    locked = []  # (node, tokens, ns) held by a "running branch"
    seen = []
    snap_locked = []
    for op in seq:
        kind = op[0]
        if kind == "put":
            _, ns, toks, snap = op
            toks = tuple(toks)
            node = put(index, toks, ns, now=len(seen), snapshot=snap)
            if node is not None:
                seen.append((node, toks, ns))
        elif kind == "lock" and seen:
            node, toks, ns = seen[op[1] % len(seen)]
            if cached_len(index, toks, ns) == len(toks) // BS * BS:
                node = index.node_at(index.match(chain_hashes(ns, toks, BS)))
                index.lock(node)
                locked.append((node, toks, ns))
        elif kind == "unlock" and locked:
            node, _, _ = locked.pop(op[1] % len(locked))
            index.unlock(node)
        elif kind == "lock_snap" and index._snap_nodes:
            nodes = sorted(index._snap_nodes, key=lambda n: (n.namespace, n.depth, n.key))
            node = nodes[op[1] % len(nodes)]
            node.snapshot.lock += 1
            snap_locked.append(node)
        elif kind in ("evict", "evict_snap"):
            before = {(ns, len(t)): [h for n in node.path() for h in n.hashes] for node, t, ns in locked}
            held_snaps = [n.snapshot for n in snap_locked]
            if kind == "evict":
                index.evict_pages(op[1])
            else:
                index.evict_snapshots(op[1])
            for hashes in before.values():
                assert all(h in index._by_hash for h in hashes), "eviction touched a locked path"
            for n, s in zip(snap_locked, held_snaps, strict=True):
                assert n.snapshot is s, "eviction dropped a locked snapshot"
        check_prefix_closed(index)
    for node, _, _ in locked:
        index.unlock(node)
    for n in snap_locked:
        n.snapshot.lock -= 1
    index.reset()
    check_prefix_closed(index)
    assert index.pages.num_free == index.pages.capacity


# ----------------------------------------------------------------------------- flop-aware
def test_flop_aware_registry_and_weight():
    assert isinstance(get_eviction("flop-aware"), FlopAware)
    assert get_eviction("flop-aware:0.2").recency_weight == 0.2
    for bad in ("flop-aware:2", "flop-aware:x"):
        with pytest.raises(ValueError, match="recency weight"):
            get_eviction(bad)


def test_flop_aware_keeps_the_deep_expensive_path_over_a_newer_cheap_one():
    # Pure efficiency (weight 0): a long history saves quadratically more attention FLOPs per page.
    index = make_index("flop-aware:0", pages=40)
    index.eviction.costs = ReuseCosts(flops_per_token=1.0, flops_per_pair=1.0)
    deep = put(index, tuple(range(100, 124)), "a", now=0.0)  # 12 pages, older
    put(index, tuple(range(500, 512)), "b", now=5.0)  # 6 pages, newer
    assert index.evict_pages(6) >= 6
    assert cached_len(index, tuple(range(100, 124)), "a") == 24 and deep.depth == 24
    assert cached_len(index, tuple(range(500, 512)), "b") == 0


def test_flop_aware_recency_only_is_lru_order():
    index = make_index("flop-aware:1", pages=40)
    put(index, tuple(range(100, 124)), "a", now=0.0)
    put(index, tuple(range(500, 512)), "b", now=5.0)
    index.evict_pages(6)
    assert cached_len(index, tuple(range(100, 124)), "a") < 24
    assert cached_len(index, tuple(range(500, 512)), "b") == 12


def test_flop_aware_drops_dead_hybrid_kv_first():
    # A hybrid leaf with no snapshot in it cannot be resumed from: it goes before any useful path.
    index = make_index("flop-aware", pages=40, slots=4)
    put(index, tuple(range(100, 112)), "a", now=0.0, snapshot=True)  # old, resumable
    put(index, tuple(range(300, 312)), "b", now=9.0, snapshot=False)  # new, dead
    index.evict_pages(6)
    assert cached_len(index, tuple(range(300, 312)), "b") == 0
    assert cached_len(index, tuple(range(100, 112)), "a") == 12


def test_flop_aware_snapshot_superseded_below_goes_first():
    index = make_index("flop-aware:0", pages=40, slots=4)
    toks = tuple(range(100, 120))
    put(index, toks[:8], "a", now=0.0, snapshot=True)  # turn 1 end, superseded by turn 2's
    put(index, toks, "a", now=1.0, snapshot=True)  # turn 2 end
    other = put(index, tuple(range(700, 708)), "b", now=2.0, snapshot=True)
    assert index.evict_snapshots(1) == 1
    shallow = index.node_at(index.match(chain_hashes("a", toks[:8], BS)))
    assert shallow.snapshot is None and other.snapshot is not None


@pytest.mark.parametrize("policy", ["flop-aware", "flop-aware:0"])
def test_flop_aware_ties_go_in_insertion_order_not_by_address(policy):
    # 40 leaves of one page each, equal in value and age: ties are broken by the order the tree
    # received them (the same in every process), never by where the nodes happen to sit in memory
    # (a set of nodes iterates by address; with it, this order came out shuffled).
    index = make_index(policy, pages=40)
    docs = [(1000 + i, 7) for i in range(40)]
    for d in docs:
        put(index, d, "ns", now=1.0)
    order = []
    for _ in range(40):
        assert index.evict_pages(1) == 1
        order += [i for i, d in enumerate(docs) if i not in order and cached_len(index, d, "ns") == 0]
    assert order == list(range(40))


# ----------------------------------------------------------------------------- the kept rotation
def _ring_lap(view, cursor) -> list:
    """`RoundRobinTail._ring`'s lap: the leaves sorted by (key, leaf order), from just after the
    cursor key (its ties last), once around."""
    ring = sorted((k, view.leaf_order(leaf), leaf) for leaf, k in view.keys.items())
    if cursor is None:
        return [leaf for _, _, leaf in ring]
    cut = sum(1 for k, _, _ in ring if k <= cursor)
    return [leaf for _, _, leaf in ring[cut:] + ring[:cut]]


@settings(max_examples=60, deadline=None)
@given(n_keys=st.integers(1, 4), steps=st.lists(st.tuples(st.integers(1, 3), st.integers(0, 3),
                                                           st.integers(0, 2), st.integers(0, 2)),
                                                 min_size=1, max_size=40))
def test_kept_rotation_laps_as_the_sorted_ring_with_tied_keys(n_keys, steps):
    """Many leaves under few keys (sessions that open alike): every lap of `Rotation` visits what
    the sorted ring would, from just after the cursor key with its ties last, while laps cut, drop,
    re-key and add leaves."""
    from radixflow.cache.eviction import Rotation

    keys = {leaf: ("", leaf % n_keys) for leaf in range(12)}
    view, rot, cursor, nxt = KeptOrderView(keys), Rotation(), None, 12
    rot.enter(view, list(keys), cursor)
    for take, drop, rekey, add in steps:
        want = _ring_lap(view, cursor)[:take]
        got = []
        for key, leaf in rot.lap(view):
            got.append(leaf)
            cursor = key
            if len(got) == take:
                break
        assert got == want
        for leaf in got[:drop]:   # cut whole: the leaf leaves the tree
            del keys[leaf]
            view.changed.append(leaf)
        for leaf in got[drop:drop + rekey]:   # its chain moved: a new key
            keys[leaf] = ("", (keys[leaf][1] + 1) % n_keys)
            view.changed.append(leaf)
        for leaf in got[drop + rekey:]:   # cut in place: a new leaf order
            view.orders[leaf] = nxt
            nxt += 1
            view.changed.append(leaf)
        for _ in range(add):
            keys[nxt] = ("", nxt % n_keys)
            view.changed.append(nxt)
            nxt += 1
        rot.close_lap(view, cursor)
        if not keys:
            break
    assert [leaf for _, leaf in rot.order(view)] == _ring_lap(view, cursor)


def test_kept_rotation_does_not_move_a_tie_group_at_every_lap(monkeypatch):
    """Every leaf under one key: a lap that cuts a leaf in place (a new leaf order) and stays on that
    key moves no other entry (pushes: the visited entry and the re-entered cut leaf), where splitting
    at the key moved the whole group at every lap."""
    import heapq

    from radixflow.cache.eviction import Rotation
    from radixflow.cache.eviction import kept as eviction

    keys = {leaf: ("", 0) for leaf in range(200)}
    view, rot = KeptOrderView(keys), Rotation()
    rot.enter(view, list(keys), None)
    key, leaf = next(rot.lap(view))
    view.orders[leaf] = 999
    view.changed.append(leaf)
    rot.close_lap(view, key)   # the cursor reaches the key: the group moves once
    pushes = []

    class Counting:
        heapify = staticmethod(heapq.heapify)
        heappop = staticmethod(heapq.heappop)

        @staticmethod
        def heappush(heap, e):
            pushes.append(e)
            heapq.heappush(heap, e)

    monkeypatch.setattr(eviction, "heapq", Counting)
    order = []
    for i in range(50):
        key, leaf = next(rot.lap(view))
        order.append(leaf)
        view.orders[leaf] = 1000 + i
        view.changed.append(leaf)
        rot.close_lap(view, key)
    assert order == list(range(1, 51))   # the ties in leaf order, each cut one to the end
    assert len(pushes) == 2 * 50
