"""flop-aware vs lru vs rr-tail under memory pressure: prefill FLOPs saved, hit rate, p99 TTFT
(docs/eviction.md). Three traces, each run once per policy on the same prompts:

- multi-turn: a hybrid chat (many users, five turns, history resent) with branch checkpoints and a
  state pool tighter than the users' histories;
- agentic: RR-Evict's agents on the same hybrid model with a tight KV cache;
- paper: the multi-candidate workload (120 questions, three streams, 3 req/s) with vLLM-sized blocks
  and a cache budget of a few GB.

    python benchmarks/eviction_flops.py [--model qwen3.5-4b] [--policies lru,rr-tail,flop-aware]

FLOPs saved = Σ over calls of the prefill FLOPs of the tokens each resumed from (the model's dense,
attention and recurrent FLOPs, context-dependent), as a share of the prefill FLOPs of every prompt.
"""

from __future__ import annotations

import argparse
import json
import time

from radixflow.config import SchedulerConfig
from radixflow.core.metrics import percentile
from radixflow.core.policies import get_arm
from radixflow.core.scheduler import Scheduler
from radixflow.sim.cost_model import CostModel, get_gpu
from radixflow.sim.executor import SimExecutor
from radixflow.sim.runner import SimSetup, reuse_costs, run_arm
from radixflow.sim.sessions import run_sessions
from radixflow.spec import get_spec
from radixflow.workloads.agentic import AgenticSpec, agentic_sessions
from radixflow.workloads.multiturn import ChatSpec, chat_sessions
from radixflow.workloads.qa import paper_questions, stream_records
from radixflow.workloads.trace import branch_from_record


def sessions_row(name, spec, sessions, cfg, gpu):
    costs = reuse_costs(spec, cfg.block_size)
    sched = Scheduler(cfg, get_arm("radix"), spec.is_hybrid, costs)
    run = run_sessions(sched, SimExecutor(CostModel(spec, gpu, block_size=cfg.block_size), spec.vocab_size),
                       sessions, on_round=lambda s, b: s.check_integrity())
    assert sched.holds_nothing()
    saved = sum(costs.prefill_flops(0, c.cached) for c in run.calls)
    total = sum(costs.prefill_flops(0, c.prompt_len) for c in run.calls)
    prompt = sum(c.prompt_len for c in run.calls)
    return {"policy": name, "flops_saved_pct": 100 * saved / total, "flops_saved": saved,
            "hit_pct": 100 * sum(c.cached for c in run.calls) / prompt,
            "ttft_p99": percentile([c.ttft for c in run.calls], 0.99), "calls": len(run.calls)}


def paper_row(name, spec, gpu, block, questions, utilization, wait="grid"):
    qs = paper_questions(0, questions)
    parts = []
    for st in ("cold", "reuse", "mixed"):
        recs = stream_records(qs, st, "forward", 3.0, 0, prefix=f"{st}:")
        parts.append([branch_from_record(r, st, 32000) for r in recs])
    cfg = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=8192, block_size=block, state_interval=block,
                          eviction=name, checkpoints="branch", checkpoint_wait=wait, handoff="off")
    setup = SimSetup(spec, gpu, cfg, gpu_memory_utilization=utilization)
    m, runs = run_arm(setup, get_arm("radixflow"), parts)
    costs = reuse_costs(spec, block)
    branches = [b for r in runs for b in r.branches]
    saved = sum(costs.prefill_flops(0, b.cached_tokens or 0) for b in branches)
    total = sum(costs.prefill_flops(0, b.prompt_len) for b in branches)
    ttft = [b.first_token_at - b.arrival for b in branches]
    return {"policy": name, "flops_saved_pct": 100 * saved / total, "flops_saved": saved, "hit_pct": m.reuse_rate,
            "ttft_p99": percentile(ttft, 0.99), "calls": len(branches)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3.5-4b")
    p.add_argument("--gpu", default="a800")
    p.add_argument("--policies", default="lru,rr-tail,flop-aware")
    p.add_argument("--users", type=int, default=32)
    p.add_argument("--state-slots", type=int, default=32,
                   help="multi-turn: the tight state pool (working states of running rows included)")
    p.add_argument("--chat-capacity", type=int, default=1_000_000, help="multi-turn: KV tokens")
    p.add_argument("--agents", type=int, default=24)
    p.add_argument("--agent-capacity", type=int, default=40_000, help="agentic: KV tokens")
    p.add_argument("--agent-slots", type=int, default=64)
    p.add_argument("--questions", type=int, default=120)
    p.add_argument("--paper-utilization", type=float, default=0.16,
                   help="paper workload: GPU memory share (weights + a few GB of cache)")
    p.add_argument("--traces", default="multi-turn,agentic,paper")
    p.add_argument("--checkpoint-wait", default="grid", help="paper workload: the branch-checkpoint wait rule")
    p.add_argument("--chat-seqs", type=int, default=8, help="multi-turn: S (rows per round)")
    p.add_argument("--think-time", type=float, default=10.0, help="multi-turn: mean seconds between turns")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    spec, gpu = get_spec(a.model), get_gpu(a.gpu)
    policies = a.policies.split(",")
    out = {}
    t0 = time.perf_counter()
    chat = chat_sessions(ChatSpec(users=a.users, turns=5, think_time=a.think_time, rewrite_fraction=0.25, seed=1))
    agents = agentic_sessions(AgenticSpec(n_agents=a.agents, calls=12, context_len=1024, append_len=64,
                                          output_len=16, system_len=128, seed=1))
    for trace in a.traces.split(","):
        rows = []
        for name in policies:
            if trace == "multi-turn":
                cfg = SchedulerConfig(max_num_seqs=a.chat_seqs, block_size=16, state_interval=512, eviction=name,
                                      checkpoints="branch", handoff="off", num_kv_pages=a.chat_capacity // 16,
                                      num_state_slots=a.state_slots)
                rows.append(sessions_row(name, spec, chat, cfg, gpu))
            elif trace == "agentic":
                cfg = SchedulerConfig(max_num_seqs=16, block_size=16, state_interval=512, eviction=name,
                                      checkpoints="branch", handoff="off", num_kv_pages=a.agent_capacity // 16,
                                      num_state_slots=a.agent_slots)
                rows.append(sessions_row(name, spec, agents, cfg, gpu))
            else:
                rows.append(paper_row(name, spec, gpu, 528, a.questions, a.paper_utilization, a.checkpoint_wait))
        out[trace] = rows
        print(f"\n{trace} ({spec.name})")
        print(f"{'policy':>12} {'FLOPs saved %':>14} {'hit %':>7} {'p99 TTFT s':>11} {'calls':>6}")
        for r in rows:
            print(f"{r['policy']:>12} {r['flops_saved_pct']:14.2f} {r['hit_pct']:7.2f} {r['ttft_p99']:11.3f} "
                  f"{r['calls']:6d}")
        base = rows[0]
        for r in rows[1:]:
            print(f"  {r['policy']} / {base['policy']}: FLOPs saved x{r['flops_saved'] / base['flops_saved']:.3f}")
    print(f"\nwall {time.perf_counter() - t0:.1f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
