"""Agentic sessions (SPEC §10, RR-Evict) and the closed-loop driver that runs any session workload.

A session is a transcript that grows call by call: each call's prompt is the whole transcript so far
(the agent's history), its answer joins the transcript, and the next call arrives only after the
previous one finished plus a tool latency. `run_sessions` drives this through the same Scheduler and
executor as `run_trace` (which is open-loop: its arrivals are fixed in advance).

The answers are scripted (`ScriptedExecutor`): their tokens are part of the session from the start,
so two eviction policies see exactly the same prompts and only the cache differs.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field

from radixflow.core.batch import Batch, ExecResult, Sample
from radixflow.core.branch import Branch
from radixflow.core.metrics import mean, percentile
from radixflow.core.scheduler import Scheduler
from radixflow.workloads.trace import segment_tokens

TOOL_LATENCIES = ("exp", "fixed", "uniform", "lognormal")


@dataclass(frozen=True)
class CallSpec:
    prompt_end: int  # the call's prompt is session.tokens[:prompt_end]
    output_len: int  # its answer is the next output_len tokens of the transcript
    delay: float  # seconds from the previous call's end (from t=0 for the first call) to its arrival


@dataclass
class Session:
    sid: str
    namespace: str
    tokens: tuple[int, ...]
    calls: list[CallSpec]
    shared_len: int = 0  # leading tokens shared with other sessions (the system prompt)


@dataclass
class CallRecord:
    """One finished call: what it asked for and what the cache gave it."""

    sid: str
    call: int
    arrival: float
    finished: float
    prompt_len: int
    output_len: int
    cached: int  # h: the tokens it resumed from
    identity_hit: int  # ĥ: the index's longest match
    ttft: float
    prev_cached: int | None  # tokens of this history cached when its previous call ended
    shared_len: int = 0

    @property
    def uncached(self) -> int:
        return self.prompt_len - self.cached

    @property
    def kept_fraction(self) -> float | None:
        """Share of the returning history (beyond the shared prefix) still cached at this call."""
        if self.prev_cached is None or self.prev_cached <= self.shared_len:
            return None
        kept = (min(self.cached, self.prev_cached) - self.shared_len) / (self.prev_cached - self.shared_len)
        return max(0.0, kept)


@dataclass
class SessionRun:
    calls: list[CallRecord]
    makespan: float
    evicted_tokens: int
    scheduler: Scheduler = field(repr=False)


# ----------------------------------------------------------------------------- executor
class ScriptedExecutor:
    """Wraps an executor (for timing); the tokens sampled are the session's scripted answer."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def execute(self, batch: Batch) -> ExecResult:
        res = self.inner.execute(batch)
        for i, f in enumerate(batch.fragments):
            script = f.branch.user_data
            if f.samples and script is not None:
                res.samples[i] = Sample(script[len(f.branch.output)])
        return res


