"""The across-step sweep of SPEC §12: configurations, their requests, and one run through vLLM's scheduler.

Each `SweepConfig` is a small multi-candidate workload (questions of `branches` branches sharing a
document, each branch with its own tail) with budgets, a pool size, an arrival pattern, a scheduling
policy and sync or async scheduling. `sweep_requests()` turns a config into requests without vLLM, so
another scheduler (radixflow's own simulator) can replay the very same requests; `run_config()`
replays them through vLLM 0.33's scheduler on CPU, native or with the plugin, and returns the three
figures the claim rule must not worsen: steps, prefix-hit tokens and the step of the last finish.

Time is counted in steps: a request arrives before the `schedule()` call whose index reaches its
`arrival_step`; an idle scheduler jumps to the next arrival (idle calls are not steps).

`spec_configs()` adds speculative decoding (vLLM's `--speculative-config` method and N): the harness
proposes N drafts per decoding request per step and accepts a seeded 0..N of them, the same draws in
both arms (`cpu_harness.Acceptance`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class SweepConfig:
    """One workload and scheduler shape (vLLM flag names for the budgets)."""

    name: str
    questions: int = 6
    branches: int = 4
    doc_len: tuple[int, int] = (150, 330)  # tokens, inclusive range
    tail_len: tuple[int, int] = (8, 40)
    output_len: tuple[int, int] = (20, 60)  # max_tokens per branch
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 512
    num_gpu_blocks: int = 400
    block_size: int = 16
    arrival: str = "burst"  # "burst" (all at step 0) or "poisson"
    mean_gap_steps: float = 2.0  # poisson: mean steps between questions (branches arrive together)
    policy: str = "fcfs"  # or "priority": each question gets a random priority in 0..2
    async_scheduling: bool = False
    prefill_schedule_interval: int = 1
    long_prefill_token_threshold: int = 0
    watermark: float = 0.0
    seed: int = 0
    spec_method: str = ""  # speculative decoding: "ngram" or "eagle" ("" = off)
    spec_tokens: int = 0  # num_speculative_tokens (N)


@dataclass(frozen=True)
class SweepRequest:
    """One branch as a vLLM request: id, prompt, output length, arrival step, priority."""

    request_id: str
    tokens: tuple[int, ...]
    max_tokens: int
    arrival_step: int
    priority: int


@dataclass(frozen=True)
class SweepResult:
    steps: int  # non-empty schedule() calls
    hit_tokens: int  # prefix-hit tokens at each request's first admission
    last_finish_step: int  # step index (from 1) at which the last request was seen finished
    preemptions: int
    deferrals: int


def sweep_requests(config: SweepConfig) -> list[SweepRequest]:
    """The config's requests in queue order (arrival, question, branch); deterministic in `seed`."""
    rng = random.Random(config.seed)
    requests, step = [], 0.0
    for q in range(config.questions):
        if config.arrival == "poisson" and q:
            step += rng.expovariate(1.0 / config.mean_gap_steps)
        doc = tuple(rng.randrange(2, 30000) for _ in range(rng.randint(*config.doc_len)))
        priority = rng.randint(0, 2) if config.policy == "priority" else 0
        for b in range(config.branches):
            tail = tuple(rng.randrange(2, 30000) for _ in range(rng.randint(*config.tail_len)))
            requests.append(SweepRequest(f"q{q}b{b}", doc + tail, rng.randint(*config.output_len),
                                         int(step), priority))
    return requests


