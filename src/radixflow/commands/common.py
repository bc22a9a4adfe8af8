"""Flags shared by simulate, bench and experiment, read into the same config tree."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from rich.console import Console
from rich.table import Table

from radixflow.config import CHECKPOINT_MODES, HANDOFF_MODES, SNAPSHOT_MODES, SchedulerConfig, help_of
from radixflow.core.branch import Branch
from radixflow.core.metrics import ArmMeasures, cost_identity
from radixflow.core.policies import ARMS
from radixflow.workloads.figure1 import FIGURE1_BUDGETS, figure1_records
from radixflow.workloads.qa import ORDERS, STREAMS, paper_questions, stream_records
from radixflow.workloads.trace import branch_from_record, load_trace


def positive_int(s: str) -> int:
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def add_workload_flags(p: argparse.ArgumentParser, default_rate: float | None = None) -> None:
    p.add_argument("--policy", default="radix,radixflow",
                   help=f"comma list of arms ({', '.join(ARMS)}) or 'all'")
    p.add_argument("--workload", default="multi-candidate",
                   help="multi-candidate | figure1 | agentic | multi-turn | a .jsonl trace path")
    p.add_argument("--stream", default="all", choices=[*STREAMS, "all"])
    p.add_argument("--order", default="both", choices=[*ORDERS, "both"])
    p.add_argument("--questions", type=positive_int, default=None, help="questions per stream (default: all 1,551)")
    p.add_argument("--rate", type=float, default=default_rate,
                   help="Poisson arrival rate, requests/s (default: 5 for Qwen, 1.5 for Nemotron; 0 = all at t=0)")
    p.add_argument("--branch-gap", type=float, default=0.0,
                   help="mean seconds between a question's branches (0: all four arrive together)")
    p.add_argument("--dataset-path", default=None, help="directory with QuALITY / RACE files to use instead of "
                                                        "the synthetic shapes")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json for --dataset-path token counts")
    p.add_argument("--article-scale", type=float, default=1.0,
                   help="multiply synthetic article lengths (the CPU engine uses short documents)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", dest="json_path", default=None, help="write the results here")


def add_scheduler_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-num-seqs", type=positive_int, default=None, help=help_of(SchedulerConfig, "max_num_seqs"))
    p.add_argument("--max-num-batched-tokens", type=positive_int, default=None,
                   help=help_of(SchedulerConfig, "max_num_batched_tokens"))
    p.add_argument("--block-size", type=positive_int, default=16, help=help_of(SchedulerConfig, "block_size"))
    p.add_argument("--state-interval", type=positive_int, default=512,
                   help=help_of(SchedulerConfig, "state_interval"))
    p.add_argument("--snapshot-mode", default="every-boundary", choices=SNAPSHOT_MODES,
                   help=help_of(SchedulerConfig, "snapshot_mode"))
    p.add_argument("--checkpoints", default="boundary", choices=CHECKPOINT_MODES,
                   help=help_of(SchedulerConfig, "checkpoints"))
    p.add_argument("--checkpoint-wait", default="grid", help=help_of(SchedulerConfig, "checkpoint_wait"))
    p.add_argument("--handoff", default="off", choices=HANDOFF_MODES, help=help_of(SchedulerConfig, "handoff"))
    p.add_argument("--handoff-max-levels", type=positive_int, default=2,
                   help=help_of(SchedulerConfig, "handoff_max_levels"))
    p.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false",
                   help="disable prefix caching (--enable-prefix-caching is the default)")
    p.add_argument("--enable-prefix-caching", dest="enable_prefix_caching", action="store_true")
    p.set_defaults(enable_prefix_caching=True)


PAPER_BUDGETS = {  # SPEC §11: (S, T), calibrated once by the paper for the native arm
    "qwen3.5-0.8b": (16, 8192), "qwen3.5-4b": (64, 8192), "qwen3.5-9b": (64, 8192),
    "qwen3.5-27b": (64, 8192), "nemotron-nano-9b-v2": (16, 8192), "qwen3-8b": (16, 8192),
}
PAPER_RATES = {"nemotron-nano-9b-v2": 1.5}


def scheduler_config(args, model_name: str, default_budget: tuple[int, int] = (16, 8192)) -> SchedulerConfig:
    s, t = PAPER_BUDGETS.get(model_name, default_budget)
    if args.workload == "figure1":
        s, t = FIGURE1_BUDGETS["max_num_seqs"], FIGURE1_BUDGETS["max_num_batched_tokens"]
    cfg = SchedulerConfig(max_num_seqs=args.max_num_seqs or s, max_num_batched_tokens=args.max_num_batched_tokens or t,
                          block_size=args.block_size, state_interval=args.state_interval,
                          enable_prefix_caching=args.enable_prefix_caching,
                          snapshot_mode=getattr(args, "snapshot_mode", "every-boundary"),
                          checkpoints=getattr(args, "checkpoints", "boundary"),
                          checkpoint_wait=getattr(args, "checkpoint_wait", "grid"),
                          handoff=getattr(args, "handoff", "off"),
                          handoff_max_levels=getattr(args, "handoff_max_levels", 2))
    cfg.validate()
    return cfg


def build_workloads(args, model_name: str, vocab: int = 32000) -> list[tuple[str, list[Branch]]]:
    """(label, branches) per stream x order; one element for figure1 or a trace file."""
    if args.workload == "figure1":
        return [("figure1", [branch_from_record(r, "figure1", vocab) for r in figure1_records()])]
    if args.workload.endswith(".jsonl") or Path(args.workload).is_file():
        return [(Path(args.workload).name, load_trace(args.workload, vocab))]
    if args.workload != "multi-candidate":
        raise ValueError(f"unknown workload {args.workload!r}: multi-candidate | figure1 | a .jsonl path")
    rate = args.rate if args.rate is not None else PAPER_RATES.get(model_name, 5.0)
    if rate < 0 or math.isnan(rate):
        raise ValueError(f"--rate must be >= 0, got {rate}")
    if args.dataset_path:
        from radixflow.workloads.datasets import load_questions

        questions = load_questions(args.dataset_path, args.tokenizer)
        if args.questions:
            questions = questions[: args.questions]
    else:
        questions = paper_questions(args.seed, args.questions, args.article_scale)
    streams = STREAMS if args.stream == "all" else (args.stream,)
    orders = ORDERS if args.order == "both" else (args.order,)
    out = []
    for st in streams:
        for od in orders:
            recs = stream_records(questions, st, od, rate, args.seed, prefix=f"{st}-{od}:",
                                  branch_gap=getattr(args, "branch_gap", 0.0))
            out.append((f"{st}/{od}", [branch_from_record(r, f"{st}/{od}", vocab) for r in recs]))
    return out


def print_arms(arms: list[ArmMeasures], title: str, console: Console | None = None) -> None:
    console = console or Console(width=200)
    t = Table(title=title)
    cols = [("policy", "policy", "{}"), ("rounds K", "rounds", "{:,}"), ("fragments", "fragments", "{:,}"),
            ("tokens", "tokens", "{:,}"), ("rows/round", "rows_per_round", "{:.2f}"),
            ("rows/branch", "rows_per_branch", "{:.2f}"),
            ("empty slots", "empty_slots", "{:,}"), ("reuse %", "reuse_rate", "{:.3f}"),
            ("latency mean s", "latency_mean", "{:.3f}"), ("p95 s", "latency_p95", "{:.3f}"),
            ("1st-sel wait s", "first_selection_wait_mean", "{:.3f}"), ("T_host s", "host_time", "{:.2f}"),
            ("c̄ ms", "cost_per_round", "{:.1f}"), ("blocked", "blocked_deferrals", "{:,}"),
            ("LB", "lower_bound", "{}")]
    for name, _, _ in cols:
        t.add_column(name, justify="right")
    for a in arms:
        row = []
        for _, attr, fmt in cols:
            v = getattr(a, attr)
            if attr == "cost_per_round":
                v = v * 1000
            row.append("-" if v is None else fmt.format(v))
        t.add_row(*row)
    console.print(t)
    if len(arms) >= 2:
        base = arms[0]
        for a in arms[1:]:
            ci = cost_identity(base, a)
            console.print(f"cost identity {base.policy} → {a.policy}: ΔT_host = {ci.delta_host:.3f} s = round gain "
                          f"{ci.round_gain:.3f} s − cost drift {ci.cost_drift:.3f} s "
                          f"(rounds {base.rounds:,} → {a.rounds:,}, {100 * (1 - a.rounds / base.rounds):.1f}% fewer)"
                          if base.rounds else "")


def write_json(path: str, payload: dict) -> None:
    def clean(x):
        if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(clean(payload), indent=2) + "\n")


def arms_payload(arms: list[ArmMeasures], meta: dict) -> dict:
    base = arms[0] if arms else None
    out = []
    for a in arms:
        d = a.to_dict()
        if base is not None and a is not base:
            ci = cost_identity(base, a)
            d["cost_identity"] = {"baseline": base.policy, "delta_host": ci.delta_host,
                                  "round_gain": ci.round_gain, "cost_drift": ci.cost_drift}
        out.append(d)
    return {"meta": meta, "arms": out}
