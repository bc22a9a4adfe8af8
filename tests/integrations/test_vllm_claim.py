"""A deferred request keeps its claim across steps in vLLM 0.33's scheduler (SPEC §12), on CPU.

Each of the P/C/D, cadence, encoder-cache and priority tests below fails with the pre-claim mixin
(commit ae18fac): there C waits until step 42, the cadence hold delays C by three steps, and the
deferred request keeps its encoder-cache reference.
"""

from __future__ import annotations

import pytest
from vllm_factories import load_harness

harness = load_harness()
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.encoder_cache_manager import EncoderCacheManager  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from radixflow.integrations.vllm.claim import NextStepShare, StepClaim, next_step_share  # noqa: E402
from radixflow.integrations.vllm.scheduler import StateReadyMixin  # noqa: E402
from radixflow.integrations.vllm.sweep import TIGHT_POOL, run_config, smoke_configs, tight_pool_configs  # noqa: E402

BS = 16
DOC = tuple(range(1, 4 * BS + 1))


def first_scheduled(scheduler, max_steps: int = 200, arrivals=None) -> dict[str, int]:
    """Step to completion (with `InFlightDriver` for async); the step each request first got tokens."""
    driver = harness.InFlightDriver(scheduler, depth=2 if scheduler.__class__.__name__.endswith("AsyncScheduler")
                                    else 1)
    first: dict[str, int] = {}
    for step in range(1, max_steps + 1):
        for request in (arrivals or {}).get(step, ()):
            scheduler.add_request(request)
        if not driver.busy and not any(s > step for s in (arrivals or {})):
            return first
        record = driver.step()
        for rid in record.num_scheduled_tokens if record else ():
            first.setdefault(rid, step)
    raise AssertionError("not finished")


def pcd_requests(d_first: bool) -> list[Request]:
    """P shares a 64-token document with C and decodes 40 tokens; C wants 1; D is unrelated, decodes
    40 and has the lowest priority (with `d_first` it also arrives first)."""
    specs = [("P", DOC + (100,) * 5, 40, 0, 1.0), ("C", DOC + (200,) * 5, 1, 0, 2.0),
             ("D", tuple(range(300, 340)), 40, 1, 0.0 if d_first else 3.0)]
    specs.sort(key=lambda s: s[4])
    return [harness.make_request(rid, toks, BS, max_tokens=n, priority=prio, arrival=at)
            for rid, toks, n, prio, at in specs]


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_the_deferred_consumer_is_admitted_at_step_2_as_natively(policy, async_scheduling):
    steps = {}
    for plugin in (False, True):
        scheduler = harness.build_scheduler(harness.SchedulerSetup(
            block_size=BS, max_num_seqs=2, plugin=plugin, policy=policy, async_scheduling=async_scheduling))
        for request in pcd_requests(d_first=False):
            scheduler.add_request(request)
        steps[plugin] = first_scheduled(scheduler)
    assert steps[False]["C"] == 2
    assert steps[True]["C"] == 2
    assert steps[True]["D"] >= steps[False]["D"] - 1  # D may only go earlier by the deferral's own gain


def test_priority_a_low_priority_request_that_arrived_first_does_not_take_the_consumers_row():
    scheduler = harness.build_scheduler(harness.SchedulerSetup(block_size=BS, max_num_seqs=2, plugin=True,
                                                               policy="priority"))
    for request in pcd_requests(d_first=True):
        scheduler.add_request(request)
    step1 = harness.run_step(scheduler)
    assert step1.deferred == ["C"] and set(step1.num_scheduled_tokens) == {"P"}
    assert scheduler.num_claim_refusals == 1  # D, refused for C's row
    step2 = harness.run_step(scheduler)
    assert "C" in step2.num_scheduled_tokens and "D" not in step2.num_scheduled_tokens


def cadence_run(plugin: bool):
    scheduler = harness.build_scheduler(harness.SchedulerSetup(block_size=BS, max_num_seqs=8, plugin=plugin,
                                                               prefill_schedule_interval=4))
    arrivals = {1: [harness.make_request("X", tuple(range(500, 520)), BS, max_tokens=30)],
                2: [harness.make_request("P", DOC + (100,) * 5, BS, max_tokens=3, arrival=1.0),
                    harness.make_request("C", DOC + (200,) * 5, BS, max_tokens=1, arrival=2.0)]}
    bounds = []
    original = scheduler.schedule

    def schedule(*args, **kwargs):
        output = original(*args, **kwargs)
        bounds.append(scheduler.prefill_capacity_bound)
        return output

    scheduler.schedule = schedule
    return first_scheduled(scheduler, arrivals=arrivals), bounds, scheduler


