"""The vLLM plugin against vLLM 0.33's own scheduler, on CPU (SPEC §3, §5).

Needs vLLM installed by scripts/install_vllm.sh; skipped otherwise, failed under RADIXFLOW_REQUIRE_VLLM=1.
"""

from __future__ import annotations

import random

import pytest
from vllm_factories import (
    PromptSpec,
    add_all,
    load_harness,
    native_view,
    producer_consumer_unrelated,
    random_groups,
    run_to_completion,
)

harness = load_harness()
from vllm.v1.request import RequestStatus  # noqa: E402

BS = 16


def setup(**overrides):
    return harness.SchedulerSetup(block_size=BS, **overrides)


def first_step(plugin: bool, hybrid: bool = True, async_scheduling: bool = False):
    config = setup(plugin=plugin, hybrid=hybrid, async_scheduling=async_scheduling)
    scheduler = harness.build_scheduler(config)
    add_all(harness, scheduler, producer_consumer_unrelated(BS), BS)
    return scheduler, harness.run_step(scheduler)


def test_native_vllm_stops_at_the_blocked_consumer():
    _, step1 = first_step(plugin=False)
    assert set(step1.num_scheduled_tokens) == {"r0"}


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_plugin_defers_the_consumer_and_fills_the_row(async_scheduling):
    scheduler, step1 = first_step(plugin=True, async_scheduling=async_scheduling)
    assert set(step1.num_scheduled_tokens) == {"r0", "r2"}
    assert step1.deferred == ["r1"]
    step2 = harness.run_step(scheduler)
    assert "r1" in step2.num_scheduled_tokens
    assert step2.new_hits["r1"] == 4 * BS  # the producer's state, published by step 1
    run_to_completion(harness, scheduler)
    assert harness.count_free_blocks(scheduler) == harness.usable_blocks(scheduler)


def test_native_vllm_gives_the_consumer_the_same_hit_one_step_later():
    scheduler, _ = first_step(plugin=False)
    step2 = harness.run_step(scheduler)
    assert step2.new_hits["r1"] == 4 * BS


def test_a_blocked_consumer_whose_pages_do_not_fit_is_other_and_stops_the_scan(monkeypatch):
    # r1 waits for r0's state AND needs more blocks (4 for its chunk, 5 for vLLM's full-sequence gate)
    # than the 3 left after r0: that is Other (SPEC §3), so the plugin must stop where vLLM stops,
    # although r2 would fit.
    doc = tuple(range(1, 4 * BS + 1))
    specs = [PromptSpec("r0", doc + (100,) * 5), PromptSpec("r1", doc + tuple(range(200, 260))),
             PromptSpec("r2", tuple(range(300, 310)))]

    def first_rows():
        scheduler = harness.build_scheduler(setup(plugin=True, num_gpu_blocks=9))
        add_all(harness, scheduler, specs, BS)
        return harness.run_step(scheduler)

    step1 = first_rows()
    assert set(step1.num_scheduled_tokens) == {"r0"} and step1.deferred == []
    # Proof that the page check decided it: calling r1 Blocked regardless lets r2 in.
    from radixflow.integrations.vllm import scheduler as plugin_scheduler
    from radixflow.integrations.vllm.readiness import PublishedNeed

    monkeypatch.setattr(plugin_scheduler, "blocks_once_state_is_published", lambda *a, **k: PublishedNeed(0, 0))
    # (The tight-pool check, which keeps room for twice r2's block past a deferral, would refuse r2 on
    # this 9-block pool by itself; it is switched off so that the page check alone is compared.)
    monkeypatch.setattr(plugin_scheduler.StateReadyMixin, "_exposes_its_blocks", lambda *a, **k: False)
    assert set(first_rows().num_scheduled_tokens) == {"r0", "r2"}


@pytest.mark.parametrize("num_gpu_blocks", range(8, 16))
def test_the_fit_check_agrees_with_vllms_allocator_once_the_state_is_published(num_gpu_blocks):
    from radixflow.integrations.vllm.readiness import blocking_state_groups, fits_once_state_is_published

    doc = tuple(range(1, 4 * BS + 1))
    specs = [PromptSpec("r0", doc + (100,) * 5), PromptSpec("r1", doc + tuple(range(200, 260)))]
    scheduler = harness.build_scheduler(setup(plugin=False, num_gpu_blocks=num_gpu_blocks))
    add_all(harness, scheduler, specs, BS)
    scheduler.schedule()  # r0 admitted; its hashes are in this step's same-step set until the next step
    consumer = scheduler.requests["r1"]
    blocks, num_hit, _, _ = scheduler._get_local_prefix_cache_hit(consumer)
    num_new = scheduler._mamba_block_aligned_split(consumer, consumer.num_tokens - num_hit, num_hit, 0)
    assert blocking_state_groups(scheduler.kv_cache_manager, blocks.blocks, num_hit)
    predicted = fits_once_state_is_published(
        scheduler.kv_cache_manager, consumer, blocks.blocks, num_hit, num_new,
        num_lookahead_tokens=0, max_model_len=scheduler.max_model_len, has_scheduled_reqs=True,
        full_sequence_must_fit=scheduler.scheduler_reserve_full_isl,
    )
    # vLLM's own answer, on the same state with the producer's state published.
    scheduler.kv_cache_manager.new_step_starts()
    allocated = scheduler.kv_cache_manager.allocate_slots(
        consumer, num_new, num_new_computed_tokens=num_hit, new_computed_blocks=blocks,
        full_sequence_must_fit=scheduler.scheduler_reserve_full_isl, has_scheduled_reqs=True,
    )
    assert predicted == (allocated is not None)


