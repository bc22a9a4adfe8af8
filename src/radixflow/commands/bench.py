"""Runs the scheduling arms on the real PyTorch engine over one trace and compares them."""

from __future__ import annotations

import time

from rich.progress import Progress

from radixflow.commands.common import (
    add_scheduler_flags,
    add_workload_flags,
    arms_payload,
    build_workloads,
    print_arms,
    scheduler_config,
    write_json,
)
from radixflow.core.loop import run_trace
from radixflow.core.metrics import measure, merge
from radixflow.core.policies import parse_arms
from radixflow.workloads.trace import fresh_copies


def parse_bytes(s: str) -> int:
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 1000, "mb": 10**6, "gb": 10**9, "b": 1}
    low = s.strip().lower()
    for u, mult in units.items():
        if low.endswith(u):
            return int(float(low[: -len(u)]) * mult)
    return int(float(low))


def add_arguments(p) -> None:
    p.add_argument("--model", default="tiny-qwen3.5", help="embedded tiny model name or an HF-format directory")
    p.add_argument("--device", default="cpu", help="cpu | cuda")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--kv-cache-memory", type=parse_bytes, default=parse_bytes("256MiB"),
                   help="bytes for KV pages + state slots (suffixes KiB/MiB/GiB)")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--torch-threads", type=int, default=1,
                   help="CPU threads for torch (1 is steadier on a shared 2-core machine; 0 = torch's default)")
    add_workload_flags(p, default_rate=40.0)
    add_scheduler_flags(p)
    # A state boundary at every page (vLLM align mode keeps one per block): every shared prefix then
    # holds a boundary, so reuse does not depend on round timing (see docs/simulator.md).
    p.set_defaults(questions=48, article_scale=0.1, state_interval=16, stream="all", order="forward")


def run(args) -> int:
    import torch

    from radixflow.engine.engine import Engine, EngineConfig
    from radixflow.engine.loader import load_model
    from radixflow.engine.tiny import resolve_model

    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)
    arms = parse_arms(args.policy)
    loaded = load_model(resolve_model(args.model), args.device,
                        {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(args.dtype, torch.float32))
    cfg = scheduler_config(args, args.model, default_budget=(16, 2048))
    vocab = loaded.model.vocab_size
    workloads = build_workloads(args, args.model, vocab=min(vocab, 32000))
    for label, brs in workloads:
        for b in brs:
            if max(b.prompt) >= vocab:
                raise ValueError(f"{label}: branch {b.key} has token {max(b.prompt)} outside the vocabulary "
                                 f"[0, {vocab})")
    results = []
    firsts: list[dict] = []
    t0 = time.perf_counter()
    total = sum(len(w) for _, w in workloads) * len(arms)
    with Progress() as bar:
        task = bar.add_task(f"bench {args.model}", total=total)
        for arm in arms:
            parts = []
            first: dict = {}
            for _, brs in workloads:
                eng = Engine(EngineConfig(model=args.model, policy=arm.name, device=args.device, dtype=args.dtype,
                                          scheduler=cfg, kv_cache_memory=args.kv_cache_memory,
                                          max_model_len=args.max_model_len, seed=args.seed), loaded=loaded)
                copies = fresh_copies(brs)
                res = run_trace(eng.scheduler, eng.executor, copies, progress=lambda n: bar.advance(task, n))
                parts.append(measure(arm.name, res))
                first.update({b.key: b.output[0] for b in copies if b.output})
            results.append(merge(arm.name, parts))
            firsts.append(first)
    wall = time.perf_counter() - t0
    print_arms(results, f"{args.model} on {args.device} — S={cfg.max_num_seqs}, T={cfg.max_num_batched_tokens}, "
                        f"interval {cfg.state_interval}, workload {args.workload} ({len(workloads)} part(s))")
    agreement = []
    for arm, first in zip(results, firsts):
        same = sum(1 for k, v in first.items() if firsts[0].get(k) == v)
        agreement.append(100.0 * same / max(1, len(first)))
        if arm is not results[0]:
                print(f"first-token agreement {arm.policy} vs {results[0].policy}: {agreement[-1]:.2f}% "
                  f"({same}/{len(first)})")
    print(f"benchmarked {len(arms)} arm(s) in {wall:.1f} s")
    if args.json_path:
        payload = arms_payload(results, {"command": "bench", "model": args.model, "device": args.device,
                                         "workload": args.workload, "parts": [x for x, _ in workloads],
                                         "max_num_seqs": cfg.max_num_seqs,
                                         "max_num_batched_tokens": cfg.max_num_batched_tokens,
                                         "block_size": cfg.block_size, "state_interval": cfg.state_interval,
                                         "seed": args.seed, "wall_time": wall})
        for d, a in zip(payload["arms"], agreement):
            d["first_token_agreement"] = a
        write_json(args.json_path, payload)
    return 0
