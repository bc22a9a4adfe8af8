"""`schedule()` time of vLLM 0.33's scheduler, native against the plugin, measured side by side (SPEC §12).

Two queue shapes, each at 1k and 10k waiting requests, S = 16:
- **fan**: one producer and N-1 consumers of one document (300 or 6,000 tokens, rounded up to whole
  blocks; T = 2,048 so the long document takes three steps), each consumer with its own 5-token
  tail. Printed: the `schedule()` time of the step that finds the consumers Blocked, native and
  plugin, and the ratio (target <= 5x); then the sums over all steps until the first consumer is
  admitted.
- **paper**: the multi-candidate QA queue (RACE-M-shaped questions, four branches each, T = 8,192).
  Printed: `schedule()` time per admitted row over the first steps, and the ratio (target <= 1.5x).

Only `schedule()` is timed (not `update_from_output`, not building the queue). Each arm is measured
`--repeats` times on a fresh scheduler, alternating arms; per step the best time is kept (garbage
collection off inside the timed call); both arms run in this one process.

    python benchmarks/vllm_schedule_time.py [--sizes 1000 10000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

BS = 16


def fan_prompts(n: int, doc_len: int, seed: int = 0) -> list[tuple[int, ...]]:
    """One document (rounded up to whole blocks, so the producer's chunk ends inside the shared part and
    the consumers are Blocked on it, as in a multi-candidate question) and n distinct 5-token tails."""
    rng = random.Random(seed)
    doc = tuple(rng.randrange(2, 30000) for _ in range(-(-doc_len // BS) * BS))
    return [doc + tuple(rng.randrange(2, 30000) for _ in range(5)) for _ in range(n)]


def paper_prompts(n: int, seed: int = 0) -> list[tuple[int, ...]]:
    from radixflow.workloads.qa import RACE_M, stream_records, synth_questions
    from radixflow.workloads.trace import branch_from_record

    questions = synth_questions(RACE_M, random.Random(seed), (n + 3) // 4)
    branches = [branch_from_record(r) for r in stream_records(questions, "cold", "forward", 0.0, seed)]
    return [tuple(b.prompt) for b in branches[:n]]


def make_requests(prompts, harness):
    """vLLM requests for the prompts; block hashes of a prompt seen before are copied, not recomputed
    (building the 10k queues is otherwise minutes of sha256, none of it inside `schedule()`)."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    hasher = harness._block_hasher(BS)
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    known: dict[tuple[int, ...], list] = {}
    requests = []
    for i, prompt in enumerate(prompts):
        full = prompt[: len(prompt) // BS * BS]
        request = Request(request_id=f"r{i}", prompt_token_ids=list(prompt), sampling_params=params,
                          pooling_params=None, arrival_time=i * 1e-6, block_hasher=None)
        if full not in known:
            probe = Request(request_id="probe", prompt_token_ids=list(full), sampling_params=params,
                            pooling_params=None, block_hasher=hasher)
            known[full] = probe.block_hashes
        request.block_hashes = list(known[full])
        request._block_hasher = hasher
        requests.append(request)
    return requests


def time_steps(prompts, plugin: bool, max_num_batched_tokens: int, steps: int, until_admitted: str | None):
    """(seconds in each schedule() call, rows admitted, steps run) for one fresh scheduler."""
    from radixflow.integrations.vllm import cpu_harness as harness

    setup = harness.SchedulerSetup(max_num_seqs=16, max_num_batched_tokens=max_num_batched_tokens, block_size=BS,
                                   num_gpu_blocks=8192, max_model_len=8192, plugin=plugin)
    scheduler = harness.build_scheduler(setup)
    for request in make_requests(prompts, harness):
        scheduler.add_request(request)
    spent, admitted = [], 0
    for step in range(1, steps + 1):
        gc.collect()
        gc.disable()  # a collection inside one timed call would swamp a millisecond figure
        start = time.perf_counter()
        output = scheduler.schedule()
        spent.append(time.perf_counter() - start)
        gc.enable()
        admitted += len(output.scheduled_new_reqs)
        done = until_admitted is not None and any(r.req_id == until_admitted for r in output.scheduled_new_reqs)
        scheduler.update_from_output(output, harness.stand_in_model_output(scheduler, output))
        if done:
            return spent, admitted, step
    return spent, admitted, steps


def best_pair(prompts, tokens, steps, until, repeats):
    """Native and plugin runs alternated `repeats` times (so load drift hits both). Per arm: the sum over
    steps of each step's best time, rows admitted, steps run (the same in every repeat)."""
    runs = {False: [], True: []}
    for _ in range(repeats):
        for plugin in (False, True):
            runs[plugin].append(time_steps(prompts, plugin, tokens, steps, until))
    result = []
    for plugin in (False, True):
        per_step = [min(times) for times in zip(*(spent for spent, _, _ in runs[plugin]))]
        result.append((per_step, runs[plugin][0][1], runs[plugin][0][2]))
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--paper-steps", type=int, default=8)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    print(f"{'case':<28} {'native ms':>10} {'plugin ms':>10} {'ratio':>7}  notes")
    for n in args.sizes:
        for doc_len in (300, 6000):
            prompts = fan_prompts(n, doc_len)
            native, plugin = best_pair(prompts, 2048, 6, "r1", args.repeats)
            # The step before the first consumer is admitted is the one that finds the consumers Blocked.
            blocked_n, blocked_p = native[0][native[2] - 2], plugin[0][plugin[2] - 2]
            print(f"{f'fan doc={len(prompts[0]) - 5} waiting={n}':<28} {1e3 * blocked_n:>10.3f} "
                  f"{1e3 * blocked_p:>10.3f} {blocked_p / blocked_n:>7.2f}  the Blocked step (target ratio <= 5); "
                  f"all {native[2]}/{plugin[2]} steps to the first consumer: {1e3 * sum(native[0]):.3f} / "
                  f"{1e3 * sum(plugin[0]):.3f} ms, ratio {sum(plugin[0]) / sum(native[0]):.2f}")
        prompts = paper_prompts(n)
        native, plugin = best_pair(prompts, 8192, args.paper_steps, None, args.repeats)
        per_row_native, per_row_plugin = sum(native[0]) / native[1], sum(plugin[0]) / plugin[1]
        print(f"{f'paper waiting={n} per row':<28} {1e3 * per_row_native:>10.3f} {1e3 * per_row_plugin:>10.3f} "
              f"{per_row_plugin / per_row_native:>7.2f}  rows admitted in {args.paper_steps} steps "
              f"{native[1]}/{plugin[1]} (target ratio <= 1.5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
