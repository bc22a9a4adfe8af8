"""Replays a multi-candidate QA trace through vLLM 0.33's own scheduler, natively and with the plugin.

No model runs: a stand-in model output gives each request one sampled token once its prefill is done, so
what is measured is vLLM's scheduling alone (steps, rows per step, prefix reuse). Each question is four
branches of document + question + one candidate, each generating one token (SPEC §10). Needs vLLM
installed (`bash scripts/install_vllm.sh .venv/bin/python`).

    python benchmarks/vllm_replay.py [--questions 32] [--rate 0] [--dataset race-m] [--block-size 16]

vLLM prints CPU-platform notices (no Triton, no custom ops) on stderr; the table is on stdout.

`replay_vllm()` is the reusable part: one arm over one list of branches, returning a dict of measures;
`replay_radixflow()` runs the same trace through radixflow's own scheduler (prefix-stop and
state-ready traversal), so the table compares all four.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from radixflow.core.branch import Branch  # noqa: E402
from radixflow.workloads.qa import QUALITY, RACE_M, stream_records, synth_questions  # noqa: E402
from radixflow.workloads.trace import branch_from_record  # noqa: E402

DATASETS = {"race-m": RACE_M, "quality": QUALITY}


def replay_vllm(
    branches: list[Branch],
    plugin: bool,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    block_size: int,
    *,
    step_time_s: float = 0.053,
    num_gpu_blocks: int = 32768,
    max_steps: int = 100_000,
) -> dict:
    """Run every branch through one vLLM scheduler; return its measures.

    Branches are added in (arrival, request, branch) order once the replay clock reaches their arrival;
    each non-empty step advances the clock by `step_time_s` (the paper's ~53 ms worker call), an idle
    scheduler jumps to the next arrival. A branch's namespace becomes vLLM's `cache_salt`.
    """
    from radixflow.integrations.vllm import cpu_harness as harness

    longest = max(len(b.prompt) + b.max_new_tokens for b in branches)
    setup = harness.SchedulerSetup(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        max_model_len=max(16384, longest),
        hybrid=True,
        plugin=plugin,
    )
    scheduler = harness.build_scheduler(setup)
    pending = sorted(branches, key=lambda b: (b.arrival, b.request_id, b.index))
    requests = {}  # vLLM request id -> (Request, logical request id, arrival)
    finished_at: dict[str, float] = {}
    rows, tokens, hits = [], [], 0
    clock, nxt = 0.0, 0
    for _ in range(max_steps):
        if nxt == len(pending) and not scheduler.has_requests():
            break
        if not scheduler.has_requests() and pending[nxt].arrival > clock:
            clock = pending[nxt].arrival
        while nxt < len(pending) and pending[nxt].arrival <= clock:
            b = pending[nxt]
            rid = f"{b.request_id}/{b.index}"
            request = harness.make_request(
                rid, b.prompt, block_size, max_tokens=b.max_new_tokens, arrival=b.arrival, cache_salt=b.namespace
            )
            scheduler.add_request(request)
            requests[rid] = (request, b.request_id, b.arrival)
            nxt += 1
        record = harness.run_step(scheduler)
        if not record.rows:
            continue
        clock += step_time_s
        rows.append(record.rows)
        tokens.append(record.tokens)
        hits += sum(record.new_hits.values())
        for rid, (request, _, _) in requests.items():
            if rid not in finished_at and request.is_finished():
                finished_at[rid] = clock
    else:
        raise RuntimeError(f"replay did not finish within {max_steps} steps")

    latency: dict[str, float] = {}
    for rid, (_, logical, arrival) in requests.items():
        latency[logical] = max(latency.get(logical, 0.0), finished_at[rid] - arrival)
    prompt_tokens = sum(len(b.prompt) for b in branches)
    lat = sorted(latency.values())
    return {
        "arm": "vLLM+state-ready" if plugin else "vLLM native",
        "steps": len(rows),
        "rows_per_step": sum(rows) / len(rows),
        "tokens_per_step": sum(tokens) / len(tokens),
        "empty_row_slots": sum(max_num_seqs - r for r in rows),
        "reuse_pct": 100.0 * hits / prompt_tokens,
        "deferrals": getattr(scheduler, "num_blocked_deferrals", 0),
        "latency_mean_s": statistics.fmean(lat),
        "latency_p95_s": lat[min(len(lat) - 1, int(0.95 * len(lat)))],
        "leaked_blocks": harness.usable_blocks(scheduler) - harness.count_free_blocks(scheduler),
    }


class _FixedStep:
    """Stand-in executor for radixflow's own scheduler: every call costs the same as a vLLM replay step."""

    def __init__(self, step_time_s: float) -> None:
        self.step_time_s = step_time_s

    def execute(self, batch):
        from radixflow.core.batch import ExecResult, Sample

        return ExecResult(self.step_time_s, {i: Sample(1) for i, f in enumerate(batch.fragments) if f.samples})


def replay_radixflow(branches: list[Branch], state_ready: bool, max_num_seqs: int, max_num_batched_tokens: int,
                     block_size: int, *, snapshot_mode: str = "chunk-end", step_time_s: float = 0.053) -> dict:
    """The same trace through radixflow's scheduler with immediate admission (the plugin has no
    flexible admission), the state interval = vLLM's Mamba block, prefix-stop or state-ready, in both
    snapshot modes (`chunk-end` is how vLLM 0.33's align mode caches state)."""
    from radixflow.config import SchedulerConfig
    from radixflow.core.loop import run_trace
    from radixflow.core.metrics import measure
    from radixflow.core.policies import Arm, Immediate, PrefixStop, StateReady
    from radixflow.core.scheduler import Scheduler
    from radixflow.workloads.trace import fresh_copies

    arm = (Arm("state-ready", Immediate(), StateReady()) if state_ready
           else Arm("prefix-stop", Immediate(), PrefixStop()))
    cfg = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                          block_size=block_size, state_interval=block_size, num_kv_pages=32768,
                          num_state_slots=32768, snapshot_mode=snapshot_mode,
                          handoff="off")  # vLLM's scheduler cannot hand off: compared as it runs
    m = measure(arm.name, run_trace(Scheduler(cfg, arm, hybrid=True), _FixedStep(step_time_s), fresh_copies(branches)))
    return {"arm": f"rf {arm.name} {snapshot_mode}", "steps": m.rounds, "rows_per_step": m.rows_per_round,
            "tokens_per_step": m.tokens_per_round, "empty_row_slots": m.empty_slots, "reuse_pct": m.reuse_rate,
            "deferrals": m.blocked_deferrals, "latency_mean_s": m.latency_mean, "latency_p95_s": m.latency_p95,
            "leaked_blocks": 0}