# ----------------------------------------------------------------------------- closed-loop driver
def run_sessions(scheduler: Scheduler, executor, sessions: list[Session], on_round=None) -> SessionRun:
    """Runs every call of every session; a call arrives `delay` after its predecessor finished."""
    executor = ScriptedExecutor(executor)
    arrivals = [(s.calls[0].delay, i, 0) for i, s in enumerate(sessions) if s.calls]
    heapq.heapify(arrivals)
    prev_cached: dict[int, int] = {}
    started: dict[int, tuple[int, int]] = {}  # branch uid -> (session, call)
    records: list[CallRecord] = []
    bs = scheduler.block_size
    now = arrivals[0][0] if arrivals else 0.0
    while arrivals or scheduler.has_unfinished:
        while arrivals and arrivals[0][0] <= now + 1e-12:
            t, si, ci = heapq.heappop(arrivals)
            s, c = sessions[si], sessions[si].calls[ci]
            b = Branch(f"{s.sid}/{ci}", 0, s.tokens[: c.prompt_end], s.namespace, t, c.output_len,
                       user_data=s.tokens[c.prompt_end : c.prompt_end + c.output_len])
            scheduler.add(b)
            started[b.uid] = (si, ci)
        deadline = scheduler.admit(now)
        batch = scheduler.schedule(now)
        if not batch:
            nxt = [x for x in (arrivals[0][0] if arrivals else None, deadline) if x is not None]
            if not nxt:
                raise RuntimeError(f"stuck at t={now:.3f}s: {len(scheduler.waiting)} waiting, "
                                   f"{len(scheduler.running)} running (is the cache smaller than one call?)")
            now = max(now, min(nxt))
            continue
        result = executor.execute(batch)
        now += result.host_time
        for b in scheduler.complete(batch, result, now):
            si, ci = started.pop(b.uid)
            s = sessions[si]
            records.append(CallRecord(s.sid, ci, b.arrival, now, b.prompt_len, len(b.output),
                                      b.cached_tokens or 0, b.identity_hit or 0, b.first_token_at - b.arrival,
                                      prev_cached.get(si), s.shared_len))
            # What this history leaves in the cache: every full page it computed (the last token's
            # KV is never computed), as a decode would leave it.
            prev_cached[si] = (b.num_tokens - 1) // bs * bs
            if ci + 1 < len(s.calls):
                heapq.heappush(arrivals, (now + s.calls[ci + 1].delay, si, ci + 1))
        if on_round is not None:
            on_round(scheduler, batch)
    return SessionRun(records, now, scheduler.index.evicted_pages * bs, scheduler)


# ----------------------------------------------------------------------------- agentic generator
@dataclass(frozen=True)
class AgenticSpec:
    """n agents sharing a system prompt; each call appends a tool result and generates an answer."""

    n_agents: int = 32
    idle_fraction: float = 0.75  # s: share of its time an agent waits on tools (n_a ≈ (1 − s)·n)
    calls: int = 12  # calls per agent
    system_len: int = 256  # shared system prompt
    context_len: int = 2048  # agent-private history before its first call (task, files)
    append_len: int = 64  # tokens appended per call (tool result + instruction)
    output_len: int = 16  # tokens generated per call; they join the history
    tool_latency: str = "exp"  # exp | fixed | uniform | lognormal
    tool_latency_mean: float | None = None  # seconds; None: call_time · s / (1 − s)
    call_time: float = 1.0  # one call's service time estimate, used when tool_latency_mean is None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_agents < 1 or self.calls < 1:
            raise ValueError("agentic workload: --agents and --calls must be >= 1")
        if not 0 <= self.idle_fraction < 1:
            raise ValueError(f"--idle-fraction must be in [0, 1), got {self.idle_fraction}")
        if self.tool_latency not in TOOL_LATENCIES:
            raise ValueError(f"unknown tool latency {self.tool_latency!r}; "
                             f"choose from {', '.join(TOOL_LATENCIES)}")
        if self.output_len < 1 or self.append_len < 1 or self.system_len < 0 or self.context_len < 0:
            raise ValueError("agentic workload: lengths must be >= 0 (append and output >= 1)")

    @property
    def active_fraction(self) -> float:
        return 1.0 - self.idle_fraction

    @property
    def mean_tool_latency(self) -> float:
        if self.tool_latency_mean is not None:
            return self.tool_latency_mean
        return self.call_time * self.idle_fraction / max(1e-9, 1.0 - self.idle_fraction)


def sample_latency(kind: str, mean: float, rng: random.Random) -> float:
    if kind == "exp":
        return rng.expovariate(1.0 / mean) if mean > 0 else 0.0
    if kind == "fixed":
        return mean
    if kind == "uniform":
        return rng.uniform(0.5 * mean, 1.5 * mean)
    sigma = 0.75  # lognormal with this shape and the given mean
    return rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma) if mean > 0 else 0.0


