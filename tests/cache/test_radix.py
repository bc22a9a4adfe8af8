import pytest

from radixflow.cache.pool import IdPool
from radixflow.cache.radix import RadixIndex, chain_hashes


def _index(pages=64, slots=8, bs=4):
    return RadixIndex(bs, IdPool(pages, "page"), IdPool(slots, "slot"))


def _insert(idx, ns, tokens, now=0.0):
    h = chain_hashes(ns, tokens, idx.block_size)
    n = len(tokens) // idx.block_size
    pages = idx.pages.allocate(n)
    node, adopted = idx.insert(ns, tokens, h, pages, n, now)
    idx.pages.free(pages[:adopted])  # duplicates stay with the caller; give them back
    return node, h


def test_match_is_page_granular_and_namespaced():
    idx = _index()
    toks = tuple(range(10))
    _insert(idx, "a", toks)
    idx.publish()
    assert idx.match(chain_hashes("a", toks, 4)).depth == 8
    assert idx.match(chain_hashes("a", toks[:7], 4)).depth == 4
    assert idx.match(chain_hashes("b", toks, 4)).depth == 0
    idx.check_integrity()


def test_divergent_insert_splits_node_and_shares_prefix_pages():
    idx = _index()
    a = tuple(range(16))
    b = a[:8] + (99,) * 8
    na, _ = _insert(idx, "ns", a)
    nb, hb = _insert(idx, "ns", b)
    idx.publish()
    assert nb.parent is na.parent and nb.parent.depth == 8
    assert idx.num_cached_pages == 6
    assert idx.match(hb).depth == 16
    idx.check_integrity()


def test_snapshot_is_pending_until_publish_then_ready():
    idx = _index()
    toks = tuple(range(16))
    node, h = _insert(idx, "ns", toks)
    idx.lock(node)
    slot = idx.slots.allocate_one()
    snap = idx.attach_snapshot(idx.node_at(idx.match(h, 2)), slot, producer=7, now=0.0)
    bd = idx.boundary(idx.match(h))
    assert bd.blocking is snap and bd.ready == 0
    idx.publish()
    bd = idx.boundary(idx.match(h))
    assert bd.blocking is None and bd.ready == 8 and bd.ready_snapshot is snap
    idx.unlock(node)
    idx.check_integrity()


def test_lru_eviction_skips_locked_paths_and_drops_snapshots_with_their_kv():
    idx = _index(pages=8)
    n1, h1 = _insert(idx, "ns", tuple(range(16)), now=1.0)
    n2, h2 = _insert(idx, "ns", tuple(range(100, 116)), now=2.0)
    idx.publish()
    s = idx.slots.allocate_one()
    idx.attach_snapshot(n2, s, None, 2.0)
    idx.lock(n1)
    freed = idx.evict_pages(1)
    assert freed == 4 and idx.match(h2).depth == 0 and idx.match(h1).depth == 16
    assert idx.num_snapshots == 0 and idx.slots.num_free == 8
    idx.unlock(n1)
    idx.check_integrity()


def test_snapshot_eviction_keeps_kv():
    idx = _index()
    node, h = _insert(idx, "ns", tuple(range(8)))
    idx.publish()
    idx.attach_snapshot(node, idx.slots.allocate_one(), None, 0.0)
    assert idx.evict_snapshots(1) == 1
    assert idx.match(h).depth == 8 and idx.boundary(idx.match(h)).ready == 0
    idx.check_integrity()


def test_pool_rejects_double_free_and_over_allocation():
    pool = IdPool(2, "page")
    ids = pool.allocate(2)
    with pytest.raises(MemoryError):
        pool.allocate(1)
    pool.free(ids)
    with pytest.raises(AssertionError):
        pool.free(ids[:1])


def test_a_chain_hash_collision_is_caught_by_the_token_check():
    from factories import small_config
    from radixflow.core.batch import ExecResult, Sample
    from radixflow.core.branch import Branch
    from radixflow.core.policies import get_arm
    from radixflow.core.scheduler import Scheduler

    s = Scheduler(small_config(), get_arm("radix"), hybrid=False)

    def run(b):
        s.add(b)
        s.admit(1.0)
        batch = s.schedule(1.0)
        s.complete(batch, ExecResult(0.01, {i: Sample(0) for i, f in enumerate(batch.fragments) if f.samples}), 1.0)
        s.check_integrity()

    a = Branch("a", 0, tuple(range(40)), namespace="n")
    run(a)
    forged = Branch("b", 0, tuple(range(100, 140)), namespace="n")
    s.add(forged)
    forged.sched.hashes = list(a.sched.hashes)  # pretend every page hash collides with a's
    s.admit(1.0)
    batch = s.schedule(1.0)
    assert [f.start for f in batch.fragments] == [0], "a colliding prefix must not be reused"
    assert forged.cached_tokens == 0 and forged.sched.no_cache
    s.complete(batch, ExecResult(0.01, {0: Sample(0)}), 1.0)
    s.check_integrity()
    assert s.holds_nothing()


def test_tokens_match_skips_only_what_is_known_equal():
    idx = _index(bs=4)
    a = tuple(range(16))
    _insert(idx, "n", a)
    m = idx.match(chain_hashes("n", a, 4))
    other = tuple(range(100, 116))
    assert not idx.tokens_match(m, other)  # the key came from no named origin: compared
    node = m.node
    node.origin = a
    assert idx.tokens_match(m, a)  # cut from these very tokens
    assert idx.tokens_match(m, other, kin=a, kin_len=16)  # the caller vouches other == a on 16 tokens
    assert not idx.tokens_match(m, other, kin=a, kin_len=12)  # the node runs past what is vouched for
    assert not idx.tokens_match(m, other, kin=a[:8] + a[8:], kin_len=16)  # an equal tuple is not the origin


def test_a_collision_past_the_shared_document_is_caught_for_a_sibling():
    """Siblings compared on arrival skip the guard only on the pages they were seen to share."""
    from factories import small_config
    from radixflow.core.batch import ExecResult, Sample
    from radixflow.core.branch import Branch
    from radixflow.core.policies import get_arm
    from radixflow.core.scheduler import Scheduler

    s = Scheduler(small_config(max_num_seqs=1), get_arm("radix"), hybrid=False)
    doc = tuple(range(8))
    a = Branch("a", 0, doc + tuple(range(50, 82)), namespace="n")
    b = Branch("b", 0, doc + tuple(range(200, 232)), namespace="n")  # shares 2 pages with a
    c = Branch("c", 0, doc + tuple(range(50, 82)), namespace="n")  # a's twin: equal on all pages
    for x in (a, b, c):
        s.add(x)
    assert b.sched.kin is a.prompt and b.sched.kin_len == 8
    b.sched.hashes = list(a.sched.hashes)  # forge: every page of b collides with a's
    s.admit(1.0)
    for _ in range(3):
        batch = s.schedule(1.0)
        s.complete(batch, ExecResult(0.01, {i: Sample(0) for i, f in enumerate(batch.fragments) if f.samples}),
                   1.0)
        s.check_integrity()
    assert b.cached_tokens == 0 and b.sched.no_cache, "a colliding page past the shared ones must not be reused"
    assert c.cached_tokens == 36 and not c.sched.no_cache
    assert s.holds_nothing()