def test_full_attention_schedules_identically_with_and_without_the_plugin():
    rng = random.Random(7)
    for specs in [producer_consumer_unrelated(BS)] + [random_groups(rng, BS) for _ in range(5)]:
        runs = []
        for plugin in (False, True):
            scheduler = harness.build_scheduler(setup(plugin=plugin, hybrid=False, max_num_seqs=4,
                                                      max_num_batched_tokens=256))
            assert not getattr(scheduler, "state_ready", False)
            add_all(harness, scheduler, specs, BS)
            runs.append([r.num_scheduled_tokens for r in run_to_completion(harness, scheduler)])
        assert runs[0] == runs[1]


@pytest.mark.parametrize("seed", range(12))
def test_from_the_same_state_the_plugin_batch_contains_the_native_batch(seed):
    rng = random.Random(seed)
    # A small pool keeps the per-step deep copy cheap (its free list is copied block by block).
    scheduler = harness.build_scheduler(setup(plugin=True, num_gpu_blocks=400, max_num_seqs=rng.choice([2, 4, 8]),
                                              max_num_batched_tokens=rng.choice([64, 128, 512, 2048])))
    add_all(harness, scheduler, random_groups(rng, BS), BS)
    for _ in range(300):
        if not scheduler.has_requests():
            break
        native = native_view(scheduler).schedule().num_scheduled_tokens
        step = harness.run_step(scheduler)
        assert set(native) <= set(step.num_scheduled_tokens)
        # Requests native scheduled get the same tokens: the rule only adds rows behind them.
        assert {r: step.num_scheduled_tokens[r] for r in native} == native
        assert step.rows <= scheduler.max_num_running_reqs
        assert step.tokens <= scheduler.max_num_scheduled_tokens
    assert not scheduler.has_requests()
    assert harness.count_free_blocks(scheduler) == harness.usable_blocks(scheduler)


@pytest.mark.parametrize("seed", range(12))
def test_prefix_hits_are_the_same_and_steps_no_more(seed):
    rng = random.Random(100 + seed)
    specs = random_groups(rng, BS)
    # A budget no single prompt can overrun: chunks are cut only by Mamba alignment, never by what is
    # left of the budget, so both arms publish states at the same boundaries.
    budget = dict(max_num_seqs=rng.choice([2, 4, 8]), max_num_batched_tokens=8192)
    totals, steps = [], []
    for plugin in (False, True):
        scheduler = harness.build_scheduler(setup(plugin=plugin, **budget))
        add_all(harness, scheduler, specs, BS)
        records = run_to_completion(harness, scheduler)
        totals.append(sum(sum(r.new_hits.values()) for r in records))
        steps.append(len(records))
    assert totals[0] == totals[1]
    assert steps[1] <= steps[0]


def test_async_plugin_with_two_steps_in_flight_finishes_everything():
    # vLLM's engine schedules step t+1 before step t's output is back; the model output is fixed
    # when a step is scheduled, as a real runner's would be.
    scheduler = harness.build_scheduler(setup(plugin=True, async_scheduling=True, max_num_seqs=8))
    requests = add_all(harness, scheduler, random_groups(random.Random(3), BS, max_groups=8), BS, max_tokens=3)
    in_flight = []
    for _ in range(200):
        if not scheduler.has_requests() and not in_flight:
            break
        if scheduler.has_requests():
            output = scheduler.schedule()
            in_flight.append((output, harness.stand_in_model_output(scheduler, output)))
        if len(in_flight) == 2 or not scheduler.has_requests():
            scheduler.update_from_output(*in_flight.pop(0))
    assert not scheduler.has_requests() and not in_flight
    assert scheduler.num_blocked_deferrals > 0
    assert {r.num_output_tokens for r in requests.values()} == {3}
    assert harness.count_free_blocks(scheduler) == harness.usable_blocks(scheduler)


def test_finish_abort_and_preemption_leave_no_blocks_behind():
    # A pool too small for every decode to grow forces vLLM to preempt running requests.
    scheduler = harness.build_scheduler(setup(plugin=True, num_gpu_blocks=24, max_num_seqs=8))
    doc = tuple(range(2, 2 + 3 * BS))
    specs = [(f"q{i}", doc + (1000 + i,) * (i + 1)) for i in range(6)]
    specs += [(f"u{i}", tuple(range(5000 + 100 * i, 5000 + 100 * i + 2 * BS + 3))) for i in range(2)]
    requests = {}
    for rid, tokens in specs:
        requests[rid] = harness.make_request(rid, tokens, BS, max_tokens=4 * BS)
        scheduler.add_request(requests[rid])
    step1 = harness.run_step(scheduler)
    assert step1.deferred, "the consumers of q0's document should be deferred in step 1"
    deferred_victim = step1.deferred[0]
    # The unrelated requests are refused in step 1 (the deferred consumers' claim on this tight pool);
    # a running victim is taken from step 2.
    step2 = harness.run_step(scheduler)
    running_victim = next(r for r in step2.num_scheduled_tokens if r not in ("q0", deferred_victim))
    scheduler.finish_requests([deferred_victim, running_victim], RequestStatus.FINISHED_ABORTED)
    run_to_completion(harness, scheduler)

    assert not scheduler.has_requests()
    assert harness.count_free_blocks(scheduler) == harness.usable_blocks(scheduler)
    assert sum(r.num_preemptions for r in requests.values()) > 0
    for rid, request in requests.items():
        if rid in (deferred_victim, running_victim):
            assert request.status == RequestStatus.FINISHED_ABORTED
        else:
            assert request.status == RequestStatus.FINISHED_LENGTH_CAPPED
            assert request.num_output_tokens == 4 * BS