def test_prefill_cadence_sees_the_deferred_consumer_as_native_vllm_sees_it():
    native, native_bounds, _ = cadence_run(plugin=False)
    plugin, plugin_bounds, scheduler = cadence_run(plugin=True)
    assert scheduler.num_blocked_deferrals == 1
    assert native["C"] == native["P"] + 1
    assert plugin == native
    assert plugin_bounds == native_bounds
    assert not scheduler.deferred_waiting


def mm_request(request_id: str, tokens: tuple[int, ...], image_offset: int) -> Request:
    image = MultiModalFeatureSpec(data=None, modality="image", identifier="img",
                                  mm_position=PlaceholderRange(offset=image_offset, length=8))
    return Request(request_id=request_id, prompt_token_ids=list(tokens),
                   sampling_params=SamplingParams(max_tokens=1, ignore_eos=True), pooling_params=None,
                   mm_features=[image], block_hasher=harness._block_hasher(BS))


@pytest.mark.parametrize("plugin", [False, True])
def test_a_deferred_multimodal_request_releases_its_encoder_cache_reference(plugin):
    scheduler = harness.build_scheduler(harness.SchedulerSetup(block_size=BS, max_num_seqs=8, plugin=plugin))
    # The tiny text model has no encoder budget; give the scheduler one, as a multimodal model would.
    scheduler.encoder_cache_manager = EncoderCacheManager(cache_size=1000)
    scheduler.max_num_encoder_input_tokens = 1000
    # Z leaves the image's encoder output cached and unreferenced.
    scheduler.add_request(mm_request("Z", tuple(range(400, 410)) + (9,) * 8 + (5,) * 4, image_offset=10))
    harness.run_step(scheduler)
    harness.run_step(scheduler)
    assert scheduler.encoder_cache_manager.cached == {"img": set()}
    tail = (7, 7) + (9,) * 8
    scheduler.add_request(mm_request("P", DOC + tail + (100,) * 4, image_offset=len(DOC) + 2))
    scheduler.add_request(mm_request("C", DOC + tail + (200,) * 4, image_offset=len(DOC) + 2))
    step1 = harness.run_step(scheduler)
    assert "C" not in step1.num_scheduled_tokens
    assert step1.deferred == (["C"] if plugin else [])
    # C looked the image up in the cache while being considered; it must not keep it pinned.
    assert scheduler.encoder_cache_manager.cached["img"] == set()
    step2 = harness.run_step(scheduler)
    assert "C" in step2.num_scheduled_tokens


def test_siblings_of_a_blocked_consumer_cost_no_prefix_lookup():
    scheduler = harness.build_scheduler(harness.SchedulerSetup(block_size=BS, max_num_seqs=16, plugin=True))
    scheduler.add_request(harness.make_request("P", DOC + (100,) * 5, BS))
    for i in range(200):
        scheduler.add_request(harness.make_request(f"C{i}", DOC + (1000 + i,) * 5, BS))
    step1 = harness.run_step(scheduler)
    assert set(step1.num_scheduled_tokens) == {"P"}
    # P and the first consumer are looked up; the 14 siblings deferred beside it are recognised by key,
    # and the scan stops at the first sibling the next step could not serve (rows: 1 + 15 = 16).
    assert scheduler.num_prefix_lookups == 2
    assert len(step1.deferred) == 15
    step2 = harness.run_step(scheduler)
    assert set(step1.deferred) <= set(step2.num_scheduled_tokens)
    assert all(step2.new_hits[r] == len(DOC) for r in step1.deferred)


