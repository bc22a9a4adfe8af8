"""LRU vs round-robin tail eviction on an agentic workload under memory pressure (docs/eviction.md).

    python benchmarks/eviction_agentic.py --agents 32 --capacity 28 --tool-latency exp

Prints, per policy: TTFT and uncached-token percentiles, hit rate, evicted tokens, the kept fraction
of returning histories next to the analytic h = (m − n_a)/(n·s), and the p99 ratios rr-tail / lru.
"""

from __future__ import annotations

import argparse
import json
import time

from radixflow.sim.sessions import simulate_policies
from radixflow.workloads.agentic import AgenticSpec, agentic_sessions


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3-8b")
    p.add_argument("--gpu", default="a800")
    p.add_argument("--agents", type=int, default=32)
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--idle-fraction", type=float, default=0.75)
    p.add_argument("--call-time", type=float, default=1.0)
    p.add_argument("--tool-latency", default="exp")
    p.add_argument("--system-len", type=int, default=256)
    p.add_argument("--context-len", type=int, default=2048)
    p.add_argument("--append-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--capacity", type=float, default=28.0, help="cache capacity in full-prefix units")
    p.add_argument("--eviction", default="lru,rr-tail")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    spec = AgenticSpec(n_agents=a.agents, idle_fraction=a.idle_fraction, calls=a.calls,
                       system_len=a.system_len, context_len=a.context_len, append_len=a.append_len,
                       output_len=a.output_len,
                       tool_latency=a.tool_latency, call_time=a.call_time, seed=a.seed)
    t0 = time.perf_counter()
    out = simulate_policies(agentic_sessions(spec), a.model, a.gpu, a.eviction.split(","), f"{a.capacity}x")
    for row in out["policies"]:
        print(json.dumps(row))
    for r in out["ratios"]:
        print(json.dumps(r))
    print(f"wall {time.perf_counter() - t0:.1f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