def agentic_sessions(spec: AgenticSpec) -> list[Session]:
    rng = random.Random(spec.seed)
    mean = spec.mean_tool_latency
    system = segment_tokens("agentic:system", spec.system_len)
    out = []
    for a in range(spec.n_agents):
        tag = f"agentic:{spec.seed}:a{a}"
        toks = list(system) + list(segment_tokens(f"{tag}:ctx", spec.context_len))
        calls = []
        for c in range(spec.calls):
            toks += segment_tokens(f"{tag}:c{c}:in", spec.append_len)
            # First calls are spread over one whole cycle so the run starts close to steady state.
            if c == 0:
                delay = rng.uniform(0, mean + spec.call_time)
            else:
                delay = sample_latency(spec.tool_latency, mean, rng)
            calls.append(CallSpec(len(toks), spec.output_len, delay))
            toks += segment_tokens(f"{tag}:c{c}:out", spec.output_len)
        out.append(Session(f"agent{a}", "agentic", tuple(toks), calls, spec.system_len))
    return out


# ----------------------------------------------------------------------------- measures
@dataclass
class EvictionMeasures:
    eviction: str
    calls: int
    ttft_mean: float
    ttft_p50: float
    ttft_p99: float
    uncached_mean: float
    uncached_p99: float
    hit_rate: float  # percent of prompt tokens served from cache
    evicted_tokens: int
    kept_mean: float  # mean kept fraction of returning histories
    kept_all_or_nothing: float  # share of returning calls that kept < 5 % or > 95 % of their history
    makespan: float
    # The same over returning calls only: a session's first call is cold under every policy.
    returning_ttft_mean: float = float("nan")
    returning_ttft_p99: float = float("nan")
    returning_uncached_mean: float = float("nan")
    returning_uncached_p99: float = float("nan")


def measure_sessions(name: str, run: SessionRun) -> EvictionMeasures:
    calls = run.calls
    ttft = [c.ttft for c in calls]
    unc = [c.uncached for c in calls]
    prompt = sum(c.prompt_len for c in calls)
    kept = [k for k in (c.kept_fraction for c in calls) if k is not None]
    back = [c for c in calls if c.prev_cached is not None]
    return EvictionMeasures(
        eviction=name, calls=len(calls), ttft_mean=mean(ttft), ttft_p50=percentile(ttft, 0.5),
        ttft_p99=percentile(ttft, 0.99), uncached_mean=mean(unc), uncached_p99=percentile(unc, 0.99),
        hit_rate=100.0 * sum(c.cached for c in calls) / prompt if prompt else 0.0,
        evicted_tokens=run.evicted_tokens, kept_mean=mean(kept),
        kept_all_or_nothing=mean(1.0 if k < 0.05 or k > 0.95 else 0.0 for k in kept),
        makespan=run.makespan,
        returning_ttft_mean=mean(c.ttft for c in back), returning_ttft_p99=percentile([c.ttft for c in back], 0.99),
        returning_uncached_mean=mean(c.uncached for c in back),
        returning_uncached_p99=percentile([c.uncached for c in back], 0.99))


@dataclass
class SteadyState:
    """Inputs of the analytic model h = (m − n_a)/(n·s), measured over a window of a run."""

    n_active: float  # time-average of calls in flight
    n_idle: float  # time-average of agents between calls (n·s)
    capacity_units: float  # m: cache capacity in full-prefix units
    predicted_kept: float  # h
    measured_kept: float  # mean kept fraction of the calls returning inside the window
    returning_calls: int


def live_window(run: SessionRun, warmup: int = 2) -> tuple[float, float]:
    """The span where every session is past its first `warmup` calls and none has made its last."""
    by_session: dict[str, list[CallRecord]] = {}
    for c in run.calls:
        by_session.setdefault(c.sid, []).append(c)
    cs = [sorted(v, key=lambda c: c.call) for v in by_session.values()]
    t0 = max(v[min(warmup, len(v) - 1)].arrival for v in cs)
    t1 = min(v[-1].arrival for v in cs)
    if t1 <= t0:
        raise ValueError("the run has no steady-state window: give the agents more calls")
    return t0, t1