def qa_branches(dataset: str, questions: int, stream: str, rate: float, seed: int) -> list[Branch]:
    """A multi-candidate trace: `questions` questions of the dataset's shape, four branches each."""
    shape = DATASETS[dataset]
    qs = synth_questions(shape, random.Random(seed), questions)
    return [branch_from_record(r) for r in stream_records(qs, stream, "forward", rate, seed)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", choices=sorted(DATASETS), default="race-m")
    p.add_argument("--questions", type=int, default=32)
    p.add_argument("--stream", choices=("cold", "reuse", "mixed"), default="cold")
    p.add_argument("--rate", type=float, default=0.0, help="Poisson questions/s; 0 = all arrive at 0")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--block-size", type=int, default=16)
    args = p.parse_args(argv)
    if args.questions < 1:
        p.error("--questions must be >= 1")
    branches = qa_branches(args.dataset, args.questions, args.stream, args.rate, args.seed)
    print(f"{args.dataset} {args.stream}: {args.questions} questions, {len(branches)} branches, "
          f"rate {args.rate}/s; S={args.max_num_seqs} T={args.max_num_batched_tokens} "
          f"block={args.block_size}")
    cols = ("arm", "steps", "rows_per_step", "tokens_per_step", "empty_row_slots", "reuse_pct", "deferrals",
            "latency_mean_s", "latency_p95_s", "leaked_blocks")
    print("  ".join(f"{c:>16}" for c in cols))
    budgets = (args.max_num_seqs, args.max_num_batched_tokens, args.block_size)
    rows = [replay_vllm(branches, False, *budgets), replay_vllm(branches, True, *budgets)]
    for mode in ("chunk-end", "every-boundary"):
        rows += [replay_radixflow(branches, sr, *budgets, snapshot_mode=mode) for sr in (False, True)]
    for res in rows:
        print("  ".join(f"{res[c]:>16.3f}" if isinstance(res[c], float) else f"{res[c]:>16}" for c in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