def run_config(config: SweepConfig, plugin: bool, max_steps: int = 20_000) -> SweepResult:
    """Replay the config's requests through vLLM's scheduler (native or plugin) to completion."""
    from radixflow.integrations.vllm import cpu_harness as harness

    pending = sweep_requests(config)
    longest = max(len(r.tokens) + r.max_tokens for r in pending)
    setup = harness.SchedulerSetup(
        max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
        block_size=config.block_size, num_gpu_blocks=config.num_gpu_blocks,
        max_model_len=max(2048, longest), plugin=plugin, async_scheduling=config.async_scheduling,
        policy=config.policy, prefill_schedule_interval=config.prefill_schedule_interval,
        long_prefill_token_threshold=config.long_prefill_token_threshold, watermark=config.watermark,
        spec_method=config.spec_method, num_spec_tokens=config.spec_tokens, spec_seed=config.seed,
    )
    scheduler = harness.build_scheduler(setup)
    hash_lookahead = harness.hash_lookahead_tokens(scheduler)
    driver = harness.InFlightDriver(scheduler, depth=2 if config.async_scheduling else 1)
    added = {}
    steps = hits = preemptions = 0
    last_finish = clock = nxt = 0
    for _ in range(max_steps):
        if nxt == len(pending) and not driver.busy:
            break
        if not driver.busy and pending[nxt].arrival_step > clock:
            clock = pending[nxt].arrival_step
        while nxt < len(pending) and pending[nxt].arrival_step <= clock:
            r = pending[nxt]
            request = harness.make_request(r.request_id, r.tokens, config.block_size, max_tokens=r.max_tokens,
                                           arrival=float(r.arrival_step) + nxt * 1e-6, priority=r.priority,
                                           hash_lookahead=hash_lookahead)
            scheduler.add_request(request)
            added[r.request_id] = request
            nxt += 1
        record = driver.step()
        clock += 1
        if record is not None and record.rows:
            steps += 1
            hits += sum(record.new_hits.values())
        finished = [rid for rid, request in added.items() if request.is_finished()]
        for rid in finished:
            preemptions += added.pop(rid).num_preemptions
        if finished:
            last_finish = clock
    else:
        raise RuntimeError(f"{config.name}: not finished within {max_steps} steps")
    if harness.count_free_blocks(scheduler) != harness.usable_blocks(scheduler):
        raise AssertionError(f"{config.name}: blocks leaked")
    return SweepResult(steps, hits, last_finish, preemptions, getattr(scheduler, "num_blocked_deferrals", 0))


def sweep_configs() -> list[SweepConfig]:
    """The 30 configurations of the issue-10 sweep and issue 19's threshold and watermark runs, and issue
    44's tight pool, sync and async, at two seeds (see docs/vllm.md for what each family probes)."""
    configs = []
    # Decode-heavy: 6 four-branch questions, documents 150-330, 20-60 output tokens, S=8, T=512.
    for blocks in (80, 120, 200, 400):
        for seed in (0, 1):
            configs.append(SweepConfig(f"decode-kv{blocks}-s{seed}", num_gpu_blocks=blocks, seed=seed))
    # KV-tight with preemption: pools near one question's working set.
    for blocks, seed in ((48, 0), (56, 1), (64, 2), (72, 3)):
        configs.append(SweepConfig(f"kvtight-kv{blocks}-s{seed}", num_gpu_blocks=blocks, seed=seed))
    # Priority policy.
    for blocks, seed in ((120, 0), (400, 1), (80, 2)):
        configs.append(SweepConfig(f"priority-kv{blocks}-s{seed}", policy="priority", num_gpu_blocks=blocks,
                                   seed=seed))
    # Staggered Poisson arrivals.
    for gap, seed in ((1.0, 0), (3.0, 1), (6.0, 2)):
        configs.append(SweepConfig(f"poisson-gap{gap:g}-s{seed}", arrival="poisson", mean_gap_steps=gap,
                                   questions=10, seed=seed))
    # Documents longer than T (several chunks per document).
    for t, seed in ((256, 0), (384, 1), (512, 2)):
        configs.append(SweepConfig(f"longdoc-T{t}-s{seed}", doc_len=(600, 1100), max_num_batched_tokens=t,
                                   num_gpu_blocks=800, output_len=(1, 20), seed=seed))
    # The async scheduler (two steps in flight, as vLLM's engine runs it).
    for blocks, seed in ((120, 0), (400, 1), (64, 2)):
        configs.append(SweepConfig(f"async-kv{blocks}-s{seed}", async_scheduling=True, num_gpu_blocks=blocks,
                                   seed=seed))
    # Multi-candidate QA shape: one output token per branch, a wider batch.
    for s, seed in ((16, 0), (4, 1)):
        configs.append(SweepConfig(f"qa1tok-S{s}-s{seed}", output_len=(1, 1), max_num_seqs=s,
                                   max_num_batched_tokens=2048, questions=12, seed=seed))
    # Prefill cadence held to native behaviour.
    configs.append(SweepConfig("cadence4-s0", prefill_schedule_interval=4, seed=0))
    # vLLM's per-request chunk cap (--long-prefill-token-threshold) and its admission watermark.
    configs.append(SweepConfig("thresh64-s0", long_prefill_token_threshold=64, seed=0))
    configs.append(SweepConfig("thresh128-longdoc-s1", long_prefill_token_threshold=128, doc_len=(600, 1100),
                               num_gpu_blocks=800, output_len=(1, 20), seed=1))
    configs.append(SweepConfig("watermark5-kv120-s0", watermark=0.05, num_gpu_blocks=120, seed=0))
    # Issue 44's tight pool (more seeds: `tight_pool_configs`, `benchmarks/vllm_sweep.py --tight-pool-seeds`).
    configs += tight_pool_configs([0, 1])
    return configs


