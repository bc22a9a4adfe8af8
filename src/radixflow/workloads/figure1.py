"""A fixed instance that reproduces the paper's Figure 1 numbers exactly (SPEC §11).

Four producer/consumer pairs and seven independent branches, all arriving at t=0, S=4, T=4,096:
P1 A1 P2 A2 P3 A3 P4 A4 I1 … I7 in native order. A_i shares P_i's 1,024-token prefix, so once P_i is
in the batch A_i is Blocked. Prefix-stop ends the scan at every A_i (6 rounds, 9 empty slots);
state-ready traversal defers them and fills rows with the next producers and independents (4 rounds,
1 empty slot) — the lower bound max(⌈12,970/4,096⌉, ⌈15/4⌉, D=2) = 4.
"""

from __future__ import annotations

FIGURE1_BUDGETS = {"max_num_seqs": 4, "max_num_batched_tokens": 4096}
PRODUCER_LEN = 1024
CONSUMER_TAILS = (200, 300, 400, 500)
INDEPENDENT_LENS = (1100, 1200, 1200, 100, 1291, 1291, 1292)


def figure1_records() -> list[dict]:
    recs = []

    def add(rid: str, segments: list[tuple[str, int]]) -> None:
        recs.append({"request_id": rid, "branch": 0, "arrival": 0.0, "namespace": f"fig1:{rid}",
                     "max_new_tokens": 1, "segments": [{"id": s, "len": n} for s, n in segments]})

    for i, tail in enumerate(CONSUMER_TAILS, 1):
        shared = (f"fig1:prefix{i}", PRODUCER_LEN)
        add(f"P{i}", [shared])
        add(f"A{i}", [shared, (f"fig1:tail{i}", tail)])
        recs[-1]["namespace"] = recs[-2]["namespace"]  # A_i shares P_i's cache namespace
    for i, n in enumerate(INDEPENDENT_LENS, 1):
        add(f"I{i}", [(f"fig1:indep{i}", n)])
    return recs
