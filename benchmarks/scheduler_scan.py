"""Scheduler time per round against waiting-queue length, beside vLLM 0.33's native `schedule()`.

Two queues, every branch waiting at t = 0 (S = 8, T = 8192, 16-token pages):
- paper-shaped: groups of four branches sharing a document (--doc-len, 1,024 tokens) + 16 tokens each, the QA
  shape; prefix-stop stops at the first Blocked sibling, state-ready traversal walks on until rows or
  the claim of the deferred siblings (SPEC §12) stop it;
- one-document fan: every branch shares one document, so after the first producer is placed the whole
  rest of the queue is Blocked (state-ready's worst case: it walks the whole queue).
Prints ms per round (mean over --rounds rounds; the fan's first round is the all-Blocked one) and rows
placed per round (vLLM / prefix-stop / state-ready) for the core's two rules and for vLLM's native
scheduler driven the same way (no model: a stand-in output
gives one token per finished prefill, `radixflow.integrations.vllm.cpu_harness`), and the ratios,
measured side by side in one run: the three take turns, repeat by repeat, and each keeps its minimum
per round (`--repeat`). Without vLLM installed it prints the core's figures only.
Arrival hashing (`Scheduler.add`, like vLLM's request block hasher) is outside the timed region on both
sides; its cost per branch is printed once. Times are the process's CPU time (`time.process_time`),
steadier than wall time on shared cores; torch runs on one thread.

    python benchmarks/scheduler_scan.py [--sizes 1000 10000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from radixflow.config import SchedulerConfig  # noqa: E402
from radixflow.core.batch import ExecResult, Sample  # noqa: E402
from radixflow.core.branch import Branch  # noqa: E402
from radixflow.core.policies import Arm, Immediate, PrefixStop, StateReady  # noqa: E402
from radixflow.core.scheduler import Scheduler  # noqa: E402
from radixflow.workloads.trace import Segment, tokens_of  # noqa: E402

S, T, BLOCK, TAIL = 8, 8192, 16, 16
ROWS: dict[str, list[int]] = {"vllm": [], "prefix-stop": [], "state-ready": []}  # rows per timed round
RULES = {"prefix-stop": Arm("prefix-stop", Immediate(), PrefixStop()),
         "state-ready": Arm("state-ready", Immediate(), StateReady())}


def make_prompts(n: int, group: int, doc_len: int = 1024) -> list[tuple[int, ...]]:
    return [tokens_of([Segment(f"doc{i // group}", doc_len), Segment(f"b{i}", TAIL)]) for i in range(n)]


def _core(prompts, rule: str) -> tuple[Scheduler, float]:
    """A scheduler with every prompt added; µs per add() (arrival hashing, reuse between siblings)."""
    cfg = SchedulerConfig(max_num_seqs=S, max_num_batched_tokens=T, block_size=BLOCK, state_interval=512,
                          num_kv_pages=1 << 20, num_state_slots=1 << 16,
                          handoff="off")  # the Blocked scan beside vLLM's, which cannot hand off
    s = Scheduler(cfg, RULES[rule], hybrid=True)
    branches = [Branch(f"q{i}", 0, p, namespace="bench") for i, p in enumerate(prompts)]
    t0 = time.process_time()
    for b in branches:
        s.add(b)
    return s, 1e6 * (time.process_time() - t0) / len(prompts)


def arrival_us(prompts) -> list[float]:
    return [_core(prompts, "state-ready")[1]]


def core_rounds(prompts, rule: str, rounds: int) -> list[float]:
    """ms per schedule() call for the first `rounds` rounds."""
    s, _ = _core(prompts, rule)
    s.admit(0.0)
    out = []
    for r in range(rounds):
        t0 = time.process_time()
        batch = s.schedule(float(r))
        out.append(1e3 * (time.process_time() - t0))
        ROWS[rule].append(batch.num_rows)
        s.complete(batch, ExecResult(0.01, {i: Sample(1) for i, f in enumerate(batch.fragments) if f.samples}),
                   r + 0.01)
    return out


def vllm_rounds(prompts, rounds: int) -> list[float] | None:
    try:
        from radixflow.integrations.vllm import cpu_harness as h
    except Exception:  # vLLM absent or unsupported: the core's figures stand alone
        return None
    import torch

    torch.set_num_threads(1)
    s = h.build_scheduler(h.SchedulerSetup(max_num_seqs=S, max_num_batched_tokens=T, block_size=BLOCK,
                                           num_gpu_blocks=1 << 16, hybrid=True))
    for i, p in enumerate(prompts):
        s.add_request(h.make_request(f"q{i}", p, BLOCK))
    out = []
    for _ in range(rounds):
        t0 = time.process_time()
        output = s.schedule()
        out.append(1e3 * (time.process_time() - t0))
        ROWS["vllm"].append(len(output.num_scheduled_tokens))
        s.update_from_output(output, h.stand_in_model_output(s, output))
    return out


def best_of(repeat: int, run, *args) -> list[float] | None:
    """Per-round minimum over `repeat` fresh runs, garbage collection off while timing (as timeit)."""
    return interleaved(repeat, [(run, args)])[0]


def interleaved(repeat: int, runs) -> list[list[float] | None]:
    """`best_of` for several (run, args) at once, taking turns: repeat k of every run happens before
    repeat k+1 of any, so a load change on the shared machine falls on all of them alike."""
    got: list[list[list[float]] | None] = [[] for _ in runs]
    for _ in range(repeat):
        for i, (run, args) in enumerate(runs):
            if got[i] is None:
                continue
            gc.collect()
            gc.disable()
            try:
                r = run(*args)
            finally:
                gc.enable()
            if r is None:
                got[i] = None
            else:
                got[i].append(r)
    return [None if g is None else [min(r[j] for r in g) for j in range(len(g[0]))] for g in got]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3, help="fresh runs per figure; the minimum is kept")
    ap.add_argument("--doc-len", type=int, default=1024, help="document tokens (8192 > T: chunked over rounds)")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.repeat < 1 or min(args.sizes) < 2 or not 16 <= args.doc_len <= 16000:
        ap.error("--rounds and --repeat must be >= 1, every size >= 2, --doc-len in [16, 16000]")
    have_vllm = True
    for group, what in ((4, "paper-shaped queue (groups of 4)"), (0, "one-document fan (all Blocked)")):
        print(f"\n{what}: ms per round, mean of {args.rounds}" + ("" if group else "; [first round]"))
        print(f"{'waiting':>8} {'vLLM native':>12} {'prefix-stop':>12} {'state-ready':>12} "
              f"{'ps/vLLM':>8} {'sr/vLLM':>8} {'add µs/branch':>14}")
        for n in args.sizes:
            prompts = make_prompts(n, group or n, args.doc_len)
            runs = [(core_rounds, (prompts, rule, args.rounds)) for rule in ("prefix-stop", "state-ready")]
            if have_vllm:
                runs.insert(0, (vllm_rounds, (prompts, args.rounds)))
            res = interleaved(args.repeat, runs)
            native = res.pop(0) if have_vllm else None
            have_vllm = native is not None
            ps, sr = res
            add_us = best_of(args.repeat, arrival_us, prompts)[0]
            m_ps, m_sr = statistics.fmean(ps), statistics.fmean(sr)
            cells = [f"{n:>8}", f"{statistics.fmean(native):>12.3f}" if native else f"{'-':>12}",
                     f"{m_ps:>12.3f}", f"{m_sr:>12.3f}"]
            if native:
                m_v = statistics.fmean(native)
                cells += [f"{m_ps / m_v:>8.2f}", f"{m_sr / m_v:>8.2f}"]
            else:
                cells += [f"{'-':>8}", f"{'-':>8}"]
            cells.append(f"{add_us:>14.1f}")
            rows = {k: statistics.fmean(v) for k, v in ROWS.items() if v}
            cells.append("   rows/round " + "/".join(f"{rows[k]:.1f}" if k in rows else "-"
                                                   for k in ("vllm", "prefix-stop", "state-ready")))
            for v in ROWS.values():
                v.clear()
            if not group:
                cells.append(f"  [first round: state-ready {sr[0]:.3f} ms (max of any round {max(sr):.3f})"
                             + (f", vLLM {native[0]:.3f} ms]" if native else "]"))
            print(" ".join(cells))
    if not have_vllm:
        print("\nvLLM is not installed (or not 0.33): core figures only, no ratios.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