def repeated_prompt_run(plugin: bool) -> tuple[dict[str, int], dict[str, int], list[str], object]:
    """X (its document and 37 more tokens) runs alone and finishes, leaving its blocks and its Mamba state
    at 96 cached. Then P (a new branch of the document), C1 (another) and C2 (X's first 96 tokens and
    its own tail), under the priority policy. P's chunk ends at the document (64), so C1 is Blocked on
    P's same-step state; C2 shares that document hash, but its own lookup ends on X's state at 96,
    published two steps ago: it is not Blocked. The step each got tokens first, their hits, the
    requests deferred in the first step."""
    scheduler = harness.build_scheduler(harness.SchedulerSetup(block_size=BS, max_num_seqs=8, plugin=plugin,
                                                               policy="priority"))
    x = DOC + tuple(range(700, 737))
    scheduler.add_request(harness.make_request("X", x, BS, max_tokens=1))
    while scheduler.has_requests():
        harness.run_step(scheduler)
    scheduler.add_request(harness.make_request("P", DOC + (100,) * 5, BS, max_tokens=3, arrival=1.0))
    scheduler.add_request(harness.make_request("C1", DOC + (200,) * 5, BS, priority=1, arrival=2.0))
    scheduler.add_request(harness.make_request("C2", x[:96] + (300,) * 5, BS, priority=1, arrival=3.0))
    first, hits, deferred = {}, {}, None
    for step in range(1, 10):
        record = harness.run_step(scheduler)
        if deferred is None:
            deferred = record.deferred
        for rid in record.num_scheduled_tokens:
            first.setdefault(rid, step)
        hits.update(record.new_hits)
    return first, hits, deferred, scheduler


def test_a_sibling_whose_own_hit_is_ready_is_not_deferred_with_the_blocked_group():
    native_first, native_hits, _, _ = repeated_prompt_run(plugin=False)
    first, hits, deferred, scheduler = repeated_prompt_run(plugin=True)
    assert native_hits == {"P": 0, "C1": 64, "C2": 96}  # vLLM's own lookups
    # Only C1 is Blocked; C2 takes its own ready hit and is admitted (it finishes) in the first step.
    # Before the check, the shortcut gave C2 C1's lookup and deferred it to the second step.
    assert deferred == ["C1"]
    assert hits == native_hits
    assert first == {"P": 1, "C2": 1, "C1": 2}
    assert first["C2"] <= native_first["C2"] and first["C1"] == native_first["C1"]
    assert scheduler.num_blocked_deferrals == 1


def test_next_step_share_and_the_claim_arithmetic():
    # A prefill whose next chunk (16, as the caller cut it) is less than its remainder.
    assert next_step_share(remaining_after=30, outputs_after=0, max_tokens=5, next_chunk=16, chunk_cap=16,
                           rows_outlive_finish=False) == NextStepShare(1, 16, False, False)
    # A prompt tail that is its whole next chunk, then one output token: it finishes next step.
    assert next_step_share(remaining_after=12, outputs_after=0, max_tokens=1, next_chunk=12, chunk_cap=16,
                           rows_outlive_finish=False) == NextStepShare(1, 12, False, True)
    # The same with the alignment moving its last 4 tokens on: 8 tokens next step, still finishing.
    assert next_step_share(remaining_after=12, outputs_after=0, max_tokens=1, next_chunk=8, chunk_cap=16,
                           rows_outlive_finish=False) == NextStepShare(1, 8, False, True)
    # A remainder over the threshold (chunk_cap 8) takes more than one step.
    assert next_step_share(remaining_after=12, outputs_after=0, max_tokens=1, next_chunk=8, chunk_cap=8,
                           rows_outlive_finish=False) == NextStepShare(1, 8, False, False)
    assert next_step_share(remaining_after=0, outputs_after=1, max_tokens=1, next_chunk=0, chunk_cap=16,
                           rows_outlive_finish=False) == NextStepShare(0, 0, True, True)
    assert next_step_share(remaining_after=0, outputs_after=1, max_tokens=1, next_chunk=0, chunk_cap=16,
                           rows_outlive_finish=True) == NextStepShare(1, 0, True, True)
    assert next_step_share(remaining_after=0, outputs_after=1, max_tokens=9, next_chunk=0, chunk_cap=16,
                           rows_outlive_finish=False) == NextStepShare(1, 1, False, False)
    assert next_step_share(remaining_after=0, outputs_after=8, max_tokens=9, next_chunk=0, chunk_cap=16,
                           rows_outlive_finish=False) == NextStepShare(1, 1, False, True)
    claim = StepClaim(max_rows=4, max_tokens=10, started=True)
    claim.admit(NextStepShare(1, 1, False), growth_blocks=2)  # the producer, decoding next step
    assert claim.tokens_left == 9
    assert claim.room_for_deferral(tokens=6, need_blocks=4, free_blocks=4)
    assert not claim.room_for_deferral(tokens=0, need_blocks=0, free_blocks=100)  # no chunk: not served
    # c: a 6-token chunk, gate 4 blocks with the watermark (1), of which it allocates 3.
    claim.defer("c", demand=6, tokens=6, alloc_blocks=3, need_blocks=4, growth_blocks=1)
    assert claim.tokens_left == 3 and claim.blocks_to_keep == 4 + 2 + 1
    # d is checked after c has allocated: its gate 3 + watermark 1 on top of c's 3 blocks.
    assert claim.room_for_deferral(tokens=3, need_blocks=4, free_blocks=7)
    assert not claim.room_for_deferral(tokens=3, need_blocks=4, free_blocks=6)
    claim.defer("d", demand=5, tokens=3, alloc_blocks=2, need_blocks=4)  # cut to 3 by the budget left
    assert claim.blocks_to_keep == (3 + 4) + 2 + 1  # the watermark once, not once per deferral
    assert claim.tokens_left == 0
    assert not claim.fits_beside(NextStepShare(1, 1, False, True))  # d would lose a token of its chunk
    assert claim.fits_beside(NextStepShare(0, 0, True, True))  # finishes this step: holds nothing
    claim = StepClaim(max_rows=3, max_tokens=10, started=True)
    claim.admit(NextStepShare(1, 1, False))
    claim.defer("c", demand=6, tokens=6, alloc_blocks=4, need_blocks=4)
    assert claim.fits_beside(NextStepShare(1, 3, False, True))  # rows 1+1+1 <= 3, tokens 1+3+6 <= 10
    assert not claim.fits_beside(NextStepShare(1, 4, False, True))  # tokens 11 > 10
    assert not claim.fits_beside(NextStepShare(1, 1, False, False))  # fits, but still runs after t+1
    claim.admit(NextStepShare(1, 3, False, True))
    assert not claim.fits_beside(NextStepShare(1, 1, False, True))  # rows 2+1+1 > 3
    assert not claim.room_for_deferral(tokens=1, need_blocks=0, free_blocks=100)  # no row left


