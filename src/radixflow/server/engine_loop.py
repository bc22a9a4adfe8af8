"""The engine thread: the only thread that touches the Engine; HTTP handlers talk to it by queue.

Handlers call `submit` / `abort` / `call`, which put commands in the inbox; the thread applies them
between rounds, runs `engine.step(now)` on the wall clock (`time.monotonic()`), and sends each
request's events back to the handler's asyncio loop with `call_soon_threadsafe`. When a step returns
an empty batch while work is held by admission (flexible admission's 5 ms deadline), the thread
sleeps until `idle_until()` or the next command, whichever comes first.
"""

from __future__ import annotations

import concurrent.futures
import gc
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from radixflow.core.branch import Branch, LogicalRequest
from radixflow.engine.engine import Engine, EngineConfig
from radixflow.server.errors import APIError
from radixflow.server.metrics import PoolUse, ServerMetrics

log = logging.getLogger("radixflow.server")
# A warm-up probe step (up to a forward at real size) runs only after this long without a request step, so a
# client's next request, sent right after the last answer, never queues behind one (docs/server.md "Start-up").
WARM_QUIET_S = 2.0
_KEEP = 4096  # finished branches / round records kept by the scheduler before trimming


@dataclass
class Delta:
    """New tokens of one branch since the last event (streaming requests only)."""

    index: int
    token_ids: list[int]
    logprobs: list[float | None]
    top_logprobs: list[list[tuple[int, float]] | None]


@dataclass
class Finished:
    """The request is done; the engine no longer touches its branches."""

    request: LogicalRequest


@dataclass
class Failed:
    error: APIError


Event = Delta | Finished | Failed


@dataclass
class _TokenTimes:
    seen: int = 0  # output tokens already timed
    first: float | None = None
    last: float | None = None


@dataclass(eq=False)
class Submission:
    request_id: str
    branches: list[Branch]
    send: Callable[[Event], None]  # thread-safe: delivers into the handler's event queue
    stream: bool = False
    sent: list[int] = field(default_factory=list)  # tokens already sent, per branch
    started: bool = False
    timing: list[_TokenTimes] = field(default_factory=list)  # per branch: for TPOT and inter-token latency


