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
from `_get_local_prefix_cache_hit` instead of being repeated.
"""

from __future__ import annotations

from typing import Any

from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from radixflow.integrations.vllm.readiness import blocking_state_groups, fits_once_state_is_published

logger = init_logger(__name__)


class StateReadyMixin:
    """State-ready traversal for a vLLM `Scheduler` subclass; put it first in the bases.

    `state_ready` switches the rule off (native prefix-stop) without changing anything else; it starts
    on only where a request can be Blocked at all (see `state_ready_unsupported_reason`).
    `num_blocked_deferrals` counts the deferrals made so far and `blocked_last_step` lists the request
    ids deferred in the latest `schedule()`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # request id -> (per-group hit blocks, hit tokens) of this scan's fresh lookups.
        self._fresh_hits: dict[str, tuple[tuple, int]] = {}
        self.num_blocked_deferrals = 0
        self.blocked_last_step: list[str] = []
        reason = self.state_ready_unsupported_reason()
        self.state_ready = reason is None
        if reason is None:
            logger.info("radixflow state-ready traversal is on (%s).", type(self).__name__)
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

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        self._fresh_hits.clear()
        self.blocked_last_step = []
        try:
            return super().schedule(*args, **kwargs)
        finally:
            self._fresh_hits.clear()

    def _get_local_prefix_cache_hit(self, request: Request, max_cache_hit_length: int | None = None):
        result = super()._get_local_prefix_cache_hit(request, max_cache_hit_length)
        if self.state_ready:
            blocks, num_hit_tokens = result[0], result[1]
            self._fresh_hits[request.request_id] = (blocks.blocks, num_hit_tokens)
        return result

    def _reserve_prefill_lookahead(
        self, request: Request, num_computed_tokens: int, num_new_tokens: int
    ) -> int:
        num_new_tokens = super()._reserve_prefill_lookahead(request, num_computed_tokens, num_new_tokens)
        # Only requests looked up in this scan have an entry; running requests pass straight through.
        fresh = self._fresh_hits.pop(request.request_id, None)
        if fresh is None or num_new_tokens == 0 or not self.state_ready:
            return num_new_tokens
        if self._is_blocked(request, *fresh, num_new_tokens):
            self.blocked_last_step.append(request.request_id)
            self.num_blocked_deferrals += 1
            # 0 tokens is vLLM's own cue to defer this request for the step and keep scanning.
            return 0
        return num_new_tokens

    def _is_blocked(
        self, request: Request, hit_blocks: tuple, num_hit_tokens: int, num_new_tokens: int
    ) -> bool:
        if not blocking_state_groups(self.kv_cache_manager, hit_blocks, num_hit_tokens):
            return False
        # Blocked means the same-step state is the ONLY obstacle; a request the pool could not take
        # anyway is Other, and vLLM's allocate_slots must see it and stop the scan.
        return fits_once_state_is_published(
            self.kv_cache_manager,
            request,
            hit_blocks,
            num_hit_tokens,
            num_new_tokens,
            num_lookahead_tokens=self.num_lookahead_tokens,
            max_model_len=self.max_model_len,
            has_scheduled_reqs=bool(self.running),
            full_sequence_must_fit=self.scheduler_reserve_full_isl,
        )


class StateReadyScheduler(StateReadyMixin, Scheduler):
    """vLLM's `Scheduler` with state-ready traversal; use it with `--no-async-scheduling`."""


class StateReadyAsyncScheduler(StateReadyMixin, AsyncScheduler):
    """vLLM's `AsyncScheduler` with state-ready traversal; the one to use when async scheduling is on."""
