"""Paper-scale simulator experiments: one JSON file per model x arm x stream x order, resumable.

`radixflow experiment --preset paper --out DIR` runs SPEC §11's grid over the CPU cores (finished
cells are kept); `--calibrate` first picks S and T for the native arm on 64 held-out questions, as
the paper did, and freezes them for every arm. Render the results with `radixflow report DIR`.
"""

from __future__ import annotations

import os

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from radixflow.commands.common import positive_int
from radixflow.config import (
    CHECKPOINT_MODES,
    MAMBA_CACHE_MODES,
    SNAPSHOT_MODES,
    VLLM_VERSIONS,
    SchedulerConfig,
    help_of,
)
from radixflow.core.policies import ARMS
from radixflow.integrations.vllm.sim_backend import SCHEDULERS, arm_runner
from radixflow.report.experiment import PRESETS, preset, run_experiment, sim_setup
from radixflow.report.paper import MODELS
from radixflow.sim.cost_model import GPUS
from radixflow.workloads.qa import ORDERS, STREAMS


def _names(allowed):
    def parse(s: str) -> tuple[str, ...]:
        items = tuple(x.strip().lower() for x in s.split(",") if x.strip())
        bad = [x for x in items if x not in allowed]
        if bad or not items:
            raise ValueError(f"unknown {', '.join(bad) or 'empty list'}; choose from {', '.join(allowed)}")
        return items

    return parse


def add_arguments(p) -> None:
    p.add_argument(
        "--preset",
        default="paper",
        choices=list(PRESETS),
        help="paper: SPEC §11's full grid; quick: a small grid (about a minute) for every figure",
    )
    p.add_argument("--quick", dest="preset", action="store_const", const="quick", help="same as --preset quick")
    p.add_argument("--out", required=True, help="results directory (finished cells in it are not rerun)")
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="pick S, T for the native arm on 64 held-out questions, then freeze them for all arms",
    )
    p.add_argument("--jobs", type=positive_int, default=os.cpu_count() or 1, help="worker processes")
    p.add_argument("--models", default=None, help=f"comma list overriding the preset's ({', '.join(MODELS)})")
    p.add_argument("--arms", default=None, help=f"comma list overriding the preset's ({', '.join(ARMS)})")
    p.add_argument("--streams", default=None, help=f"comma list of {', '.join(STREAMS)}")
    p.add_argument("--orders", default=None, help=f"comma list of {', '.join(ORDERS)}")
    p.add_argument("--questions", type=positive_int, default=None, help="questions per stream (preset's default)")
    p.add_argument("--gpu", default=None, help=f"one of {', '.join(GPUS)} (default a800, as the paper)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument(
        "--snapshot-mode",
        default=None,
        choices=SNAPSHOT_MODES,
        help=help_of(SchedulerConfig, "snapshot_mode") + " (default: the preset's, vllm-align)",
    )
    p.add_argument("--checkpoints", default=None, choices=CHECKPOINT_MODES,
                   help=help_of(SchedulerConfig, "checkpoints") + " (default: the preset's, boundary); every QA and "
                        "multi-turn cell (the figure-1 toy instance keeps its own boundaries)")
    p.add_argument("--checkpoint-wait", default=None, help=help_of(SchedulerConfig, "checkpoint_wait"))
    p.add_argument("--branch-gap", type=float, default=None,
                   help="mean seconds between a question's branches (default: the preset's, 0.0005)")
    p.add_argument("--prefix-match-unit", type=int, default=None,
                   help=help_of(SchedulerConfig, "prefix_match_unit") + "; for every model (default: 0, "
                        "the block: vLLM 0.33's default)")
    p.add_argument("--vllm-version", default=None, choices=VLLM_VERSIONS,
                   help=help_of(SchedulerConfig, "vllm_version") + "; for every model (default: 0.33)")
    p.add_argument("--mamba-cache-mode", default=None, choices=MAMBA_CACHE_MODES,
                   help=help_of(SchedulerConfig, "mamba_cache_mode") + "; for every model (default: align)")
    p.add_argument("--scheduler", default="radixflow", choices=SCHEDULERS,
                   help="radixflow: radixflow's scheduler; vllm: vLLM 0.33's own Scheduler (the 'vllm' extra; "
                        "the radixflow+frag arm has no vLLM counterpart and is left out)")


