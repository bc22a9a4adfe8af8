"""What simulate, bench and serve share: the workload flags, the SchedulerConfig the flags build, the
results' meta, tables and JSON (the shared flags themselves: commands/flags.py)."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path

from rich.console import Console
from rich.table import Table

from radixflow.commands import flags
from radixflow.commands.flags import add_scheduler_flags, positive_int, refuse
from radixflow.config import SchedulerConfig, software_versions
from radixflow.core.branch import Branch
from radixflow.core.metrics import ArmMeasures, cost_identity
from radixflow.core.policies import parse_arms
from radixflow.workloads.figure1 import FIGURE1_BUDGETS, figure1_records
from radixflow.workloads.qa import ORDERS, STREAMS, paper_questions, stream_records
from radixflow.workloads.trace import branch_from_record, load_trace

__all__ = ["Plan", "add_scheduler_flags", "add_workload_flags", "arms_payload", "build_workloads", "check_workload",
           "check_vllm_geometry", "check_vllm_scheduler",
           "policies", "positive_int", "print_arms", "run_meta", "scheduler_config", "write_json"]

QA_WORKLOADS = ("multi-candidate", "figure1")
# flags only the multi-candidate QA streams read (figure1 and trace files bring their own requests)
QA_FLAGS = ("stream", "order", "questions", "rate", "branch_gap", "dataset_path", "tokenizer", "article_scale")


def workload_name(allowed: tuple[str, ...]):
    """A type: one of `allowed` or a trace file (.jsonl or an existing file; read later)."""
    def workload(text: str) -> str:
        if text in allowed or text.endswith(".jsonl") or Path(text).is_file():
            return text
        raise argparse.ArgumentTypeError(f"unknown workload {text!r}; choose from {' | '.join(allowed)} "
                                         "| a .jsonl trace path")

    return workload


def add_workload_flags(p: argparse.ArgumentParser, default_rate: float | None = None,
                       workloads: tuple[str, ...] = QA_WORKLOADS) -> None:
    flags.add(p, "--policy", default=None, help=flags.FLAGS["--policy"]["help"] + " (default: radix,radixflow; "
                                                                               "the session workloads: radix)")
    p.add_argument("--workload", default="multi-candidate", type=workload_name(workloads),
                   help=f"{' | '.join(workloads)} | a .jsonl trace path")
    p.add_argument("--stream", default="all", choices=[*STREAMS, "all"], help="multi-candidate: the question stream")
    p.add_argument("--order", default="both", choices=[*ORDERS, "both"], help="multi-candidate: question order")
    p.add_argument("--questions", type=positive_int, default=None, help="questions per stream (default: all 1,551)")
    p.add_argument("--rate", type=flags.non_negative_float, default=default_rate,
                   help="Poisson arrival rate, requests/s (default: 5 for Qwen, 1.5 for Nemotron; 0 = all at t=0)")
    p.add_argument("--branch-gap", type=flags.non_negative_float, default=0.0,
                   help="mean seconds between a question's branches (0: all four arrive together)")
    p.add_argument("--dataset-path", default=None, help="directory with QuALITY / RACE files to use instead of "
                                                        "the synthetic shapes")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json for --dataset-path token counts")
    p.add_argument("--article-scale", type=flags.non_negative_float, default=1.0,
                   help="multiply synthetic article lengths (the CPU engine uses short documents)")
    flags.add(p, "--seed", "--json")


def policies(args, default: str = "radix,radixflow") -> list:
    """The arms of --policy (None: `default`)."""
    return parse_arms(args.policy or default)


def check_workload(args) -> None:
    """Refuses the QA stream flags where the workload does not read them (before any work is done)."""
    if args.workload != "multi-candidate":
        refuse(args, QA_FLAGS, f"only --workload multi-candidate reads it, not {args.workload}")
    elif not args.dataset_path:
        refuse(args, ("tokenizer",), "token counts of --dataset-path files; give --dataset-path too")


PAPER_BUDGETS = {  # SPEC §11: (S, T), calibrated once by the paper for the native arm
    "qwen3.5-0.8b": (16, 8192), "qwen3.5-4b": (64, 8192), "qwen3.5-9b": (64, 8192),
    "qwen3.5-27b": (64, 8192), "nemotron-nano-9b-v2": (16, 8192), "qwen3-8b": (16, 8192),
}
PAPER_RATES = {"nemotron-nano-9b-v2": 1.5}
_SCHEDULER_FIELDS = tuple(f.name for f in fields(SchedulerConfig))


def scheduler_config(args, model_name: str = "", default_budget: tuple[int, int] = (16, 8192),
                     **fixed) -> SchedulerConfig:
    """The SchedulerConfig of the flags: every SchedulerConfig field the command has a flag for (dest =
    field name) is read, None meaning the default; S and T default to the paper's budgets of
    `model_name` (figure1: its own); --handoff defaults to `off` for --workload figure1 (the paper's
    rounds) and --scheduler vllm (vLLM cannot hand off), else to SchedulerConfig's (auto); `fixed`
    overrides. Validated (ValueError naming the flag)."""
    s, t = PAPER_BUDGETS.get(model_name, default_budget)
    if getattr(args, "workload", None) == "figure1":
        s, t = FIGURE1_BUDGETS["max_num_seqs"], FIGURE1_BUDGETS["max_num_batched_tokens"]
    values = {"max_num_seqs": s, "max_num_batched_tokens": t}
    if getattr(args, "workload", None) == "figure1" or getattr(args, "scheduler", "radixflow") == "vllm":
        values["handoff"] = "off"  # the paper's Figure 1 and vLLM's own Scheduler wait; a --handoff given wins
    values.update({k: getattr(args, k) for k in _SCHEDULER_FIELDS if getattr(args, k, None) is not None})
    values.update(fixed)
    cfg = SchedulerConfig(**values)
    cfg.validate()
    if cfg.checkpoints != "branch":
        refuse(args, ("checkpoint_wait", "tail_checkpoints"),
               f"read only with --checkpoints branch, not {cfg.checkpoints}")
    if cfg.handoff == "off":
        refuse(args, ("handoff_max_levels",), "read only with --handoff on | auto")
    return cfg


def check_vllm_geometry(args, cfg: SchedulerConfig, hybrid: bool) -> None:
    """`cfg` as resolved (spec/vllm_align.apply_vllm_align): a hybrid model under vllm-align runs
    vLLM's block, so a --block-size / --state-interval given beside it that differs is refused, not dropped."""
    if hybrid and cfg.snapshot_mode == "vllm-align":
        refuse(args, [d for d in ("block_size", "state_interval") if getattr(args, d) != getattr(cfg, d)],
               f"--snapshot-mode vllm-align sets block = state interval = vLLM's hybrid block ({cfg.block_size} "
               f"here)")