class EngineLoop:
    def __init__(self, config: EngineConfig, metrics: ServerMetrics, max_queue: int = 1024,
                 torch_threads: int | None = None) -> None:
        self.config = config
        self.torch_threads = torch_threads
        self.metrics = metrics
        self.max_queue = max_queue
        self.engine: Engine | None = None
        self.load_error: BaseException | None = None
        self.ready = threading.Event()
        self._clock = time.monotonic  # the quiet gap's clock (tests give their own)
        self._busy_at = float("-inf")  # when the engine last stepped a request (on _clock)
        self.draining = False
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pending = 0  # accepted requests none of whose branches has been selected yet
        self._choices_seen: dict[str, int] = {}  # hand-off choices and calibration log entries reported so far
        self._log_seen = 0
        self._levels_seen = 0  # entries of the calibration's levels_log reported so far
        self._fold_seen = (0.0, 0.0)  # the executor's fold_time and fold_measured reported so far
        self._in_flight = 0  # accepted requests not finished, failed or aborted
        self._live: dict[str, Submission] = {}  # engine thread only
        self._thread = threading.Thread(target=self._main, name="radixflow-engine", daemon=True)
        # start-up phases (name, seconds) before this loop: the server's (commands/serve.py), then the engine's
        self.startup: list[tuple[str, float]] = []
        self.started_at: float | None = None  # time.monotonic() at the process's start, if known
        self.startup_mark: float | None = None  # time.monotonic() at the end of those phases, if known

    # ================================================================== handler side
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread.is_alive():
            self._inbox.put(("stop",))
            self._thread.join(timeout)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def pending(self) -> int:
        return self._pending

    def check_available(self) -> Engine:
        """The engine, or a 503 while loading, after a failed load, or while draining."""
        if self.load_error is not None:
            raise APIError(503, f"model failed to load: {self.load_error}", None, "load_failed")
        if not self.ready.is_set() or self.engine is None:
            raise APIError(503, "the model is still loading; retry shortly", None, "loading")
        if self.draining:
            raise APIError(503, "the server is shutting down and accepts no new requests", None, "draining")
        return self.engine

    def submit(self, sub: Submission) -> None:
        """Queues a logical request, or raises 429 when `max_queue` requests are not yet started."""
        self.check_available()
        with self._lock:
            if self._pending >= self.max_queue:
                raise APIError(429, f"the admission queue is full ({self.max_queue} requests waiting to "
                                    f"start); retry later", None, "queue_full")
            self._pending += 1
            self._in_flight += 1
        sub.sent = [0] * len(sub.branches)
        sub.timing = [_TokenTimes() for _ in sub.branches]
        self._inbox.put(("add", sub))

    def abort(self, request_id: str) -> None:
        """Asks the engine thread to drop the request and free its pages and snapshots."""
        self._inbox.put(("abort", request_id))

    def fail_all(self, error: APIError) -> None:
        """Fails every request in flight with `error` (the drain timeout ran out)."""
        self._inbox.put(("fail", error))

    def call(self, fn: Callable[[Engine], object]) -> concurrent.futures.Future:
        """Runs fn(engine) on the engine thread between rounds (debug checks, tests)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put(("call", fn, fut))
        return fut

    # ================================================================== engine thread
    def _main(self) -> None:
        if self.torch_threads:  # per thread: only the engine's intra-op pool changes
            torch.set_num_threads(self.torch_threads)
        t0 = time.monotonic()
        if self.startup_mark is not None:
            self.startup.append(("server: app, uvicorn, engine thread", t0 - self.startup_mark))
        try:
            self.engine = Engine(self.config)
        except BaseException as e:  # reported as 503 on every call and by /health
            log.exception("model failed to load", extra={"trusted": True})  # no request text in it
            self.load_error = e
            return
        # As vLLM's server does after start-up: the model's objects move out of the collector's
        # reach, so a full collection (triggered by a request that builds 100k branches) scans only
        # what requests made, instead of stopping every thread for ~0.4 s.
        gc.freeze()
        self._log_startup(time.monotonic() - t0)
        try:
            self._serve()
        finally:
            # Frozen objects are never collected, not even at interpreter exit: nanobind modules among
            # them (triton's, imported by torch._dynamo when the model is built on the meta device)
            # would then report themselves leaked on every shutdown.
            gc.unfreeze()

    def _serve(self) -> None:
        eng = self.engine
        sc = eng.scheduler
        self._update_gauges()
        self._open()
        log.info("model %s loaded: ready", self.config.model)
        progressed = True
        while True:
            if not self._apply_commands(self._wait_time(progressed)):
                break
            if not eng.has_unfinished:  # an abort or a refused add may have left the engine idle
                if eng.warming and self._quiet_for() >= WARM_QUIET_S:  # one warm-up probe step (a scan
                    self._warm_step()  # layout or a forward), only once no request came for a while
                self._update_gauges()
                progressed = True
                continue
            try:
                blocked_before = sc.blocked_total
                batch, finished = eng.step(time.monotonic())
            except Exception as e:  # an engine bug: fail what is in flight, keep serving
                log.exception("engine step failed")
                self._fail_all(APIError(500, f"engine error: {e}", None, "engine_error"))
                progressed = True
                continue
            progressed = bool(batch)
            self._busy_at = self._clock()
            if batch:
                self._after_round(batch, finished, sc.blocked_total - blocked_before)
            elif eng.idle_until() is None:
                self._fail_all(APIError(500, "the engine could not schedule the waiting requests", None,
                                        "unschedulable"))
            self._update_gauges()
        self._fail_all(APIError(503, "the server stopped", None, "stopped"))

    def _open(self) -> None:
        """Ready: /health answers 200. The quiet gap counts from here too: a client that sends its first
        request as soon as /health answers never queues behind a warm-up probe step (before, the gap counted
        from -inf and the probes started at once: a serve_peers run's first question waited behind them)."""
        self._busy_at = self._clock()
        self.ready.set()

    def _log_startup(self, engine_seconds: float) -> None:
        """One line per start-up phase, with its seconds (docs/server.md "Start-up")."""
        eng = self.engine
        for name, secs in self.startup:
            log.info("start-up: %-44s %6.2f s", name, secs)
        for name, secs in eng.startup:
            log.info("start-up: %-44s %6.2f s", name, secs)
        other = engine_seconds - sum(s for _, s in eng.startup)
        log.info("start-up: %-44s %6.2f s", "engine: the rest (scheduler, tokenizer)", max(other, 0.0))
        if self.started_at is not None:
            log.info("start-up: ready %.2f s after the process started", time.monotonic() - self.started_at)
        log.info("pools built: %s", eng.pools.describe())
        if eng.warming:
            log.info("warm-up probes pending (%s): they run between requests; until then levels run the "
                     "default scan chunk and --handoff auto hands off without a cost model", eng.warmup_state())

    def _quiet_for(self) -> float:
        """Seconds since the engine last stepped a request (a warm-up probe step waits for WARM_QUIET_S)."""
        return self._clock() - self._busy_at

    def _warm_step(self) -> None:
        eng = self.engine
        before = dict(eng.warmup.source) if eng.warmup is not None else {}
        done = len(eng.startup)
        eng.warm_step()
        for name, secs in eng.startup[done:]:
            log.info("start-up: %-44s %6.2f s", name, secs)
        for k in eng.warmup.source if eng.warmup is not None else ():
            if k not in before:
                w = eng.warmup
                saved, others = w.saved.get(k), w.disturbed.get(k)
                note = f", kept in {saved}" if saved else ""
                if others is not None:  # every attempt ran beside other processes' work: used, not kept
                    note = (f"; other processes used {others:.2f} cores during each of its {w.attempts[k]} "
                            "attempts: used by this server, not kept on disk (probed again on the next start)")
                log.info("warm-up probe %s done after ready: %.1f s%s", k, w.seconds.get(k, 0.0), note)

    def _wait_time(self, progressed: bool) -> float | None:
        eng = self.engine
        if not eng.has_unfinished:  # block until a command, or until it is quiet enough for a probe step
            return max(0.0, WARM_QUIET_S - self._quiet_for()) if eng.warming else None
        if progressed:
            return 0.0
        deadline = eng.idle_until()
        return 0.0 if deadline is None else max(0.0, deadline - time.monotonic())

    def _apply_commands(self, timeout: float | None) -> bool:
        """Applies every queued command, waiting up to `timeout` for the first; False on stop."""
        try:
            cmd = self._inbox.get(timeout=timeout) if timeout != 0.0 else self._inbox.get_nowait()
        except queue.Empty:
            return True
        while True:
            if cmd[0] == "stop":
                return False
            self._apply(cmd)
            try:
                cmd = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _apply(self, cmd: tuple) -> None:
        kind = cmd[0]
        if kind == "add":
            sub: Submission = cmd[1]
            try:
                self.engine.add(sub.branches)
            except ValueError as e:
                self._close(sub, Failed(APIError(400, str(e), "prompt", "invalid_value")))
                return
            self._live[sub.request_id] = sub
        elif kind == "abort":
            sub = self._live.get(cmd[1])
            if sub is not None:
                self.engine.abort(sub.request_id)
                self.metrics.aborted.inc()
                self._close(sub, None)
        elif kind == "fail":
            self._fail_all(cmd[1])
        elif kind == "call":
            _, fn, fut = cmd
            try:
                fut.set_result(fn(self.engine))
            except BaseException as e:
                fut.set_exception(e)

    def _observe_handoff(self) -> None:
        """The hand-off rule's choices and the predicted time of the levels run since the last round."""
        choices = self.engine.scheduler.handoff_choices
        cal = self.engine.executor.calibration
        log = cal.log if cal is not None else []
        levels = cal.levels_log if cal is not None else []
        start = min(self._log_seen, len(log))
        start_levels = min(self._levels_seen, len(levels))
        ex = self.engine.executor
        fold = (ex.fold_time, ex.fold_measured)
        self.metrics.observe_handoff({k: v - self._choices_seen.get(k, 0) for k, v in choices.items()},
                                     sum(p for p, *_ in log[start:]), sum(e for _, e in levels[start_levels:]),
                                     fold[0] - self._fold_seen[0], fold[1] - self._fold_seen[1])
        self._choices_seen, self._log_seen, self._levels_seen = choices, len(log), len(levels)
        self._fold_seen = fold

    def _after_round(self, batch, finished: list[LogicalRequest], blocked: int) -> None:
        rec = self.engine.scheduler.rounds[-1]
        self.metrics.observe_round(batch.num_rows, batch.num_tokens, rec.host_time, blocked, rec.handoff_rows,
                                   rec.levels, rec.handoff_time)
        self._observe_handoff()
        now = time.monotonic()
        for rid in {f.branch.request_id for f in batch.fragments}:
            sub = self._live.get(rid)
            if sub is None:
                continue
            if not sub.started:
                self._mark_started(sub)
            self._time_tokens(sub, now)
            if sub.stream:
                self._send_deltas(sub)
        for req in finished:
            sub = self._live.get(req.request_id)
            if sub is not None:
                self._observe_finished(sub, req)
                self._close(sub, Finished(req))
        self._trim_history()

    def _trim_history(self) -> None:
        """The scheduler keeps every finished branch and round record (the simulator reads them at
        the end); a server runs for days, and its metrics already hold what it needs."""
        sc = self.engine.scheduler
        if len(sc.finished) > _KEEP:
            sc.finished.clear()
        if len(sc.rounds) > _KEEP:
            del sc.rounds[:-1]

    def _send_deltas(self, sub: Submission) -> None:
        for i, b in enumerate(sub.branches):
            n = len(b.output)
            if n > sub.sent[i]:
                st = b.user_data
                lo = sub.sent[i]
                sub.sent[i] = n
                self._send(sub, Delta(b.index, list(b.output[lo:n]), list(st.logprobs[lo:n]),
                                      list(st.top_logprobs[lo:n])))

    def _time_tokens(self, sub: Submission, now: float) -> None:
        """Inter-token latency: one gap per new token (a round gives a branch at most one today)."""
        for b, t in zip(sub.branches, sub.timing):
            n = len(b.output)
            if n <= t.seen:
                continue
            if t.last is not None:
                gap = (now - t.last) / (n - t.seen)
                for _ in range(n - t.seen):
                    self.metrics.itl.observe(gap)
            else:
                t.first = now
            t.seen, t.last = n, now

    def _observe_finished(self, sub: Submission, req: LogicalRequest) -> None:
        m = self.metrics
        for t in sub.timing:
            if t.seen > 1:
                m.tpot.observe((t.last - t.first) / (t.seen - 1))
        for b in req.branches:
            ttft = None if b.first_token_at is None else b.first_token_at - b.arrival
            sel = None if b.first_selected_at is None else b.first_selected_at - b.arrival
            m.observe_branch(b.prompt_len, b.cached_tokens or 0, len(b.output), ttft, sel)
            m.observe_misses(b.misses)
        if req.latency is not None:
            m.latency.observe(req.latency)

    def _mark_started(self, sub: Submission) -> None:
        sub.started = True
        with self._lock:
            self._pending -= 1

    def _close(self, sub: Submission, event: Event | None) -> None:
        """Ends a request's life in the loop: counters, and its last event (if any)."""
        self._live.pop(sub.request_id, None)
        with self._lock:
            if not sub.started:
                self._pending -= 1
                sub.started = True
            self._in_flight -= 1
        if event is not None:
            self._send(sub, event)

    def _send(self, sub: Submission, event: Event) -> None:
        try:
            sub.send(event)
        except RuntimeError:  # the handler's event loop is gone (server shutting down)
            pass

    def _fail_all(self, error: APIError) -> None:
        for sub in list(self._live.values()):
            if self.engine is not None:
                self.engine.abort(sub.request_id)
            self._close(sub, Failed(error))

    def _update_gauges(self) -> None:
        sc = self.engine.scheduler
        self.metrics.set_queues(self._pending, len(sc.held), len(sc.waiting), len(sc.running))
        self.metrics.set_pools(*pool_use(sc))
        self.metrics.warmup_pending.set(1 if self.engine.warming else 0)


def pool_use(sc) -> tuple[PoolUse, PoolUse]:
    """KV pages and state slots of a scheduler as held / cached / free / total."""
    cached_pages, cached_slots = sc.index.num_cached_pages, sc.index.num_snapshots
    pages = PoolUse(sc.pages.num_used - cached_pages, cached_pages, sc.pages.num_free, sc.pages.capacity)
    slots = PoolUse(sc.slots.num_used - cached_slots, cached_slots, sc.slots.num_free, sc.slots.capacity)
    return pages, slots