def threshold_run(plugin: bool, long_prefill_token_threshold: int = 64):
    """R (2,000 unrelated tokens) is prefilling; P, C (its consumer) and U (20 unrelated tokens, one
    output) arrive. With the threshold every chunk is capped at 64 while more than one request is
    eligible: R takes 64 a step, so at the next step R, P's tail and C's 5 tokens fit in T = 512 twice
    over. The first step of the four: (tokens per request, deferred)."""
    scheduler = harness.build_scheduler(harness.SchedulerSetup(
        block_size=BS, max_num_seqs=8, max_num_batched_tokens=512, plugin=plugin,
        long_prefill_token_threshold=long_prefill_token_threshold))
    scheduler.add_request(harness.make_request("R", tuple(range(5000, 7000)), BS))
    harness.run_step(scheduler)
    scheduler.add_request(harness.make_request("P", DOC + (100,) * 5, BS, max_tokens=3, arrival=1.0))
    scheduler.add_request(harness.make_request("C", DOC + (200,) * 5, BS, arrival=2.0))
    scheduler.add_request(harness.make_request("U", tuple(range(900, 920)), BS, arrival=3.0))
    step1 = harness.run_step(scheduler)
    step2 = harness.run_step(scheduler)
    return step1, step2, scheduler


def test_the_claim_counts_a_running_prefill_at_its_long_prefill_threshold_chunk():
    native1, native2, _ = threshold_run(plugin=False)
    assert native1.num_scheduled_tokens == {"R": 64, "P": 64}  # vLLM stops at the Blocked C
    assert native2.num_scheduled_tokens["R"] == 64 and native2.num_scheduled_tokens["C"] == 5
    step1, step2, scheduler = threshold_run(plugin=True)
    # R's next chunk is 64, not min(remaining, T) = 512: C fits the next step and is deferred, and
    # U (16 now, its 4-token tail and its token next step) is admitted behind it. Counting R at 512,
    # the claim called C Other and the scan stopped there, as natively.
    assert step1.deferred == ["C"]
    assert step1.num_scheduled_tokens == {"R": 64, "P": 64, "U": 16}
    assert step2.num_scheduled_tokens == {"R": 64, "P": 5, "U": 4, "C": 5}
    assert step2.new_hits["C"] == len(DOC)
    assert scheduler.num_claim_refusals == 0