def check_vllm_scheduler(args) -> None:
    """What vLLM's own Scheduler (--scheduler vllm) has no counterpart for, refused where set."""
    if getattr(args, "scheduler", "radixflow") != "vllm":
        return
    refuse(args, ("eviction",), "radixflow's cache only: vLLM's block pool evicts in its own LRU order")
    refuse(args, ("state_interval",), "vLLM keeps state per block (align mode): give --block-size")
    if args.snapshot_mode not in ("every-boundary", "vllm-align"):
        refuse(args, ("snapshot_mode",), "vLLM's own Scheduler runs its align mode: use vllm-align")


SCHEDULER_META = ("max_num_seqs", "max_num_batched_tokens", "block_size", "state_interval", "enable_prefix_caching",
                  "snapshot_mode", "internal_checkpoint", "prefix_match_unit", "vllm_version", "mamba_cache_mode",
                  "checkpoints", "checkpoint_wait", "handoff", "handoff_max_levels", "eviction", "num_kv_pages",
                  "num_state_slots", "cache_memory_bytes")


def run_meta(command: str, cfg: SchedulerConfig | None = None, **settings) -> dict:
    """A results file's meta: the command, every scheduler setting of `cfg` (the one the Scheduler
    got), the other `settings` that shape the figures, and the software versions."""
    meta = {"command": command, **settings}
    if cfg is not None:
        meta.update({k: getattr(cfg, k) for k in SCHEDULER_META})
    meta["versions"] = software_versions()
    return meta


@dataclass
class Plan:
    """What a command would run, built from its flags without running it (`plan(args)` in each command):
    the results' meta, the SchedulerConfig handed to the Scheduler, the engine's config (bench, serve)
    and whatever else the command needs."""

    meta: dict
    scheduler: SchedulerConfig | None = None
    engine: object | None = None
    extra: dict = field(default_factory=dict)


def build_workloads(args, model_name: str, vocab: int = 32000) -> list[tuple[str, list[Branch]]]:
    """(label, branches) per stream x order; one element for figure1 or a trace file."""
    if args.workload == "figure1":
        return [("figure1", [branch_from_record(r, "figure1", vocab) for r in figure1_records()])]
    if args.workload.endswith(".jsonl") or Path(args.workload).is_file():
        return [(Path(args.workload).name, load_trace(args.workload, vocab))]
    if args.workload != "multi-candidate":
        raise ValueError(f"unknown workload {args.workload!r}: multi-candidate | figure1 | a .jsonl path")
    rate = args.rate if args.rate is not None else PAPER_RATES.get(model_name, 5.0)
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
