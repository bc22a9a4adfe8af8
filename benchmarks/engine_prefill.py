"""Prefill throughput of our batched paged forward vs transformers' own forward, same weights.

Tiny models (default): one long sequence, 16 rows of mixed lengths and a round-sized batch (ours: ONE
batched call; transformers: the sequences one after another, as it has no paged/varlen batching);
best of --repeat timed runs after one warm-up.

Real sizes (`--real qwen3.5-0.8b qwen3-0.6b nemotron-h-1b [--layers N]`, benchmarks/engine_real.py):
random weights at the real widths, shared by both models, and issue 27's three cases: (a) one 2,048-token
prefill, (b) 16 rows / 8,192 tokens, half resuming after a cached 1,024-token prefix (our paged KV and
state in; transformers a copy of its prefix cache per row, copied outside the timing), (c) one decode
step of 16 rows at 2,048 context (transformers batched, its cache repeated per row). Medians of
--repeat interleaved runs; the max |logit difference| of the two models is printed beside each ratio.

    python benchmarks/engine_prefill.py [--models tiny-qwen3.5 ...] [--seq-len 1024] [--rows 16]
    python benchmarks/engine_prefill.py --real qwen3.5-0.8b --layers 4 [--cases abc] [--repeat 3]

`--scan-threads auto|1|N`: the torch threads our recurrent scans run with (engine/models/threads.py;
auto, the default, times 1 thread against all on the first calls of each shape and re-checks).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import engine_real  # noqa: E402
from radixflow.engine.loader import load_model  # noqa: E402
from radixflow.engine.models import RowInput, threads  # noqa: E402
from radixflow.engine.tiny import TINY_MODELS, ensure_tiny_model  # noqa: E402
from timing import timed_pair  # noqa: E402

BLOCK = 16


def make_rows(seqs: list[list[int]]) -> tuple[list[RowInput], int]:
    rows, page = [], 0
    for s in seqs:
        n_pages = -(-len(s) // BLOCK)
        # one logit per row, as a prefill fragment that ends a prompt would ask for
        rows.append(RowInput(s, 0, list(range(page, page + n_pages)), None, [(len(s), len(rows))], [len(s) - 1]))
        page += n_pages
    return rows, page


def bench_model(name: str, seq_len: int, n_rows: int, repeat: int) -> None:
    from transformers import AutoModelForCausalLM

    path = ensure_tiny_model(name)
    ours = load_model(path).model
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    long_seq = torch.randint(0, 256, (seq_len,), generator=gen).tolist()
    lengths = torch.randint(300, 2001, (n_rows,), generator=gen).tolist()
    mixed = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in lengths]
    # A round-sized batch too: 16 rows within a T = 2,048 token budget, as a bench round holds.
    small = torch.randint(40, 216, (n_rows,), generator=gen).tolist()
    round_rows = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in small]
    cases = ((f"1 x {seq_len}", [long_seq]), (f"{n_rows} mixed ({sum(lengths)} tok)", mixed),
             (f"{n_rows} round ({sum(small)} tok)", round_rows))
    for label, seqs in cases:
        rows, pages = make_rows(seqs)
        cache = ours.allocate_cache(pages, BLOCK, len(rows))
        t_ours, t_hf = timed_pair(lambda rows=rows, cache=cache: ours(rows, cache),
                                  lambda seqs=seqs: _hf_sequential(hf, seqs), repeat)
        n = sum(len(s) for s in seqs)
        print(f"{name:16s} {label:22s} ours {n / t_ours:9.0f} tok/s   transformers {n / t_hf:9.0f} tok/s"
              f"   speed-up x{t_hf / t_ours:.2f}", flush=True)


def _hf_sequential(hf, seqs: list[list[int]]) -> None:
    with torch.inference_mode():
        for s in seqs:
            hf(torch.tensor([s]), logits_to_keep=1)


def bench_real(name: str, layers: int | None, which: str, repeat: int) -> None:
    import statistics
    import time

    cfg = engine_real.real_config(name, layers)
    ours, hf = engine_real.build_pair(cfg)
    n_layers = len(ours.model.layers)
    for case in engine_real.make_cases(ours, hf, cfg["vocab_size"], which):
        diff = (case.run_ours(ours) - engine_real.run_hf(hf, case.hf_inputs())).abs().max().item()
        t_ours, t_hf = [], []
        for _ in range(repeat):
            calls = case.hf_inputs()
            t = time.perf_counter()
            case.run_ours(ours)
            t_ours.append(time.perf_counter() - t)
            t = time.perf_counter()
            engine_real.run_hf(hf, calls)
            t_hf.append(time.perf_counter() - t)
        a, b = statistics.median(t_ours), statistics.median(t_hf)
        print(f"{name:14s} {n_layers:2d} layers  {case.label:26s} {case.tokens:5d} tok  ours {case.tokens / a:8.0f} "
              f"tok/s  transformers {case.tokens / b:8.0f} tok/s  x{b / a:.2f}  max|dlogit| {diff:.1e}", flush=True)
    del ours, hf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(TINY_MODELS), choices=TINY_MODELS)
    ap.add_argument("--real", nargs="+", choices=engine_real.REAL_MODELS,
                    help="real-size random models instead of the tiny ones (cases a, b, c)")
    ap.add_argument("--layers", type=int, default=None, help="--real: cut each model to N layers")
    ap.add_argument("--cases", default="abc", help="--real: which of the cases a, b, c to run")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--scan-threads", default="auto",
                    help="threads of our recurrent scans: auto (timed, 1 vs all), 1, or a count N")
    args = ap.parse_args()
    try:
        threads.configure(args.scan_threads)
    except ValueError as e:
        ap.error(str(e))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, scan threads {args.scan_threads}, "
          f"load average {load:.1f}")
    if args.layers is not None and args.layers < 1:
        ap.error(f"--layers must be >= 1, got {args.layers}")
    if set(args.cases) - set("abc") or not args.cases:
        ap.error(f"--cases takes letters among a, b, c, got {args.cases!r}")
    if args.real:
        for name in args.real:
            bench_real(name, args.layers, args.cases, args.repeat)
        return
    for name in args.models:
        bench_model(name, args.seq_len, args.rows, args.repeat)


if __name__ == "__main__":
    main()