def steady_state(run: SessionRun, capacity_tokens: int,
                 window: tuple[float, float] | None = None) -> SteadyState:
    """Compares the measured kept fraction with h over `window` (seconds; default `live_window`).
    Prefixes exclude the shared system prompt, which is cached once for everyone."""
    t0, t1 = window or live_window(run)
    span = t1 - t0
    by_session: dict[str, list[CallRecord]] = {}
    for c in sorted(run.calls, key=lambda c: c.arrival):
        by_session.setdefault(c.sid, []).append(c)
    active = idle = 0.0
    for cs in by_session.values():
        for i, c in enumerate(cs):
            active += max(0.0, min(c.finished, t1) - max(c.arrival, t0))
            if i + 1 < len(cs):
                idle += max(0.0, min(cs[i + 1].arrival, t1) - max(c.finished, t0))
    inside = [c for c in run.calls if t0 <= c.arrival <= t1]
    shared = inside[0].shared_len if inside else 0
    unit = mean(c.prompt_len + c.output_len - shared for c in inside)
    m = (capacity_tokens - shared) / unit if inside else float("nan")
    n_a, n_i = active / span, idle / span
    kept = [k for k in (c.kept_fraction for c in inside) if k is not None]
    return SteadyState(n_a, n_i, m, min(1.0, max(0.0, (m - n_a) / n_i)) if n_i else float("nan"),
                       mean(kept), len(kept))


# ----------------------------------------------------------------------------- running policies
def full_prefix_unit(sessions: list[Session]) -> tuple[float, int]:
    """(mean private history of a call: prompt + answer − shared prefix, shared prefix length)."""
    shared = max((s.shared_len for s in sessions), default=0)
    lens = [c.prompt_end + c.output_len - s.shared_len for s in sessions for c in s.calls]
    return (sum(lens) / len(lens) if lens else 0.0), shared


def parse_capacity(text: str, sessions: list[Session]) -> int:
    """`N` tokens, or `Nx`: N full prefixes (mean private history per call) plus the shared prefix once."""
    t = str(text).strip().lower()
    try:
        if t.endswith("x"):
            unit, shared = full_prefix_unit(sessions)
            return int(shared + float(t[:-1]) * unit)
        return int(float(t))
    except ValueError:
        raise ValueError(f"--cache-capacity {text!r}: give tokens (e.g. 80000) "
                         f"or full prefixes (e.g. 24x)") from None