def grid_from_args(args):
    grid = preset(args.preset)
    for flag, attr, allowed in (
        ("models", "models", MODELS),
        ("arms", "arms", tuple(ARMS)),
        ("streams", "streams", STREAMS),
        ("orders", "orders", ORDERS),
    ):
        value = getattr(args, flag)
        if value:
            setattr(grid, attr, _names(allowed)(value))
    if args.questions:
        grid.questions = args.questions
    if args.gpu:
        if args.gpu.lower() not in GPUS:
            raise ValueError(f"unknown GPU {args.gpu!r}; choose from {', '.join(GPUS)}")
        grid.gpu = args.gpu.lower()
    if args.seed is not None:
        grid.seed = args.seed
    grid.calibrate = args.calibrate
    if args.snapshot_mode:
        grid.snapshot_mode = args.snapshot_mode
    if args.branch_gap is not None:
        if args.branch_gap < 0:
            raise ValueError(f"--branch-gap must be >= 0, got {args.branch_gap}")
        grid.branch_gap = args.branch_gap
    if args.vllm_version:
        grid.vllm_version = args.vllm_version
    if args.mamba_cache_mode:
        grid.mamba_cache_mode = args.mamba_cache_mode
    if args.vllm_version or args.mamba_cache_mode:  # one clear line now, not one per cell
        SchedulerConfig(snapshot_mode=grid.snapshot_mode, vllm_version=grid.vllm_version,
                        mamba_cache_mode=grid.mamba_cache_mode).validate()
    if args.prefix_match_unit is not None:
        if args.prefix_match_unit < 0:
            raise ValueError(f"--prefix-match-unit must be >= 0 (0: the block), got {args.prefix_match_unit}")
        grid.prefix_match_unit = args.prefix_match_unit
        for model in grid.models:  # one clear line now if the unit does not fit a model's block
            sim_setup(grid, model, grid.budgets.get(model, (16, 8192))).scheduler_config()
    if args.checkpoints:
        grid.checkpoints = args.checkpoints
    if args.checkpoint_wait:
        SchedulerConfig(checkpoint_wait=args.checkpoint_wait).validate()  # one clear line, not one per cell
        grid.checkpoint_wait = args.checkpoint_wait
    grid.scheduler = args.scheduler
    if args.scheduler == "vllm" and grid.checkpoints != "boundary":
        raise ValueError(f"--checkpoints {grid.checkpoints} is radixflow's scheduler only: vLLM's own Scheduler "
                         "(--scheduler vllm) caches state at its block boundaries")
    if args.scheduler == "vllm":
        arm_runner("vllm")  # one clear line now if vLLM is missing, not one per cell
        if args.arms and "radixflow+frag" in grid.arms:
            raise ValueError("--scheduler vllm: arm radixflow+frag has no vLLM counterpart (the plugin does "
                             "not split fragments)")
        grid.arms = tuple(a for a in grid.arms if a != "radixflow+frag")
    return grid


def run(args) -> int:
    grid = grid_from_args(args)
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[last]}"),
    )
    with Progress(*columns) as bar:

        def progress(total):
            task = bar.add_task("cells", total=total, last="")

            def advance(result):
                name, wall, err = result
                bar.update(task, advance=1, last=f"{name} {'FAILED' if err else f'{wall:.1f}s'}")

            return advance

        if grid.calibrate:
            bar.console.print("calibrating S, T for radix on 64 held-out questions per model ...")
        rep = run_experiment(grid, args.out, args.jobs, progress)
    print(
        f"{len(rep.ran)} cells run, {len(rep.skipped)} already done, {len(rep.failed)} failed, "
        f"in {rep.wall:.1f} s with {args.jobs} process(es); results in {args.out}"
    )
    if rep.ran:
        walls = sorted(w for _, w in rep.ran)
        print(f"cell wall time: median {walls[len(walls) // 2]:.2f} s, max {walls[-1]:.2f} s")
    for name, err in rep.failed:
        print(f"warning: cell {name} failed: {err}")
    return 1 if rep.failed else 0
