"""Digest of every scheduling decision over seeded configs: refactors must leave it unchanged.

Runs N seeded configs (random small traces with multi-branch groups; hybrid and full-attention specs;
every arm; snapshot modes every-boundary / chunk-end / vllm-align, the latter with prefix-match-unit
and vLLM 0.29 variants; checkpoints boundary / branch and --checkpoint-wait; tight KV / slot pools, a
shared byte budget, every eviction policy, preemption) through the Scheduler and the simulator's
executor, checking integrity after every round, and hashes every fragment (branch, start, length, page
table, state in/out, copies, hand-off producer), each branch's misses by cause and the final tree.
Prints one digest per config group and the overall digest. A figure, never asserted.

    PYTHONPATH=src python benchmarks/decision_digest.py [--configs 400] [--handoff off] [--ids free]

`--ids free` hashes what the decisions are without which page or slot ids the pools handed out (a page
table's length, not its ids; whether a state comes from a slot, not which): it compares two codes whose
pools number their ids differently (stop 43 made `IdPool` hand out ascending runs, so every exact digest
moved while no decision did).

String hashing is fixed (PYTHONHASHSEED=0, re-executing itself) so two runs compare.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import sys
import time
from collections import defaultdict

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable, *sys.argv])

from radixflow.config import SchedulerConfig  # noqa: E402
from radixflow.core.branch import Branch  # noqa: E402
from radixflow.core.loop import run_trace  # noqa: E402
from radixflow.core.policies import ARMS  # noqa: E402
from radixflow.core.scheduler import Scheduler  # noqa: E402
from radixflow.sim.cost_model import GPUS, CostModel  # noqa: E402
from radixflow.sim.executor import SimExecutor  # noqa: E402
from radixflow.spec.model_spec import PRESETS  # noqa: E402
from radixflow.workloads.trace import Segment, tokens_of  # noqa: E402

STUCK: list[Scheduler] = []  # runs run_trace gave up on ("nothing schedulable")
COUNTS: dict[str, int] = defaultdict(int)  # what the configs exercised
EVICTIONS = ("lru", "rr-tail:2", "level-tail", "flop-aware")


def trace(rng: random.Random) -> list[Branch]:
    """Groups of 1-4 branches over a few documents, some arriving together, some later."""
    n_docs = rng.randint(1, 4)
    docs = [rng.randint(4, 120) for _ in range(n_docs)]
    out, t = [], 0.0
    for q in range(rng.randint(2, 10)):
        d = rng.randrange(n_docs)
        question = Segment(f"q{q}", rng.randint(0, 24))
        for i in range(rng.choice((1, 2, 3, 4, 4))):
            segs = [Segment(f"d{d}", docs[d]), question, Segment(f"a{q}.{i}", rng.randint(1, 20))]
            out.append(Branch(f"q{q}", i, tokens_of(segs, vocab=64), namespace=rng.choice("aab"), arrival=t,
                              max_new_tokens=rng.choice((1, 1, 2, 4)), priority=rng.choice((0, 0, 0, 1))))
            t += rng.choice((0.0, 0.0, 0.002))
        t += rng.choice((0.0, 0.001, 0.01, 0.05))
    return out


def config(rng: random.Random, hybrid: bool, handoff: str) -> tuple[str, SchedulerConfig]:
    mode = rng.choice(("every-boundary", "chunk-end", "vllm-align")) if hybrid else "every-boundary"
    kw: dict = dict(max_num_seqs=rng.randint(1, 6), block_size=4, state_interval=rng.choice((4, 8, 16)),
                    snapshot_mode=mode, eviction=rng.choice(EVICTIONS), handoff=handoff)
    variant = ""
    if mode == "vllm-align":
        kw["block_size"] = kw["state_interval"] = rng.choice((8, 16))
        kw["internal_checkpoint"] = rng.random() < 0.5
        v = rng.choice(("", "", "unit", "0.29", "0.29-all"))
        if v == "unit":
            kw["prefix_match_unit"] = 4
        elif v:
            kw["vllm_version"] = "0.29"
            kw["mamba_cache_mode"] = "all" if v == "0.29-all" else "align"
        variant = v
    kw["max_num_batched_tokens"] = rng.choice((1, 2, 4, 8)) * kw["state_interval"] * (2 if kw["block_size"] < 8 else 1)
    if hybrid:
        kw["checkpoints"] = rng.choice(("boundary", "branch"))
        if kw["checkpoints"] == "branch":
            kw["checkpoint_wait"] = rng.choice(("grid", "grid", "64", "8"))
    pool = rng.choice(("roomy", "tight", "tight", "bytes"))
    if pool == "tight":
        kw["num_kv_pages"] = rng.choice((48, 80, 160))
        kw["num_state_slots"] = rng.choice((6, 12, 40))
    elif pool == "bytes":
        kw["num_kv_pages"], kw["num_state_slots"] = 4096, 512
        kw["cache_memory_bytes"], kw["kv_page_bytes"], kw["state_slot_bytes"] = rng.choice((900, 2000)), 10, 40
    else:
        kw["num_kv_pages"], kw["num_state_slots"] = 4096, 512
    group = f"{'hybrid' if hybrid else 'full'}/{mode}{'+' + variant if variant else ''}/" \
            f"{kw.get('checkpoints', 'boundary')}/{pool}"
    return group, SchedulerConfig(**kw)


def _fragment(f, exact: bool) -> tuple:
    if exact:
        return (f.branch.uid, f.start, f.num_tokens, f.page_table, f.state_in, f.state_out,
                f.samples, f.first, f.copies_before, f.copies_after, f.after)
    return (f.branch.uid, f.start, f.num_tokens, len(f.page_table), f.state_in is None,
            [n for n, _ in f.state_out], f.samples, f.first, len(f.copies_before), len(f.copies_after), f.after)


def _node(n, exact: bool) -> tuple:
    snap = n.snapshot
    if exact:
        return (n.namespace, n.key, n.pages, n.lock_ref, n.pending,
                None if snap is None else (snap.slot, snap.depth, snap.published, snap.lock, snap.level),
                sorted((t.depth, t.slot, t.tail_page, t.lock) for t in n.tails))
    return (n.namespace, n.key, len(n.pages), n.lock_ref, n.pending,
            None if snap is None else (snap.depth, snap.published, snap.lock, snap.level),
            sorted((t.depth, t.tail_page is None, t.lock) for t in n.tails))


def digest_run(sched: Scheduler, executor, branches: list[Branch], exact: bool = True) -> str:
    h = hashlib.sha256()

    def on_round(s: Scheduler, batch) -> None:
        s.check_integrity()
        h.update(repr((batch.round, batch.deferred, batch.stop_reason)).encode())
        for f in batch.fragments:
            h.update(repr(_fragment(f, exact)).encode())

    try:
        res = run_trace(sched, executor, branches, on_round=on_round)
    except RuntimeError as e:  # a run the loop gives up on is a decision too (counted apart)
        if not str(e).startswith("stuck"):
            raise
        h.update(b"stuck")
        STUCK.append(sched)
        return h.hexdigest()
    COUNTS["rounds"] += len(sched.rounds)
    COUNTS["blocked"] += sched.blocked_total
    COUNTS["preemptions"] += sched.preemptions
    COUNTS["evicted pages"] += sched.index.evicted_pages
    COUNTS["evicted snapshots"] += sched.index.evicted_snapshots
    COUNTS["exact checkpoints"] += sched.exact_checkpoints
    COUNTS["hand-offs"] += sched.handoff_rows
    for b in sorted(res.branches, key=lambda b: b.uid):
        m = b.misses.to_dict() if b.misses is not None else None
        h.update(repr((b.uid, b.key, b.cached_tokens, b.identity_hit, b.num_preemptions, b.num_fragments,
                       b.output, m)).encode())
    h.update(repr((sched.preemptions, sched.blocked_total, sched.max_level, sched.exact_checkpoints,
                   round(res.makespan, 9))).encode())
    for n in sorted(sched.index._iter_nodes(), key=lambda n: (n.namespace, n.key)):
        h.update(repr(_node(n, exact)).encode())
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--handoff", default="off", help="the configs' --handoff (off: today's decisions)")
    ap.add_argument("--ids", choices=["exact", "free"], default="exact",
                    help="exact: the page and slot ids too; free: the decisions without which ids (see above)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every config's digest")
    args = ap.parse_args()
    arms = list(ARMS.values())
    specs = {True: PRESETS["qwen3.5-0.8b"], False: PRESETS["qwen3-8b"]}
    groups: dict[str, hashlib._Hash] = defaultdict(hashlib.sha256)
    overall = hashlib.sha256()
    t0 = time.perf_counter()
    for i in range(args.configs):
        rng = random.Random(args.seed * 1_000_003 + i)
        hybrid = i % 3 != 2
        group, cfg = config(rng, hybrid, args.handoff)
        arm = arms[i % len(arms)]
        spec = specs[hybrid]
        cost = CostModel(spec, GPUS["h100"], block_size=cfg.block_size)
        sched = Scheduler(cfg, arm, hybrid)
        try:
            d = digest_run(sched, SimExecutor(cost, 64), trace(rng), args.ids == "exact")
        except Exception as e:
            raise SystemExit(f"config {i} ({arm.name}, {group}, {cfg}): {e}") from e
        groups[group].update(d.encode())
        overall.update(d.encode())
        if args.verbose:
            print(f"{i:4d} {arm.name:15s} {group:40s} {d[:16]}")
    for g in sorted(groups):
        print(f"{g:48s} {groups[g].hexdigest()[:16]}")
    print("exercised: " + ", ".join(f"{k} {v}" for k, v in COUNTS.items()))
    if STUCK:
        print(f"{len(STUCK)} configs stuck (run_trace: nothing schedulable)")
    ids = "" if args.ids == "exact" else ", ids free"
    print(f"overall ({args.configs} configs, handoff {args.handoff}{ids}): {overall.hexdigest()}"
          f"  [{time.perf_counter() - t0:.1f} s]")


if __name__ == "__main__":
    main()
