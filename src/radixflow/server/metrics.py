"""Prometheus metrics of one server, in its own registry (two servers in one process never clash).

Round measures (SPEC §9) are observed on the engine thread after each round; request counters in the
HTTP handlers (prometheus-client is thread-safe).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_ROUND_TIME = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def _pow2_buckets(top: int) -> tuple[float, ...]:
    out, v = [], 1
    while v < top:
        out.append(float(v))
        v *= 2
    return (*out, float(top))


class ServerMetrics:
    def __init__(self, max_num_seqs: int = 256, max_num_batched_tokens: int = 8192) -> None:
        self.registry = r = CollectorRegistry()
        p = "radixflow_"
        self.rounds = Counter(p + "rounds", "non-empty worker calls (rounds K)", registry=r)
        self.round_rows = Histogram(p + "round_rows", "rows (fragments) per round",
                                    buckets=_pow2_buckets(max_num_seqs), registry=r)
        self.round_tokens = Histogram(p + "round_tokens", "scheduled tokens per round",
                                      buckets=_pow2_buckets(max_num_batched_tokens), registry=r)
        self.round_seconds = Histogram(p + "round_host_seconds", "host time of one worker call c(B)",
                                       buckets=_ROUND_TIME, registry=r)
        self.blocked = Counter(p + "blocked_deferrals", "waiting branches deferred as Blocked (SPEC §5)",
                               registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "prompt tokens of finished branches", registry=r)
        self.cached_tokens = Counter(p + "cached_prompt_tokens", "prompt tokens served from the prefix cache",
                                     registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "tokens sampled", registry=r)
        self.reuse_rate = Gauge(p + "reuse_rate", "cached prompt tokens / prompt tokens so far", registry=r)
        self.queue = Gauge(p + "queue_length", "branches by state; 'pending' = requests not yet started",
                           ["state"], registry=r)
        self.requests = Counter(p + "requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.latency = Histogram(p + "request_latency_seconds", "arrival to last branch finished",
                                 buckets=_LATENCY, registry=r)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "arrival to a branch's first token",
                              buckets=_LATENCY, registry=r)
        self.first_selection = Histogram(p + "first_selection_wait_seconds", "arrival to a branch's first "
                                         "selection", buckets=_LATENCY, registry=r)
        self.kv_pages = Gauge(p + "kv_pages", "KV pages: in use (cached or held) and total", ["kind"],
                              registry=r)
        self.state_slots = Gauge(p + "state_slots", "state snapshot slots: in use and total", ["kind"],
                                 registry=r)
        self.aborted = Counter(p + "aborted_requests", "requests aborted (client gone or error)", registry=r)
        # SPEC §14: the prompt tokens of finished branches split by cause (they add up to prompt_tokens).
        self.prompt_by_cause = Counter(p + "prompt_tokens_by_cause", "prompt tokens by cause: ready_hit | "
                                       "checkpoint_missing | evicted | no_shared_prefix", ["cause"], registry=r)
        self.identity_hit_tokens = Counter(p + "identity_hit_tokens", "ĥ: prompt tokens the index matched",
                                           registry=r)
        self.blocked_wait = Counter(p + "blocked_wait_rounds", "rounds branches waited on a same-round "
                                    "producer before they started", registry=r)
        self._prompt = 0
        self._cached = 0

    def observe_round(self, rows: int, tokens: int, host_time: float, blocked: int) -> None:
        self.rounds.inc()
        self.round_rows.observe(rows)
        self.round_tokens.observe(tokens)
        self.round_seconds.observe(host_time)
        if blocked:
            self.blocked.inc(blocked)

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

    def set_pools(self, pages_used: int, pages_total: int, slots_used: int, slots_total: int) -> None:
        self.kv_pages.labels("used").set(pages_used)
        self.kv_pages.labels("total").set(pages_total)
        self.state_slots.labels("used").set(slots_used)
        self.state_slots.labels("total").set(slots_total)

    def set_queues(self, pending: int, held: int, waiting: int, running: int) -> None:
        for name, v in (("pending", pending), ("held", held), ("waiting", waiting), ("running", running)):
            self.queue.labels(name).set(v)

    def render(self) -> bytes:
        return generate_latest(self.registry)
