"""Prometheus metrics of one server, in its own registry (two servers in one process never clash).

Every metric carries a `model_name` label first (as vLLM's do). Round measures (SPEC §9) are
observed on the engine thread after each round, and gauges are refreshed there after every change
of state (a round, an added or aborted request); request counters in the HTTP handlers
(prometheus-client is thread-safe). A new metric is one line in `__init__` through `_counter`,
`_gauge` or `_histogram`, which add the model label.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_ROUND_TIME = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_TOKEN_TIME = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0)
_LOOP_LAG = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _pow2_buckets(top: int) -> tuple[float, ...]:
    out, v = [], 1
    while v < top:
        out.append(float(v))
        v *= 2
    return (*out, float(top))


@dataclass(frozen=True)
class PoolUse:
    """One pool split the way `check_integrity()` counts it: held + cached + free = total."""

    held: int  # owned by running branches, not in the cache (private KV pages, working state slots)
    cached: int  # in the prefix cache (published or pending; maybe locked by running branches)
    free: int
    total: int


class _Labelled:
    """A metric family whose `model_name` label is already bound: `.labels(*other_labels)`."""

    def __init__(self, family, model_name: str) -> None:
        self._family = family
        self._model = model_name

    def labels(self, *values: str):
        return self._family.labels(self._model, *values)


class ServerMetrics:
    def __init__(self, max_num_seqs: int = 256, max_num_batched_tokens: int = 8192, model_name: str = "") -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self.rounds = self._counter("rounds", "non-empty worker calls (rounds K)")
        self.round_rows = self._histogram("round_rows", "rows (fragments) per round", _pow2_buckets(max_num_seqs))
        self.round_tokens = self._histogram("round_tokens", "scheduled tokens per round",
                                            _pow2_buckets(max_num_batched_tokens))
        self.round_seconds = self._histogram("round_host_seconds", "host time of one worker call c(B)", _ROUND_TIME)
        self.blocked = self._counter("blocked_deferrals", "waiting branches deferred as Blocked (SPEC §5)")
        self.prompt_tokens = self._counter("prompt_tokens", "prompt tokens of finished branches")
        self.cached_tokens = self._counter("cached_prompt_tokens", "prompt tokens served from the prefix cache")
        self.generation_tokens = self._counter("generation_tokens", "tokens sampled")
        self.reuse_rate = self._gauge("reuse_rate", "cached prompt tokens / prompt tokens so far")
        self.queue = self._gauge("queue_length", "branches by state; 'pending' = requests not yet started",
                                 ("state",))
        self.requests = self._counter("requests", "HTTP requests by endpoint and status", ("endpoint", "status"))
        self.latency = self._histogram("request_latency_seconds", "arrival to last branch finished", _LATENCY)
        self.ttft = self._histogram("time_to_first_token_seconds", "arrival to a branch's first token", _LATENCY)
        self.first_selection = self._histogram("first_selection_wait_seconds",
                                               "arrival to a branch's first selection", _LATENCY)
        self.tpot = self._histogram("time_per_output_token_seconds", "a finished branch's (last token - first "
                                    "token) / (output tokens - 1)", _TOKEN_TIME)
        self.itl = self._histogram("inter_token_latency_seconds", "time between two consecutive tokens of a "
                                   "branch", _TOKEN_TIME)
        self.kv_pages = self._gauge("kv_pages", "KV pages: held by running branches, cached, free, total",
                                    ("kind",))
        self.state_slots = self._gauge("state_slots", "state snapshot slots: held by running branches, cached "
                                       "snapshots, free, total", ("kind",))
        self.warmup_pending = self._gauge("warmup_pending", "1 while the engine's lazy warm-up (the first forward, "
                                          "the probes) is left: it runs in quiet gaps; 0 once done")
        self.aborted = self._counter("aborted_requests", "requests aborted (client gone or error)")
        self.loop_lag = self._histogram("event_loop_lag_seconds", "how late the HTTP event loop wakes from a "
                                        "short sleep (a blocked loop shows here)", _LOOP_LAG)
        # SPEC §14: the prompt tokens of finished branches split by cause (they add up to prompt_tokens).
        self.prompt_by_cause = self._counter("prompt_tokens_by_cause", "prompt tokens by cause: ready_hit | "
                                             "checkpoint_missing | evicted | no_shared_prefix", ("cause",))
        self.identity_hit_tokens = self._counter("identity_hit_tokens", "ĥ: prompt tokens the index matched")
        self.blocked_wait = self._counter("blocked_wait_rounds", "rounds branches waited on a same-round "
                                          "producer before they started")
        # SPEC §15: in-forward hand-off.
        self.handoff_rows = self._counter("handoff_rows", "rows run as dependents of a same-forward producer "
                                          "(--handoff)")
        self.round_levels = self._histogram("round_levels", "recurrent levels per round (1: no dependent rows)",
                                            _pow2_buckets(16))
        self.handoff_seconds = self._counter("handoff_seconds", "host time spent in extra recurrent levels "
                                             "(measured by the engine)")
        self.handoff_choices = self._counter("handoff_choices", "consumers the hand-off rule handed off, left "
                                             "waiting or recomputed (--handoff auto: by the engine's measured "
                                             "costs)", ("choice",))
        self.handoff_predicted = self._counter("handoff_predicted_seconds", "the engine's calibrated prediction "
                                               "of its extra levels' time (beside handoff_seconds, measured)")
        self.handoff_level0 = self._counter("handoff_level0_seconds", "the extra levels' rows priced at level 0 "
                                            "by the engine's fit (handoff_seconds less this: their marginal cost)")
        self.handoff_fold = self._counter("handoff_fold_seconds", "what dependents folded into their producer's "
                                          "scan added (they open no extra level), as the engine's calibrated fold "
                                          "fit predicted it before each forward")
        self.handoff_fold_measured = self._counter("handoff_fold_measured_seconds", "the same folds timed inside the "
                                                   "scans (their own scan calls and state copies; CPU time on "
                                                   "one scan thread), beside handoff_fold_seconds")
        self._prompt = 0
        self._cached = 0

    # ------------------------------------------------------------------ declaring
    def _labelled(self, cls, name: str, doc: str, labels: tuple[str, ...], **kw):
        family = cls("radixflow_" + name, doc, ("model_name", *labels), registry=self.registry, **kw)
        return _Labelled(family, self.model_name) if labels else family.labels(self.model_name)

    def _counter(self, name: str, doc: str, labels: tuple[str, ...] = ()):
        return self._labelled(Counter, name, doc, labels)

    def _gauge(self, name: str, doc: str, labels: tuple[str, ...] = ()):
        return self._labelled(Gauge, name, doc, labels)

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...], labels: tuple[str, ...] = ()):
        return self._labelled(Histogram, name, doc, labels, buckets=buckets)

    # ------------------------------------------------------------------ observing
    def observe_round(self, rows: int, tokens: int, host_time: float, blocked: int, handoff_rows: int = 0,
                      levels: int = 1, handoff_time: float = 0.0) -> None:
        self.rounds.inc()
        self.round_rows.observe(rows)
        self.round_tokens.observe(tokens)
        self.round_seconds.observe(host_time)
        self.round_levels.observe(levels)
        if blocked:
            self.blocked.inc(blocked)
        if handoff_rows:
            self.handoff_rows.inc(handoff_rows)
        if handoff_time:
            self.handoff_seconds.inc(handoff_time)

    def observe_handoff(self, choices: dict[str, int], predicted: float, level0: float = 0.0,
                        fold: float = 0.0, fold_measured: float = 0.0) -> None:
        """One round's hand-off choices (counts by choice), the predicted time of its extra levels,
        their rows priced at level 0 (engine/calibration.py `level0_equivalent`) and what its folded
        dependents added to their producers' scans, predicted (`EngineExecutor.fold_time`) and measured
        (`EngineExecutor.fold_measured`)."""
        if fold > 0:
            self.handoff_fold.inc(fold)
        if fold_measured > 0:
            self.handoff_fold_measured.inc(fold_measured)
        for choice, n in choices.items():
            if n:
                self.handoff_choices.labels(choice).inc(n)
        if predicted:
            self.handoff_predicted.inc(predicted)
        if level0 > 0:
            self.handoff_level0.inc(level0)

    def observe_branch(self, prompt: int, cached: int, generated: int, ttft: float | None,
                       first_selection: float | None) -> None:
        self.prompt_tokens.inc(prompt)
        self.cached_tokens.inc(cached)
        self.generation_tokens.inc(generated)
        self._prompt += prompt
        self._cached += cached
        self.reuse_rate.set(self._cached / self._prompt if self._prompt else 0.0)
        if ttft is not None:
            self.ttft.observe(ttft)
        if first_selection is not None:
            self.first_selection.observe(first_selection)

    def observe_misses(self, misses) -> None:
        """A finished branch's `core.misses.Misses` (None when it never started)."""
        if misses is None:
            return
        for cause in ("ready_hit", "checkpoint_missing", "evicted", "no_shared_prefix"):
            self.prompt_by_cause.labels(cause).inc(getattr(misses, cause))
        self.identity_hit_tokens.inc(misses.identity_hit)
        self.blocked_wait.inc(misses.blocked_rounds)

    def set_pools(self, pages: PoolUse, slots: PoolUse) -> None:
        for gauge, use in ((self.kv_pages, pages), (self.state_slots, slots)):
            for kind in ("held", "cached", "free", "total"):
                gauge.labels(kind).set(getattr(use, kind))

    def set_queues(self, pending: int, held: int, waiting: int, running: int) -> None:
        for name, v in (("pending", pending), ("held", held), ("waiting", waiting), ("running", running)):
            self.queue.labels(name).set(v)

    def render(self) -> bytes:
        return generate_latest(self.registry)
