"""Scheduler time per round against waiting-queue length (100 … 10,000 branches).

Every branch waits at t=0 in groups of four sharing a document, so after the first producers are
placed the rest of each group is Blocked: prefix-stop stops at the first, state-ready traversal
walks the whole queue (its worst case). Prints ms per schedule() call for both rules.
"""

from __future__ import annotations

import argparse
import time

from radixflow.config import SchedulerConfig
from radixflow.core.batch import ExecResult, Sample
from radixflow.core.branch import Branch
from radixflow.core.policies import get_arm
from radixflow.core.scheduler import Scheduler
from radixflow.workloads.trace import Segment, tokens_of


def make_queue(n: int, doc_len: int, group: int) -> list[Branch]:
    out = []
    for i in range(n):
        g = i // group
        toks = tokens_of([Segment(f"doc{g}", doc_len), Segment(f"b{i}", 16)])
        out.append(Branch(f"q{g}", i % group, toks, namespace="bench"))
    return out


def time_rounds(n: int, arm: str, rounds: int, doc_len: int, group: int) -> float:
    cfg = SchedulerConfig(max_num_seqs=1 << 20, max_num_batched_tokens=1 << 30, block_size=16,
                          state_interval=512, num_kv_pages=1 << 22, num_state_slots=1 << 20)
    s = Scheduler(cfg, get_arm(arm), hybrid=True)
    for b in make_queue(n, doc_len, group):
        s.add(b)
    s.admit(1.0)  # past every admission deadline: all branches wait
    # Keep the queue long: rows are capped so each round places few branches and scans the rest.
    s.config.max_num_seqs = 8
    total = 0.0
    for r in range(rounds):
        t0 = time.perf_counter()
        batch = s.schedule(1.0 + r)
        total += time.perf_counter() - t0
        s.complete(batch, ExecResult(0.01, {i: Sample(1) for i, f in enumerate(batch.fragments) if f.samples}),
                   1.0 + r + 0.01)
    return 1e3 * total / rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 3000, 10000])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--doc-len", type=int, default=1024)
    args = ap.parse_args()
    for group, what in ((4, "groups of 4 (the QA shape)"), (0, "one shared document: every consumer Blocked")):
        print(f"\n{what}")
        print(f"{'waiting':>8} {'prefix-stop ms/round':>22} {'state-ready ms/round':>22} {'ratio':>7}")
        for n in args.sizes:
            g = group or n
            ps = time_rounds(n, "radix", args.rounds, args.doc_len, g)
            sr = time_rounds(n, "radixflow", args.rounds, args.doc_len, g)
            print(f"{n:>8} {ps:>22.2f} {sr:>22.2f} {sr / ps:>7.1f}")


if __name__ == "__main__":
    main()
