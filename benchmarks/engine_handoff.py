"""What an extra recurrent level costs on the real engine (SPEC §15): one producer and its dependents
in ONE forward, against the same rows run as two rounds (the siblings wait a round for the snapshot).

Per tiny hybrid: a document of --doc tokens and --siblings candidates of --tail tokens each. Hand-off:
one round, the first candidate's whole prompt as the producer and the others as dependents after it at
the document's end (a page cut: the engine forks the partial page). Two rounds: the producer capturing
its state at the document's end, then the siblings resuming from that snapshot. Prints the executor's
host time per round (ExecResult.host_time), the part the hand-off round spends in levels >= 1
(ExecResult.handoff_time) as a fraction of it, and whether both give the same first tokens.
Figures are printed, never asserted; best of --repeat interleaved runs after a warm-up.

    python benchmarks/engine_handoff.py [--models tiny-qwen3.5 tiny-nemotron-h] [--doc 500] [--siblings 4]

`--breakdown`: what a hand-off costs, in parts, on a bench-like round (two 640-token producers
capturing every 16 tokens, each with 5 dependents of 8-45 tokens; the engine's scan chunk): the hand-off
forward with the dependents folded into their producers' scan (engine/models/batch.py `FOLD`, the
default) and in a separate level (`FOLD = False`, the pre-fold engine), each against the same rows in
one forward with the dependents at level 0 (resumed from snapshots, as the wait path runs them a round
later); the scan calls the fold adds, their price by the probe's per-call cost and their measured time
(the calls of folded rows only and the fold copies, `LevelClock.fold_measured`); and the separate
level's parts timed on their own: its scans (all recurrent layers), the conv-window gather, the page
fork, and the host bookkeeping (levels, chunk plan, gather indices). Medians of --repeat interleaved runs.

`--bench`: `radixflow bench`'s trace (--questions, the multi-candidate workload) through arms
policy:handoff[:levels] cycled --repeat times in one process on one loaded model, so each sees the same
load (`:levels` runs `FOLD = False`, the separate levels); prints each run, then per arm the medians of
T_host, mean latency, the levels' and the fold's time, and each arm's T_host paired run by run with the
first arm of its policy (`off`).

    PYTHONPATH=src python benchmarks/engine_handoff.py --bench --models tiny-qwen3.5 --repeat 3

`--replay`: the same trace run once under --policy with `--handoff auto`, recording every forward's
rows; then each recorded forward is timed with the dependents folded and in separate levels, back to
back (alternating which goes first), --repeat times: the forwards' total per mode (medians per
forward), so scheduling and load drift cancel. Only forwards with a dependent are replayed.

    PYTHONPATH=src python benchmarks/engine_handoff.py --replay --models tiny-qwen3.5 --repeat 5
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from radixflow.core.batch import Batch, ExecResult, Fragment  # noqa: E402
from radixflow.core.branch import Branch  # noqa: E402
from radixflow.engine.calibration import calibration, engine_scan_costs, level0_equivalent  # noqa: E402
from radixflow.engine.executor import EngineExecutor  # noqa: E402
from radixflow.engine.loader import load_model  # noqa: E402
from radixflow.engine.tiny import ensure_tiny_model  # noqa: E402

BLOCK = 16
HYBRIDS = ("tiny-qwen3.5", "tiny-nemotron-h")


def _batches(doc: list[int], tails: list[list[int]]) -> tuple[Batch, Batch, Batch]:
    """(hand-off round, round 1, round 2) over the same branches and pages."""
    d = len(doc)
    branches = [Branch("b", i, tuple(doc + t)) for i, t in enumerate(tails)]
    n_pages = [-(-len(b.prompt) // BLOCK) for b in branches]
    producer_pages = list(range(n_pages[0]))
    q, page = d // BLOCK, n_pages[0]
    tables = [producer_pages]
    for n in n_pages[1:]:
        tables.append(producer_pages[:q] + list(range(page, page + n - q)))
        page += n - q
    p = branches[0]
    handoff = [Fragment(p, 0, len(p.prompt), producer_pages, samples=True, first=True)]
    handoff += [Fragment(b, d, len(b.prompt) - d, t, samples=True, first=True, after=0)
                for b, t in zip(branches[1:], tables[1:])]
    # the wait: the producer snapshots at d (slot 0); a sibling starts from it with a copy of the cut page
    first = [Fragment(p, 0, len(p.prompt), producer_pages, state_out=[(d, 0)], samples=True, first=True)]
    second = [Fragment(b, d, len(b.prompt) - d, t, state_in=0, samples=True, first=True,
                       copies_before=[(producer_pages[q], t[q])] if d % BLOCK else [])
              for b, t in zip(branches[1:], tables[1:])]
    return Batch(1, handoff), Batch(1, first), Batch(2, second)


def bench_model(name: str, doc_len: int, siblings: int, tail: int, repeat: int, device: str) -> None:
    model = load_model(ensure_tiny_model(name), torch.device(device)).model
    gen = torch.Generator().manual_seed(0)
    doc = torch.randint(0, 256, (doc_len,), generator=gen).tolist()
    tails = [torch.randint(0, 256, (tail,), generator=gen).tolist() for _ in range(siblings)]
    handoff, first, second = _batches(doc, tails)
    pages = max(max(f.page_table) for b in (handoff, first, second) for f in b.fragments) + 1
    ex = EngineExecutor(model, model.allocate_cache(pages, BLOCK, 2, device=device))
    ex.scan_costs = engine_scan_costs(model, BLOCK)  # the scan chunk an engine runs (interval = page here)

    def run_handoff() -> ExecResult:
        return ex.execute(handoff)

    def run_two() -> tuple[ExecResult, ExecResult]:
        return ex.execute(first), ex.execute(second)

    run_handoff(), run_two()  # warm-up
    hand, extra, two, agree = [], [], [], 0
    for _ in range(repeat):  # interleaved: both ways see the same machine load
        h = run_handoff()
        r1, r2 = run_two()
        hand.append(h.host_time)
        extra.append(h.handoff_time)
        two.append((r1.host_time, r2.host_time))
        firsts = [r1.samples[0].token] + [r2.samples[i].token for i in range(siblings - 1)]
        agree += sum(h.samples[i].token == t for i, t in enumerate(firsts))
    # min, not median: the least disturbed run on a shared machine; the fraction is per run (median)
    fractions = sorted(e / t for e, t in zip(extra, hand))
    r1, r2 = min(two, key=sum)
    h = min(hand)
    print(f"{name:16s} hand-off round {h * 1e3:8.2f} ms, extra levels {min(extra) * 1e3:7.2f} ms "
          f"({fractions[len(fractions) // 2]:5.1%} of the round, median) | two rounds {r1 * 1e3:8.2f} + "
          f"{r2 * 1e3:7.2f} = {(r1 + r2) * 1e3:8.2f} ms (hand-off x{h / (r1 + r2):.2f}) | first tokens agree "
          f"{agree}/{siblings * repeat}", flush=True)


def _bench_round(vocab: int, with_after: bool, slot0: int = 0):
    """Rows of a bench-like round; dependents either `after` their producer or at level 0 from a slot."""
    from radixflow.engine.models.cache import RowInput

    gen = torch.Generator().manual_seed(1)

    def ids(n: int) -> list[int]:
        return torch.randint(0, vocab, (n,), generator=gen).tolist()

    rows, page, slot = [], 0, slot0
    for plen in (640, 624):
        n_pages = -(-plen // BLOCK)
        caps = [(k, slot + i) for i, k in enumerate(sorted({*range(16, plen + 1, 16), 488}))]
        slot += len(caps)
        rows.append(RowInput(ids(plen), 0, list(range(page, page + n_pages)), None, caps, [plen - 1]))
        page += n_pages
    for p in (0, 1):
        for d, n in [(320, 30), (320, 45), (480, 12), (488, 20), (608, 8)]:  # 488: inside a page
            q = d // BLOCK
            own = -(-(d + n) // BLOCK) - q
            caps = [(k, slot + i) for i, k in enumerate(range(16, n + 1, 16))]
            slot += len(caps)
            state_in = None if with_after else dict(rows[p].state_out)[d]
            rows.append(RowInput(ids(n), d, rows[p].page_table[:q] + list(range(page, page + own)), state_in,
                                 caps, [n - 1], after=p if with_after else None))
            page += own
    return rows, page, slot


def breakdown(name: str, repeat: int, device: str) -> None:
    import statistics
    import time

    from radixflow.engine.models import batch as batch_mod
    from radixflow.engine.models.batch import BatchContext
    from radixflow.engine.models.level_clock import LevelClock

    model = load_model(ensure_tiny_model(name), torch.device(device)).model
    costs = engine_scan_costs(model, 16)
    hand, pages, slots = _bench_round(256, True)
    wait, _, _ = _bench_round(256, False)
    cache = model.allocate_cache(pages + 1, BLOCK, slots + 1, device=device)
    model(hand, cache, None, costs)  # warm-up; writes the producers' snapshots the level-0 rows resume from
    model(wait, cache, None, costs)
    folded_mode = batch_mod.FOLD

    def forward(rows, fold: bool) -> tuple[float, LevelClock]:
        batch_mod.FOLD = fold
        clock = LevelClock(torch.device(device), time_fold=fold)
        t0 = time.perf_counter()
        model(rows, cache, clock, costs)
        return time.perf_counter() - t0, clock

    forward(hand, False)  # warm-up of the separate-level path
    a, b, fo, lev, base_h, base_w, fold_calls, fold_price = [], [], [], [], [], [], 0, 0.0
    fold_meas, fold_wall = [], []
    try:
        for _ in range(repeat):  # interleaved: folded, separate level, same rows at level 0
            t, clock = forward(hand, True)
            fo.append(t)
            fold_calls, fold_price = clock.fold_calls, clock.fold_seconds
            fold_meas.append(clock.fold_measured)
            fold_wall.append(clock.fold_wall)
            t, clock = forward(hand, False)
            a.append(t)
            lev.append(clock.seconds)
            base_h.append(clock.base)
            t, clock = forward(wait, False)
            b.append(t)
            base_w.append(clock.base)
    finally:
        batch_mod.FOLD = folded_mode
    batch_mod.FOLD = False  # the separate level's parts below
    # the parts, timed alone
    layout = model.cache_layout()
    n_rec = len(layout.states)
    n_att = layout.num_kv_layers

    def med(f, n: int = repeat) -> float:
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    def book() -> None:
        ctx = BatchContext(hand, BLOCK, torch.device(device), None, costs)
        for lv in ctx.levels[1:]:
            _ = lv.decode_rows, lv.decode_hands
            lv.scan_plan(64)
        _ = ctx.kv_forks
        ctx.conv_plan(4)

    ctx = BatchContext(hand, BLOCK, torch.device(device), None, costs)
    conv = ctx.conv_plan(4)
    width = layout.states[0].conv[1] if n_rec else 1   # the conv state is [K - 1, channels]
    flat = torch.zeros(conv.total, width, device=device)
    dst, src = ctx.kv_forks
    hkv = (layout.num_kv_heads, layout.head_dim)
    kv = (cache.k[0].view(-1, *hkv), cache.v[0].view(-1, *hkv)) if n_att else None

    def gather() -> None:
        for _ in range(n_rec):
            flat[conv.hand_dst] = flat[conv.hand_src]

    def fork() -> None:
        for _ in range(n_att):
            for pool in kv:
                pool.index_copy_(0, dst, pool.index_select(0, src))

    ta, tb, tl, tfo = statistics.median(a), statistics.median(b), statistics.median(lev), statistics.median(fo)
    tbook, tg = med(book), med(gather, 5 * repeat)
    tf = med(fork, 5 * repeat) if kv is not None else 0.0
    batch_mod.FOLD = folded_mode
    deps = sum(r.after is not None for r in hand)
    # the marginal the bench reports (engine/calibration.py), checked here against a direct measurement:
    # level 1's rows priced at level 0 = level 0 with them (wait) less level 0 without them (hand-off)
    cal = calibration(model, BLOCK)
    lens = [len(r.token_ids) for r in hand if r.after is not None]
    price = level0_equivalent(cal.base_fit, sum(n == 1 for n in lens), sum(n > 1 for n in lens),
                              sum(n for n in lens if n > 1))
    direct = statistics.median(w - h for w, h in zip(base_w, base_h))
    print(f"{name:16s} level 1 gross {tl * 1e3:6.1f} ms; its rows at level 0: measured {direct * 1e3:6.1f} ms "
          f"(level 0 {statistics.median(base_w) * 1e3:.1f} vs {statistics.median(base_h) * 1e3:.1f} ms), "
          f"probe fit's price {price * 1e3:6.1f} ms; marginal measured {1e3 * (tl - direct):+6.1f} ms, "
          f"by the fit {1e3 * (tl - price):+6.1f} ms", flush=True)
    print(f"{name:16s} chunk {costs.fixed}: folded hand-off forward {tfo * 1e3:7.1f} ms | separate level "
          f"{ta * 1e3:7.1f} ms | same rows, dependents at level 0 {tb * 1e3:7.1f} ms | folded vs level 0 "
          f"{(tfo - tb) / tb:+.1%}, separate vs level 0 {(ta - tb) / tb:+.1%} | the fold adds {fold_calls} scan "
          f"calls, priced {fold_price * 1e3:.2f} ms by the probe's per-call cost, measured "
          f"{statistics.median(fold_meas) * 1e3:.2f} ms ({statistics.median(fold_wall) * 1e3:.2f} ms on the host "
          f"clock; its calls of folded rows only and its state copies)", flush=True)
    print(f"{name:16s} separate level: hand-off forward {ta * 1e3:7.1f} ms | same rows, dependents at level 0 "
          f"{tb * 1e3:7.1f} ms | extra {1e3 * (ta - tb):+6.1f} ms ({(ta - tb) / ta:+.1%}) | level 1 ({deps} rows) "
          f"{tl * 1e3:6.1f} ms of which bookkeeping {tbook * 1e3:.2f} ms; conv gather {tg * 1e3:.3f} ms "
          f"({n_rec} layers), page fork {tf * 1e3:.3f} ms ({n_att} layers)", flush=True)


def bench_arms(name: str, questions: int, repeat: int, arms: list[str]) -> None:
    import statistics
    from dataclasses import replace

    from radixflow.cli import make_parser
    from radixflow.commands import bench
    from radixflow.core.loop import run_trace
    from radixflow.core.metrics import measure, merge
    from radixflow.engine.engine import Engine
    from radixflow.engine.models import batch as batch_mod
    from radixflow.workloads.trace import fresh_copies

    argv = ["bench", "--model", name, "--questions", str(questions)]
    pl, loaded, workloads = bench.load(make_parser(argv)[0].parse_args(argv))
    cfg, base = pl.scheduler, pl.engine
    folded_mode = batch_mod.FOLD
    seen: dict[str, list] = {a: [] for a in arms}
    for cycle in range(repeat):
        for arm in arms:
            policy, mode, *rest = arm.split(":")
            batch_mod.FOLD = not rest
            try:
                parts, fold = [], 0.0
                for _, brs in workloads:
                    eng = Engine(replace(base, policy=policy, scheduler=replace(cfg, handoff=mode)), loaded=loaded)
                    parts.append(measure(policy, run_trace(eng.scheduler, eng.executor, fresh_copies(brs))))
                    fold += eng.executor.fold_time
                    del eng   # its pools go before the next part's are allocated
            finally:
                batch_mod.FOLD = folded_mode
            r = merge(policy, parts)
            seen[arm].append((r, fold))
            print(f"  cycle {cycle + 1} {arm:22s} rounds {r.rounds:3d} T_host {r.host_time:6.2f} s latency "
                  f"{r.latency_mean:.3f} s levels {r.handoff_time:.3f} s fold {1e3 * fold:.1f} ms "
                  f"dependents {r.handoff_rows}", flush=True)
    for arm in arms:
        runs = seen[arm]
        ref = seen.get(f"{arm.split(':')[0]}:off", runs)
        paired = sorted(r.host_time / o.host_time for (r, _), (o, _) in zip(runs, ref))
        print(f"{name:16s} {arm:22s} median T_host {statistics.median(r.host_time for r, _ in runs):6.2f} s, vs "
              f"off paired x{statistics.median(paired):.3f} (runs {', '.join(f'{x:.3f}' for x in paired)}); "
              f"latency {statistics.median(r.latency_mean for r, _ in runs):.3f} s; levels "
              f"{statistics.median(r.handoff_time / r.host_time for r, _ in runs):.2%}, fold "
              f"{statistics.median(f / r.host_time for r, f in runs):.2%} of T_host; rounds "
              f"{statistics.median(r.rounds for r, _ in runs)}", flush=True)


def replay(name: str, questions: int, repeat: int, policy: str) -> None:
    import statistics
    import time
    from dataclasses import replace

    from radixflow.cli import make_parser
    from radixflow.commands import bench
    from radixflow.core.loop import run_trace
    from radixflow.engine.engine import Engine
    from radixflow.engine.models import batch as batch_mod
    from radixflow.engine.models.level_clock import LevelClock
    from radixflow.workloads.trace import fresh_copies

    argv = ["bench", "--model", name, "--questions", str(questions)]
    pl, loaded, workloads = bench.load(make_parser(argv)[0].parse_args(argv))
    cfg, base = pl.scheduler, pl.engine
    model = loaded.model
    calls: list = []  # (engine, rows, scan costs) of each forward with a dependent
    forward = model.forward
    engines = []

    def record(rows, cache, clock=None, costs=None):
        if any(r.after is not None for r in rows):
            calls.append((cache, list(rows), costs))
        return forward(rows, cache, clock, costs)

    calibration(model, cfg.block_size)  # the probe's forwards run now, unrecorded
    model.forward = record
    try:
        for _, brs in workloads:
            eng = Engine(replace(base, policy=policy, scheduler=replace(cfg, handoff="auto")), loaded=loaded)
            engines.append(eng)  # keeps its cache alive for the replay
            run_trace(eng.scheduler, eng.executor, fresh_copies(brs))
    finally:
        del model.forward
    folded_mode = batch_mod.FOLD
    times: dict[bool, list[list[float]]] = {True: [[] for _ in calls], False: [[] for _ in calls]}
    fold_calls = 0
    try:
        for rep in range(repeat):
            for i, (cache, rows, costs) in enumerate(calls):
                for fold in ((True, False) if (rep + i) % 2 else (False, True)):
                    batch_mod.FOLD = fold
                    clock = LevelClock(torch.device("cpu"))
                    t0 = time.perf_counter()
                    model(rows, cache, clock, costs)
                    times[fold][i].append(time.perf_counter() - t0)
                    if fold and rep == 0:
                        fold_calls += clock.fold_calls
    finally:
        batch_mod.FOLD = folded_mode
    tf = sum(statistics.median(t) for t in times[True])
    tl = sum(statistics.median(t) for t in times[False])
    per = sorted(statistics.median(a) / statistics.median(b) for a, b in zip(times[True], times[False]))
    deps = sum(r.after is not None for _, rows, _ in calls for r in rows)
    print(f"{name:16s} {policy} auto: {len(calls)} forwards with {deps} dependents replayed x{repeat}: folded "
          f"{tf:6.3f} s vs separate levels {tl:6.3f} s (x{tf / tl:.3f}; per forward median x"
          f"{per[len(per) // 2]:.3f}, range {per[0]:.3f}-{per[-1]:.3f}); the fold added {fold_calls} scan calls",
          flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(HYBRIDS), choices=HYBRIDS)
    ap.add_argument("--doc", type=int, default=500, help="document tokens (500: the cut page is forked)")
    ap.add_argument("--siblings", type=int, default=4, help="candidates: one producer + siblings - 1 dependents")
    ap.add_argument("--tail", type=int, default=16, help="tokens of each candidate after the document")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steadier on a shared machine)")
    ap.add_argument("--breakdown", action="store_true", help="an extra level's cost, in parts (see above)")
    ap.add_argument("--bench", action="store_true", help="bench's trace, arms cycled in one process (see above)")
    ap.add_argument("--replay", action="store_true", help="bench's forwards replayed folded / in levels")
    ap.add_argument("--policy", default="radixflow", help="--replay: the policy whose forwards are replayed")
    ap.add_argument("--questions", type=int, default=32, help="--bench: questions of the trace")
    ap.add_argument("--arms", nargs="+", default=["radix:off", "radix:auto", "radix:auto:levels", "radixflow:off",
                                                  "radixflow:auto", "radixflow:auto:levels"],
                    help="--bench: policy:handoff[:levels] arms (levels: FOLD = False)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.siblings < 2:
        ap.error("--siblings must be >= 2 (one producer and at least one dependent)")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {load:.1f}, "
          f"device {args.device}; doc {args.doc}, {args.siblings} candidates x {args.tail} tokens")
    for name in args.models:
        if args.replay:
            replay(name, args.questions, args.repeat, args.policy)
        elif args.bench:
            bench_arms(name, args.questions, args.repeat, args.arms)
        elif args.breakdown:
            breakdown(name, args.repeat, args.device)
        else:
            bench_model(name, args.doc, args.siblings, args.tail, args.repeat, args.device)


if __name__ == "__main__":
    main()
