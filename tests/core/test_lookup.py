"""Cheap lookups: hashes on arrival reuse a shared prefix exactly; Blocked groups decide as lookups would."""

import copy
from unittest import mock

from factories import make_branches, small_config, wait_config
from radixflow.cache.radix import chain_hashes
from radixflow.core.batch import ExecResult, Sample
from radixflow.core.lookup import BlockedGroups, common_pages
from radixflow.core.policies import get_arm
from radixflow.core.readiness import Readiness
from radixflow.core.scheduler import Scheduler


def test_common_pages():
    a = tuple(range(40))
    assert common_pages(a, a, 8, 99) == 5
    assert common_pages(a, a[:20] + (-1,) * 20, 8, 99) == 2
    assert common_pages(a, a, 8, 3) == 3
    assert common_pages(a, (-1,) + a[1:], 8, 99) == 0


def test_arrival_hashes_equal_a_fresh_hash_chain():
    """Reused from the tree or from the previous sibling, every branch's hashes are its own chain."""
    s = Scheduler(small_config(block_size=4, state_interval=16), get_arm("radixflow"), hybrid=True)
    first = make_branches(2, doc_len=50, same_doc=True)
    later = make_branches(3, doc_len=50, same_doc=True, seed=1)
    for b in first:
        s.add(b)
    s.admit(1.0)
    batch = s.schedule(1.0)
    s.complete(batch, ExecResult(0.01, {i: Sample(1) for i, f in enumerate(batch.fragments) if f.samples}), 1.0)
    for b in later:  # the document is now in the tree
        s.add(b)
    for b in first + later:
        assert b.sched.hashes == chain_hashes(b.namespace, b.prompt, 4)
    assert any(b.sched.verified >= 48 for b in later), "the tree walk verified the shared document"


def _fan(n: int):
    """n branches on one 256-token document; the wait path (--handoff off): the rest are Blocked on the first."""
    cfg = wait_config(max_num_seqs=8, block_size=16, state_interval=64, max_num_batched_tokens=1 << 16)
    s = Scheduler(cfg, get_arm("radixflow"), hybrid=True)
    for b in make_branches(n // 4, doc_len=256, same_doc=True):
        s.add(b)
    s.admit(1.0)
    return s


def test_a_blocked_fan_costs_one_lookup_and_decides_as_lookups_would():
    s = _fan(200)
    full = copy.deepcopy(s)
    calls = {"match": 0}
    real = Readiness.match

    def counting(self, b):
        calls["match"] += 1
        return real(self, b)

    with mock.patch.object(Readiness, "match", counting):
        batch = s.schedule(1.0)
    with mock.patch.object(BlockedGroups, "find", lambda self, b: None):
        batch_full = full.schedule(1.0)
    assert batch.deferred == batch_full.deferred == 199
    assert [f.branch.uid for f in batch.fragments] == [f.branch.uid for f in batch_full.fragments]
    assert calls["match"] <= 3, f"{calls['match']} prefix lookups for one Blocked group"
    s.check_integrity()


def test_probe_needs_the_next_page_hash():
    """A branch whose hashes stop short of its tokens (a preempted branch's outputs) is not probed."""
    from types import SimpleNamespace

    from radixflow.core.branch import Branch

    s = _fan(8)
    groups = BlockedGroups(s.index)
    b = Branch("x", 0, tuple(range(64)))
    b.output = [1] * 40  # 104 tokens: 6 pages can be matched, 4 are hashed
    tr = SimpleNamespace(group_key=None, next_hash=None, no_cache=False, hashes=[11, 12, 13, 14])
    b.sched = tr
    groups.add(14, 4, object())
    assert groups.find(b) is None
    tr.hashes = [11, 12, 13, 14, 99]
    assert groups.find(b) is not None and tr.group_key == 14 and tr.next_hash == 99
