"""The never-loses sweep (issue 10, SPEC §12): `radixflow` against `radix` through the simulator on
small traces where a deferred branch could lose its claim — decode-heavy questions, KV-tight pools with
preemption, priority order, staggered Poisson arrivals, documents longer than T and the paper's 1-token
burst. Shared by `benchmarks/sim_sweep.py` (every config) and `tests/sim/test_sweep.py` (a handful).

Each config reports rounds, prefix-hit tokens (cached tokens at first selection) and the last finish
time for both arms; `check()` names every bound a config breaks: radixflow rounds <= radix x 1.02,
hits >= radix x 0.98, last finish <= radix x 1.05.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from radixflow.config import SchedulerConfig
from radixflow.core.branch import Branch
from radixflow.core.policies import get_arm
from radixflow.sim.cost_model import get_gpu
from radixflow.sim.runner import SimSetup, run_arm
from radixflow.spec import get_spec
from radixflow.workloads.trace import Segment, tokens_of

BOUNDS = {"rounds": 1.02, "hits": 0.98, "finish": 1.05}


@dataclass(frozen=True)
class SweepConfig:
    name: str
    seed: int = 0
    questions: int = 6
    branches: int = 4
    doc_len: tuple[int, int] = (150, 330)
    output_len: tuple[int, int] = (20, 60)
    rate: float = 0.0  # Poisson questions per second; 0 = all arrive at t = 0
    priorities: int = 1  # > 1: each question draws a priority in [0, priorities)
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 512
    num_kv_pages: int = 400
    block_size: int = 16
    state_interval: int = 64
    snapshot_mode: str = "every-boundary"


def workload(c: SweepConfig) -> list[Branch]:
    """Questions of `branches` branches: document + question + candidate, `output_len` tokens each."""
    rng = random.Random(c.seed)
    out, t = [], 0.0
    for q in range(c.questions):
        if c.rate > 0:
            t += rng.expovariate(c.rate)
        doc = Segment(f"{c.name}:{c.seed}:doc{q}", rng.randint(*c.doc_len))
        ask = Segment(f"{c.name}:{c.seed}:q{q}", rng.randint(8, 20))
        prio = rng.randrange(c.priorities)
        for i in range(c.branches):
            toks = tokens_of([doc, ask, Segment(f"{c.name}:{c.seed}:q{q}c{i}", rng.randint(2, 12))])
            out.append(Branch(f"q{q}", i, toks, namespace="sweep", arrival=t,
                              max_new_tokens=rng.randint(*c.output_len), priority=prio))
    return out


def configs() -> list[SweepConfig]:
    """The whole sweep: 30 configs."""
    out = []
    for pages in (80, 120, 200, 400):  # decode-heavy; 80 and 120 pages preempt
        for seed in (0, 1):
            out.append(SweepConfig(f"decode-kv{pages}", seed, num_kv_pages=pages))
    for pages in (80, 100):  # KV-tight, vLLM-like state caching at chunk ends
        for seed in (2, 3):
            out.append(SweepConfig(f"tight-chunkend-kv{pages}", seed, num_kv_pages=pages, snapshot_mode="chunk-end"))
    for pages in (100, 400):
        for seed in (0, 1):
            out.append(SweepConfig(f"priority-kv{pages}", seed, num_kv_pages=pages, priorities=3))
    for rate in (5.0, 20.0):
        for seed in (0, 1):
            out.append(SweepConfig(f"poisson{rate:g}", seed, rate=rate, questions=12, num_kv_pages=200))
    for pages in (160, 400):
        for seed in (0, 1):
            out.append(SweepConfig(f"long-doc-kv{pages}", seed, doc_len=(600, 1500), num_kv_pages=pages))
    for seed in (0, 1):  # the paper's shape: RACE-M articles, 1-token candidates, one burst
        out.append(SweepConfig("burst-1tok", seed, questions=64, doc_len=(250, 350), output_len=(1, 1),
                               max_num_seqs=16, max_num_batched_tokens=8192, num_kv_pages=4096))
    for seed in (0, 1):
        out.append(SweepConfig("burst-1tok-s8", seed, questions=64, doc_len=(250, 350), output_len=(1, 1),
                               num_kv_pages=400))
    out.append(SweepConfig("decode-interval16", 4, state_interval=16, num_kv_pages=120))
    out.append(SweepConfig("decode-interval16", 5, state_interval=16, num_kv_pages=400))
    return out


@dataclass
class ArmResult:
    rounds: int
    hits: int
    finish: float
    preemptions: int
    deferrals: int


def run_config(c: SweepConfig, model: str = "qwen3.5-0.8b", gpu: str = "a800",
               check: bool = False, handoff: str = "off") -> dict[str, ArmResult]:
    """Both arms on the config's trace (fresh cache each); `check`: check_integrity() every round.
    `handoff` (SPEC §15) for both arms: `off` by default, since the claim under test is the wait path's
    (a deferred branch, SPEC §12); `auto` checks the same bounds with dependents."""
    cfg = SchedulerConfig(max_num_seqs=c.max_num_seqs, max_num_batched_tokens=c.max_num_batched_tokens,
                          block_size=c.block_size, state_interval=c.state_interval, snapshot_mode=c.snapshot_mode,
                          num_kv_pages=c.num_kv_pages, num_state_slots=4096, handoff=handoff)
    setup = SimSetup(get_spec(model), get_gpu(gpu), cfg, size_pools=False, check=check)
    trace = workload(c)
    out = {}
    for arm in ("radix", "radixflow"):
        m, runs = run_arm(setup, get_arm(arm), [trace])
        s = runs[0].scheduler
        out[arm] = ArmResult(m.rounds, m.cached_tokens, runs[0].makespan, s.preemptions, s.blocked_total)
    return out


def check(res: dict[str, ArmResult]) -> list[str]:
    """The bounds a config breaks (empty: it keeps all three)."""
    base, arm = res["radix"], res["radixflow"]
    bad = []
    if arm.rounds > base.rounds * BOUNDS["rounds"]:
        bad.append(f"rounds {arm.rounds} > {base.rounds} x {BOUNDS['rounds']}")
    if arm.hits < base.hits * BOUNDS["hits"]:
        bad.append(f"prefix-hit tokens {arm.hits} < {base.hits} x {BOUNDS['hits']}")
    if arm.finish > base.finish * BOUNDS["finish"]:
        bad.append(f"last finish {arm.finish:.3f}s > {base.finish:.3f}s x {BOUNDS['finish']}")
    return bad
