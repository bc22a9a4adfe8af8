"""Where a decode step's time goes on the path `radixflow serve` runs (docs/engine_speed.md, "Decode at real size").

The Engine is built as `serve` builds it (commands/serve.py's `engine_config` over serve's own flag
defaults: scheduler budgets, state interval, snapshot mode, hand-off `auto` with its calibration), so a
step pays everything a server round pays but HTTP: admission and scheduling, the row inputs, the
forward, sampling, the calibration's bookkeeping and the scheduler's completion. `--sessions` prompts of
`--context` tokens each (distinct histories, as an agentic loop's sessions), `--rows` / sessions branches
per prompt; once every row is decoding, `--steps` steps are timed, split into

    scheduler   admit + schedule + complete (core/scheduler.py)
    forward     the model call, by component (host clocks around each: linears, conv, scan, attention,
                norms, the rest), and the K/V write inside attention
    sampling    the sampler and the per-row results (engine/executor.py)
    executor    the rest of `execute` (row inputs, calibration bookkeeping)

then one step under torch.profiler (top ops by self time). The weights' bytes over the step time give
the read rate a step reached; `--bound` also times a plain copy of that many bytes (the machine's
memory bandwidth, the floor of a step that reads every weight once).

    python benchmarks/engine_decode.py --model random:qwen3.5-0.8b --rows 1 4 16 --context 1536
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import engine_profile  # noqa: E402
from radixflow.commands import serve as serve_cmd  # noqa: E402
from radixflow.engine.engine import Engine  # noqa: E402
from radixflow.engine.models.batch import BatchContext  # noqa: E402
from radixflow.engine.sampling import SamplingParams  # noqa: E402


def serve_engine_config(model: str, kv_cache_memory: int | None):
    """EngineConfig of `radixflow serve --model MODEL` with every other flag at its default."""
    p = argparse.ArgumentParser()
    serve_cmd.add_arguments(p)
    argv = ["--model", model] + (["--kv-cache-memory", str(kv_cache_memory)] if kv_cache_memory else [])
    return serve_cmd.engine_config(p.parse_args(argv))


class StepClock:
    """Host time of one step's parts, by wrapping the engine's scheduler, executor, model and sampler."""

    def __init__(self, eng: Engine) -> None:
        self.parts: dict[str, float] = defaultdict(float)
        sc, ex = eng.scheduler, eng.executor
        for obj, attr, name in ((sc, "admit", "scheduler"), (sc, "schedule", "scheduler"),
                                (sc, "complete", "scheduler"), (ex, "execute", "execute"),
                                (ex, "model", "forward"), (ex, "sampler", "sampling")):
            setattr(obj, attr, self._wrap(name, getattr(obj, attr)))

    def _wrap(self, name, fn):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.parts[name] += time.perf_counter() - t
        return wrapper


@contextlib.contextmanager
def states_arm(arm: str):
    """`copy`: decode rounds gather the rows' states and write them back (the path before
    `BatchContext.states_in_place`); `in-place`: as the engine runs now."""
    if arm == "in-place":
        yield
        return
    saved = BatchContext.__dict__["states_in_place"]
    BatchContext.states_in_place = property(lambda self: None)
    try:
        yield
    finally:
        BatchContext.states_in_place = saved


def next_round(eng: Engine):
    """One round that runs something: an empty one (every branch waiting for a deadline) moves the engine's
    clock to that deadline and steps again, as `LLM` does."""
    while True:
        batch, _ = eng.step()
        if batch:
            return batch
        deadline = eng.idle_until()
        if deadline is None:
            raise RuntimeError("engine stuck: work left but nothing schedulable")
        eng.now = max(eng.now, deadline)


def ids(gen: torch.Generator, n: int) -> list[int]:
    return torch.randint(3, 250, (n,), generator=gen).tolist()


def run(args, rows: int, eng: Engine, clock: StepClock, prompts: list[list[int]], tag: str) -> None:
    """`rows` rows decoding at once: prompt s of `prompts` for row r with s = r mod sessions (the branches
    of one prompt share its cached prefix); times `--steps` steps once all of them decode."""
    params = SamplingParams(temperature=0.0, max_tokens=args.warm + args.steps + 2, ignore_eos=True, logprobs=1)
    sessions = min(len(prompts), rows)
    for s in range(sessions):
        per = rows // sessions + (s < rows % sessions)
        eng.add([eng.make_branch(f"{tag}-{s}", i, prompts[s], params) for i in range(per)])
    t0 = time.perf_counter()
    while True:  # prefill (cached prefixes hit) until every row decodes
        batch = next_round(eng)
        if batch.num_tokens == batch.num_rows == rows:
            break
    prefill = time.perf_counter() - t0
    for _ in range(args.warm - 1):
        next_round(eng)
    times, cpu, parts = [], [], defaultdict(list)
    engine_profile.TOTALS.clear()
    for _ in range(args.steps):
        clock.parts.clear()
        t, c = time.perf_counter(), time.process_time()
        batch = next_round(eng)
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        assert batch.num_tokens == rows, (batch.num_tokens, rows)
        for k, v in clock.parts.items():
            parts[k].append(v)
    comps = {k: v / args.steps for k, v in engine_profile.TOTALS.items()}
    med = {k: statistics.median(v) for k, v in parts.items()}
    step = statistics.median(times)
    split = {"scheduler": med["scheduler"], "sampling": med.get("sampling", 0.0),
             "executor other": med["execute"] - med["forward"] - med.get("sampling", 0.0)}
    fwd = med["forward"]
    inner = dict(comps)
    inner["rest of forward"] = fwd - sum(comps.values())
    print(f"{eng.config.model} {rows:2d} rows ({sessions} sessions) at ~{args.context}: step {step * 1e3:7.1f} ms "
          f"(median of {args.steps}: {', '.join(f'{t * 1e3:.0f}' for t in times)}; CPU "
          f"{statistics.median(cpu) * 1e3:.0f} ms), {rows / step:6.1f} tok/s; prefill {prefill:.0f} s", flush=True)
    print(f"    step: forward {fwd * 1e3:.1f} ms, " + ", ".join(
        f"{k} {v * 1e3:.1f} ms" for k, v in split.items()), flush=True)
    print("    forward: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in
                                      sorted(inner.items(), key=lambda kv: -kv[1])), flush=True)
    if args.ops:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            t = time.perf_counter()
            next_round(eng)
            wall = time.perf_counter() - t
        ops = sorted(((e.key, e.self_cpu_time_total / 1e6, e.count) for e in prof.key_averages()),
                     key=lambda x: -x[1])
        print(f"    torch.profiler, one step {wall * 1e3:.0f} ms: " + ", ".join(
            f"{k} {t * 1e3:.1f} ms ({n})" for k, t, n in ops[:args.ops]), flush=True)
    while eng.has_unfinished:  # the rows' remaining tokens (their prefixes stay cached for the next run)
        next_round(eng)
    weights = weight_bytes(eng.loaded.model)
    print(f"    weights {weights / 1e9:.2f} GB read once a step: {weights / fwd / 1e9:.1f} GB/s in the forward",
          flush=True)


def weight_bytes(model) -> int:
    """Bytes of the model's parameters, each storage once (fused projections are views of one weight, a
    tied head is the embedding)."""
    seen: dict[int, int] = {}
    for p in model.parameters():
        st = p.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def bandwidth(nbytes: int, repeat: int = 5) -> float:
    """GB/s of the best of `repeat` copies of `nbytes` (read + write counted as read: what a step reads)."""
    src = torch.ones(nbytes // 8, dtype=torch.float32)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    reads = torch.empty(nbytes // 4, dtype=torch.float32).fill_(1.0)
    best_sum = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        reads.sum()
        best_sum = min(best_sum, time.perf_counter() - t)
    print(f"memory: copy {2 * (nbytes // 2) / best / 1e9:.1f} GB/s (read+write), sum (read) "
          f"{nbytes / best_sum / 1e9:.1f} GB/s over {nbytes / 1e9:.2f} GB", flush=True)
    return nbytes / best_sum


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", nargs="+", default=["random:qwen3.5-0.8b"])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--sessions", type=int, default=4, help="distinct prompts (the rest are their branches)")
    ap.add_argument("--context", type=int, default=1536)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warm", type=int, default=2, help="decode steps run before the timed ones")
    ap.add_argument("--ops", type=int, default=14, help="torch.profiler's top N ops of one step (0: none)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-cache-memory", type=int, default=None,
                    help="bytes (default: serve's); every row needs a state slot and one to capture into")
    ap.add_argument("--bound", action="store_true", help="also time reading the weights' bytes once")
    ap.add_argument("--arms", nargs="+", choices=["in-place", "copy"], default=["in-place"],
                    help="decode states stepped in their slots (now) or gathered and written back (before)")
    ap.add_argument("--handoff", choices=["off", "on", "auto"], default=None,
                    help="override serve's --handoff (auto probes its costs when the engine is built: minutes at "
                         "real size on a loaded machine; its per-round bookkeeping is part of what a step times)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from radixflow.engine.loader import load_model
    from radixflow.engine.tiny import resolve_model

    for model in args.model:
        cfg = serve_engine_config(model, args.kv_cache_memory)
        if args.handoff is not None:
            cfg.scheduler.handoff = args.handoff
        t = time.perf_counter()
        loaded = load_model(resolve_model(model), torch.device(cfg.device))
        load = time.perf_counter() - t
        engine_profile.instrument(loaded.model)
        t = time.perf_counter()
        eng = Engine(cfg, loaded=loaded)
        keys = ("max_num_seqs", "max_num_batched_tokens", "state_interval", "snapshot_mode", "checkpoints", "handoff")
        print(f"{model}: loaded in {load:.0f} s, engine built in {time.perf_counter() - t:.0f} s "
              f"({eng.scheduler_config.num_state_slots} state slots); scheduler: "
              f"{ {k: getattr(cfg.scheduler, k) for k in keys} }; {torch.get_num_threads()} threads", flush=True)
        if args.bound:
            bandwidth(weight_bytes(loaded.model))
        clock = StepClock(eng)
        gen = torch.Generator().manual_seed(0)
        prompts = [ids(gen, args.context + 16 * s + 5) for s in range(args.sessions)]
        for rows in args.rows:
            for arm in args.arms:
                print(f"  [{arm}]", flush=True)
                with states_arm(arm):
                    run(args, rows, eng, clock, prompts, f"r{rows}-{arm}")
        del eng, loaded


if __name__ == "__main__":
    main()