def simulate_policies(sessions: list[Session], model: str, gpu: str, evictions: list[str], capacity: str,
                      block_size: int = 16, max_num_seqs: int = 16, max_num_batched_tokens: int = 8192,
                      state_interval: int = 512, state_slots: int | None = None, check: bool = False) -> dict:
    """Runs the same sessions under each eviction policy; measures, steady state and p99 ratios."""
    from radixflow.config import SchedulerConfig
    from radixflow.core.policies import get_arm
    from radixflow.sim.cost_model import CostModel, get_gpu
    from radixflow.sim.executor import SimExecutor
    from radixflow.spec import get_spec

    spec = get_spec(model)
    cost = CostModel(spec, get_gpu(gpu))
    cap = parse_capacity(capacity, sessions)
    unit, shared = full_prefix_unit(sessions)
    longest = max((c.prompt_end + c.output_len for s in sessions for c in s.calls), default=0)
    if cap < longest + block_size:
        raise ValueError(f"--cache-capacity is {cap:,} tokens, less than the longest call ({longest:,} tokens "
                         f"with its answer): give at least {longest + block_size:,}")
    rows = []
    for ev in evictions:
        cfg = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                              block_size=block_size, state_interval=state_interval,
                              num_kv_pages=max(1, cap // block_size), eviction=ev)
        if state_slots is not None:
            cfg.num_state_slots = state_slots
        sched = Scheduler(cfg, get_arm("radix"), spec.is_hybrid)
        run = run_sessions(sched, SimExecutor(cost, spec.vocab_size), sessions,
                           on_round=(lambda s, b: s.check_integrity()) if check else None)
        row = vars(measure_sessions(ev, run))
        try:
            row["steady_state"] = vars(steady_state(run, cap))
        except ValueError:
            row["steady_state"] = None
        row["preemptions"] = sched.preemptions
        rows.append(row)
    ratios = []  # percent change of each policy against the first one
    for alt in rows[1:]:
        base = rows[0]
        r = {"baseline": base["eviction"], "policy": alt["eviction"]}
        for k in ("uncached_p99", "ttft_p99", "uncached_mean", "ttft_mean", "returning_uncached_p99",
                  "returning_ttft_p99", "returning_uncached_mean", "returning_ttft_mean"):
            r[k] = 100.0 * (alt[k] / base[k] - 1.0) if base[k] else float("nan")
        ratios.append(r)
    return {"capacity_tokens": cap, "full_prefix_unit": unit, "shared_prefix": shared, "policies": rows,
            "ratios": ratios}


# ----------------------------------------------------------------------------- CLI back end
def add_session_flags(p) -> None:
    """Flags of `radixflow simulate --workload agentic | multi-turn`."""
    g = p.add_argument_group("agentic and multi-turn workloads (--workload agentic | multi-turn)")
    g.add_argument("--eviction", default=None,
                   help="comma list of eviction policies to compare: lru | rr-tail | level-tail (:N = N pages per "
                        "chunk); default lru,rr-tail for these workloads, lru otherwise")
    g.add_argument("--cache-capacity", default=None,
                   help="KV cache size: N tokens, or Nx = N full prefixes (mean private history of a call, "
                        "prompt + answer, plus the shared system prompt once); default: sized from GPU memory")
    g.add_argument("--agents", type=int, default=32)
    g.add_argument("--calls", type=int, default=30, help="calls per agent")
    g.add_argument("--idle-fraction", type=float, default=0.75, help="s: share of time an agent waits on tools")
    g.add_argument("--tool-latency", default="exp", choices=TOOL_LATENCIES)
    g.add_argument("--tool-latency-mean", type=float, default=None,
                   help="seconds (default: call-time · s / (1 − s))")
    g.add_argument("--call-time", type=float, default=0.6, help="estimated seconds per call, for the default above")
    g.add_argument("--system-len", type=int, default=None, help="shared system prompt (agentic 128, chat 200)")
    g.add_argument("--context-len", type=int, default=2048, help="agent history before its first call")
    g.add_argument("--append-len", type=int, default=32, help="tokens appended per agent call")
    g.add_argument("--output-len", type=int, default=8, help="tokens generated per agent call")
    g.add_argument("--users", type=int, default=32, help="multi-turn: conversations")
    g.add_argument("--turns", type=int, default=5)
    g.add_argument("--user-len", type=int, default=80)
    g.add_argument("--assistant-len", type=int, default=150)
    g.add_argument("--think-time", type=float, default=5.0, help="multi-turn: mean seconds between turns")
    g.add_argument("--rewrite-fraction", type=float, default=0.0, help="multi-turn: users who rewrite turn 2")


SESSION_WORKLOADS = ("agentic", "multi-turn")
PUBLISHED = {"uncached_p99": -65.7, "ttft_p99": -75.4}  # RR-Evict vs LRU (SGLang, H100), SPEC §10


def simulate_cli(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from radixflow.cache.eviction import parse_evictions
    from radixflow.commands.common import write_json
    from radixflow.sim.cost_model import get_gpu, pool_sizes
    from radixflow.spec import get_spec
    from radixflow.workloads.multiturn import ChatSpec, chat_sessions

    if args.workload == "agentic":
        sessions = agentic_sessions(AgenticSpec(
            n_agents=args.agents, idle_fraction=args.idle_fraction, calls=args.calls,
            system_len=128 if args.system_len is None else args.system_len, context_len=args.context_len,
            append_len=args.append_len, output_len=args.output_len, tool_latency=args.tool_latency,
            tool_latency_mean=args.tool_latency_mean, call_time=args.call_time, seed=args.seed))
    else:
        sessions = chat_sessions(ChatSpec(
            system_len=200 if args.system_len is None else args.system_len, user_len=args.user_len,
            assistant_len=args.assistant_len, turns=args.turns, users=args.users, think_time=args.think_time,
            rewrite_fraction=args.rewrite_fraction, seed=args.seed))
    evictions = parse_evictions(args.eviction or "lru,rr-tail")
    spec, gpu = get_spec(args.model), get_gpu(args.gpu)
    capacity, slots = args.cache_capacity, None
    if capacity is None:
        fraction = getattr(args, "state_memory_fraction", None)  # a fixed split here: half by default
        pages, slots = pool_sizes(spec, gpu, args.block_size, args.gpu_memory_utilization,
                                  0.5 if fraction is None else fraction)
        capacity = str(pages * args.block_size)
    out = simulate_policies(sessions, args.model, args.gpu, evictions, capacity, args.block_size,
                            args.max_num_seqs or 16, args.max_num_batched_tokens or 8192, args.state_interval,
                            slots if spec.is_hybrid else None, args.check)
    t = Table(title=f"{args.workload} on {spec.name} / {gpu.name}: cache {out['capacity_tokens']:,} tokens = "
                    f"{(out['capacity_tokens'] - out['shared_prefix']) / max(1.0, out['full_prefix_unit']):.1f} "
                    f"full prefixes of {out['full_prefix_unit']:,.0f} tokens")
    cols = [("eviction", "eviction", "{}"), ("calls", "calls", "{:,}"), ("hit %", "hit_rate", "{:.1f}"),
            ("TTFT mean s", "ttft_mean", "{:.3f}"), ("p50", "ttft_p50", "{:.3f}"), ("p99", "ttft_p99", "{:.3f}"),
            ("uncached mean", "uncached_mean", "{:,.0f}"), ("p99", "uncached_p99", "{:,.0f}"),
            ("evicted tokens", "evicted_tokens", "{:,}"), ("kept mean", "kept_mean", "{:.3f}"),
            ("kept 0-or-1 %", "kept_all_or_nothing", "{:.1%}")]
    for name, _, _ in cols:
        t.add_column(name, justify="right")
    t.add_column("h model", justify="right")
    for row in out["policies"]:
        ss = row["steady_state"]
        t.add_row(*[fmt.format(row[k]) for _, k, fmt in cols],
                  "-" if ss is None else f"{ss['predicted_kept']:.3f} (kept {ss['measured_kept']:.3f})")
    Console(width=200).print(t)
    for r in out["ratios"]:
        for label, pre in (("all calls", ""), ("returning calls", "returning_")):
            print(f"{r['policy']} vs {r['baseline']}, {label}: p99 uncached {r[pre + 'uncached_p99']:+.1f} % "
                  f"(published {PUBLISHED['uncached_p99']:+.1f} %), p99 TTFT {r[pre + 'ttft_p99']:+.1f} % "
                  f"(published {PUBLISHED['ttft_p99']:+.1f} %), mean uncached {r[pre + 'uncached_mean']:+.1f} %, "
                  f"mean TTFT {r[pre + 'ttft_mean']:+.1f} %")
    if args.json_path:
        write_json(args.json_path, {"meta": {"command": "simulate", "workload": args.workload, "model": spec.name,
                                             "gpu": gpu.name, "seed": args.seed}, **out})
    return 0