def watermark_run(plugin: bool, filler_blocks: int):
    """A 64-block pool with vLLM's watermark at 10 % (6 blocks); F fills `filler_blocks` blocks and
    decodes; P (one output token) and its consumers C0, C1 arrive. The first step's deferrals and
    the consumers the second step admits."""
    scheduler = harness.build_scheduler(harness.SchedulerSetup(block_size=BS, max_num_seqs=8, num_gpu_blocks=64,
                                                               watermark=0.1, plugin=plugin))
    scheduler.add_request(harness.make_request("F", tuple(range(3000, 3003 + filler_blocks * BS)), BS, max_tokens=50))
    harness.run_step(scheduler)
    scheduler.add_request(harness.make_request("P", DOC + (100,) * 5, BS, arrival=1.0))
    for i in range(2):
        scheduler.add_request(harness.make_request(f"C{i}", DOC + (200 + i,) * 5, BS, arrival=2.0 + i))
    step1 = harness.run_step(scheduler)
    step2 = harness.run_step(scheduler)
    assert scheduler.kv_cache_manager.watermark_blocks == 6
    return step1.deferred, sorted(r for r in step2.num_scheduled_tokens if r.startswith("C"))


@pytest.mark.parametrize("filler_blocks", [42, 47])
def test_blocked_consumers_are_deferred_exactly_when_the_next_step_admits_them(filler_blocks):
    # 42: at the next step vLLM admits C0 then C1, each check with the watermark once; counting the
    # watermark once per deferral, C1 was called Other. 47: the running batch's own next-step blocks
    # (F's decode, P's tail, its Mamba block) leave no room for C0 then; it was deferred regardless.
    _, native = watermark_run(plugin=False, filler_blocks=filler_blocks)
    deferred, admitted = watermark_run(plugin=True, filler_blocks=filler_blocks)
    assert native == (["C0", "C1"] if filler_blocks == 42 else [])
    assert deferred == native
    assert admitted == native


@pytest.mark.parametrize("config", smoke_configs(), ids=lambda c: c.name)
def test_the_plugin_never_loses_to_native_vllm_on_the_sweep(config):
    native, plugin = run_config(config, plugin=False), run_config(config, plugin=True)
    assert plugin.steps <= native.steps * 1.02
    assert plugin.hit_tokens >= native.hit_tokens * 0.98
    assert plugin.last_finish_step <= native.last_finish_step * 1.05


def test_a_long_decode_that_fits_beside_the_claim_waits_for_its_native_step():
    # S = 3: D fits beside C's claim (rows 1 + 1 + 1), but it decodes 40 tokens, long after C's step:
    # admitted a step early it would run one step ahead of the native order for its whole decode, which
    # on a full pool moves every later gate and preemption (priority-kv120-s0 lost 8 % of its hits).
    first = {}
    for plugin in (False, True):
        scheduler = harness.build_scheduler(harness.SchedulerSetup(block_size=BS, max_num_seqs=3, plugin=plugin))
        for request in pcd_requests(d_first=False):
            scheduler.add_request(request)
        first[plugin] = first_scheduled(scheduler)
        if plugin:
            assert scheduler.num_blocked_deferrals == 1 and scheduler.num_claim_refusals == 1
    assert first[False] == {"P": 1, "C": 2, "D": 2}
    assert first[True] == first[False]


def test_on_the_tight_pool_no_admission_past_a_deferral_exposes_a_prefix_its_siblings_need(monkeypatch):
    # Issue 44's tight pool, seed 0, sync: the plugin admitted a question's first branch past the
    # deferred siblings of the question before; it finished, and freed its blocks, a step earlier than
    # natively, the next allocations evicted its document prefix before its own siblings came, and
    # they hit less (15,136 hit tokens against native's 15,440).
    config = tight_pool_configs([0])[0]
    assert config.name == "tightpool-sync-s0" and config.num_gpu_blocks == TIGHT_POOL.num_gpu_blocks == 64
    native = run_config(config, plugin=False)
    plugin = run_config(config, plugin=True)
    assert plugin.steps <= native.steps
    assert plugin.hit_tokens >= native.hit_tokens
    assert plugin.last_finish_step <= native.last_finish_step
    assert plugin.deferrals > 0
    # Without the pool check the same trace loses again.
    monkeypatch.setattr(StateReadyMixin, "_exposes_its_blocks", lambda self, request, num_hit_tokens: False)
    unchecked = run_config(config, plugin=True)
    assert unchecked.hit_tokens < native.hit_tokens