# Issue 44's tight-pool multi-candidate shape: 9 questions of 9 branches (81 requests), one output token
# each, S = 10, T = 1,024, a pool of 64 blocks of 16 (a question's document and its nine tails barely
# fit), vLLM's watermark at 0.02. Here freed prefixes are evicted within a step or two, so any change
# in when a request frees its blocks moves its siblings' hits.
TIGHT_POOL = SweepConfig("tightpool", questions=9, branches=9, output_len=(1, 1), max_num_seqs=10,
                         max_num_batched_tokens=1024, num_gpu_blocks=64, watermark=0.02)


def tight_pool_configs(seeds: list[int]) -> list[SweepConfig]:
    """The tight-pool shape for each seed, sync and async (named tightpool-sync-s<seed>, -async-)."""
    return [replace(TIGHT_POOL, name=f"tightpool-{'async' if a else 'sync'}-s{seed}", seed=seed, async_scheduling=a)
            for a in (False, True) for seed in seeds]


def spec_configs(spec_tokens: list[int]) -> list[SweepConfig]:
    """Speculative-decoding configs for each N: sync and async, each with the decode-heavy shape (ngram
    drafts, 120 blocks; EAGLE drafts with N lookahead slots, 80 blocks), a KV-tight pool with preemption
    (EAGLE, 64 blocks), a tight token budget where the drafts take a visible share of it (T = 64,
    documents 40-120, ngram) and the paper's multi-candidate QA shape (qa1tok, S = 16, EAGLE): 10 per N."""
    configs = []
    for n in spec_tokens:
        for async_scheduling in (False, True):
            mode = "async" if async_scheduling else "sync"
            common = dict(spec_tokens=n, async_scheduling=async_scheduling)
            configs += [
                SweepConfig(f"spec{n}-{mode}-ngram-decode-kv120", num_gpu_blocks=120, spec_method="ngram",
                            seed=0, **common),
                SweepConfig(f"spec{n}-{mode}-eagle-decode-kv80", num_gpu_blocks=80, spec_method="eagle", seed=1,
                            **common),
                SweepConfig(f"spec{n}-{mode}-eagle-kvtight-kv64", num_gpu_blocks=64, spec_method="eagle", seed=2,
                            **common),
                SweepConfig(f"spec{n}-{mode}-ngram-tightT64", max_num_batched_tokens=64, doc_len=(40, 120),
                            num_gpu_blocks=200, spec_method="ngram", seed=2, **common),
                SweepConfig(f"spec{n}-{mode}-eagle-qa1tok-S16", output_len=(1, 1), max_num_seqs=16,
                            max_num_batched_tokens=2048, questions=12, spec_method="eagle", seed=0, **common),
            ]
    return configs


def smoke_configs() -> list[SweepConfig]:
    """A handful of the sweep's configs, one per family, small enough for a test."""
    wanted = ("decode-kv80-s0", "kvtight-kv56-s1", "priority-kv80-s2", "priority-kv120-s0", "poisson-gap3-s1",
              "longdoc-T256-s0", "async-kv64-s2", "qa1tok-S16-s0", "cadence4-s0", "tightpool-sync-s0")
    by_name = {c.name: c for c in sweep_configs()}
    return [by_name[n] for n in wanted]


def with_seed(config: SweepConfig, seed: int) -> SweepConfig:
    return replace(config, seed=seed, name=f"{config.name}-seed{seed}")
