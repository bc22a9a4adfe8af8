"""Paper-scale simulator experiments: one JSON file per model x arm x stream x order, resumable.

`radixflow experiment --preset paper --out DIR` runs SPEC §11's grid over the CPU cores (finished
cells are kept); `--calibrate` first picks S and T for the native arm on 64 held-out questions, as
the paper did, and freezes them for every arm. Render the results with `radixflow report DIR`.
"""

from __future__ import annotations

import os

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from radixflow.commands import flags
from radixflow.commands.common import Plan, run_meta
from radixflow.commands.flags import names_list, positive_int
from radixflow.config import SchedulerConfig, help_of
from radixflow.core.policies import ARMS
from radixflow.integrations.vllm.sim_backend import SCHEDULERS, arm_runner
from radixflow.report.experiment import PRESETS, preset, run_experiment, sim_setup
from radixflow.report.paper import MODELS
from radixflow.sim.cost_model import GPUS
from radixflow.workloads.qa import ORDERS, STREAMS


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
    p.add_argument("--models", type=names_list(MODELS), default=None,
                   help=f"comma list overriding the preset's ({', '.join(MODELS)})")
    p.add_argument("--arms", type=names_list(tuple(ARMS)), default=None,
                   help=f"comma list overriding the preset's ({', '.join(ARMS)})")
    p.add_argument("--streams", type=names_list(STREAMS), default=None, help=f"comma list of {', '.join(STREAMS)}")
    p.add_argument("--orders", type=names_list(ORDERS), default=None, help=f"comma list of {', '.join(ORDERS)}")
    p.add_argument("--questions", type=positive_int, default=None, help="questions per stream (preset's default)")
    flags.add(p, "--gpu", default=None, help=f"one of {', '.join(GPUS)} (default a800, as the paper)")
    flags.add(p, "--seed", default=None, help="seed of the workloads (default: the preset's, 0)")
    flags.add(p, "--snapshot-mode", default=None,
              help=flags.FLAGS["--snapshot-mode"]["help"] + " (default: the preset's, vllm-align)")
    flags.add(p, "--checkpoints", default=None,
              help=flags.FLAGS["--checkpoints"]["help"] + " (default: the preset's, boundary); every QA and "
                   "multi-turn cell (the figure-1 toy instance keeps its own boundaries)")
    flags.add(p, "--checkpoint-wait", default=None)
    flags.add(p, "--handoff", default=None,
              help=help_of(SchedulerConfig, "handoff") + " for SchedulerConfig; here the preset's, off (the paper's "
                   "arms); every QA cell")
    flags.add(p, "--handoff-max-levels", default=None)
    p.add_argument("--branch-gap", type=flags.non_negative_float, default=None,
                   help="mean seconds between a question's branches (default: the preset's, 0.0005)")
    flags.add(p, "--prefix-match-unit", default=None,
              help=flags.FLAGS["--prefix-match-unit"]["help"] + "; for every model (default: 0, the block: "
                   "vLLM 0.33's default)")
    flags.add(p, "--vllm-version", default=None,
              help=flags.FLAGS["--vllm-version"]["help"] + "; for every model (default: 0.33)")
    flags.add(p, "--mamba-cache-mode", default=None,
              help=flags.FLAGS["--mamba-cache-mode"]["help"] + "; for every model (default: align)")
    p.add_argument("--scheduler", default="radixflow", choices=SCHEDULERS,
                   help="radixflow: radixflow's scheduler; vllm: vLLM 0.33's own Scheduler (the 'vllm' extra; "
                        "the radixflow+frag arm has no vLLM counterpart and is left out)")
    flags.remember_defaults(p)


# flag dest -> Grid field, where a given value replaces the preset's as it is
_GRID_FLAGS = ("models", "arms", "streams", "orders", "questions", "gpu", "seed", "snapshot_mode", "checkpoints",
               "checkpoint_wait", "handoff", "handoff_max_levels", "branch_gap", "prefix_match_unit", "vllm_version",
               "mamba_cache_mode")


def grid_from_args(args):
    grid = preset(args.preset)
    for name in _GRID_FLAGS:
        value = getattr(args, name)
        if value is not None:
            setattr(grid, name, value)
    grid.calibrate = args.calibrate
    grid.scheduler = args.scheduler
    if args.checkpoint_wait is not None and grid.checkpoints != "branch":
        raise ValueError(f"--checkpoint-wait {args.checkpoint_wait}: the wait rule of --checkpoints branch, not of "
                         f"{grid.checkpoints}")
    if args.handoff_max_levels is not None and grid.handoff == "off":
        raise ValueError(f"--handoff-max-levels {args.handoff_max_levels}: read only with --handoff on | auto")
    if args.scheduler == "vllm" and grid.checkpoints != "boundary":
        raise ValueError(f"--checkpoints {grid.checkpoints} is radixflow's scheduler only: vLLM's own Scheduler "
                         "(--scheduler vllm) caches state at its block boundaries")
    if args.scheduler == "vllm" and grid.handoff != "off":
        raise ValueError(f"--handoff {grid.handoff} is radixflow's scheduler only: vLLM's model runner cannot run "
                         "a dependent row (docs/vllm.md)")
    for model in grid.models:  # one clear line now if a setting does not fit a model, not one per cell
        sim_setup(grid, model, grid.budgets.get(model, (16, 8192))).scheduler_config()
    if args.scheduler == "vllm":
        arm_runner("vllm")  # one clear line now if vLLM is missing, not one per cell
        if args.arms and "radixflow+frag" in grid.arms:
            raise ValueError("--scheduler vllm: arm radixflow+frag has no vLLM counterpart (the plugin does "
                             "not split fragments)")
        grid.arms = tuple(a for a in grid.arms if a != "radixflow+frag")
    return grid


def plan(args) -> Plan:
    """The grid `experiment` would run and the SchedulerConfig of its first model's QA cells, without running."""
    grid = grid_from_args(args)
    model = grid.models[0]
    cfg = sim_setup(grid, model, grid.budgets.get(model, (16, 8192))).scheduler_config()
    meta = run_meta("experiment", cfg, model=model, models=list(grid.models), arms=list(grid.arms),
                    streams=list(grid.streams), orders=list(grid.orders), questions=grid.questions, gpu=grid.gpu,
                    seed=grid.seed, branch_gap=grid.branch_gap, scheduler=grid.scheduler, calibrate=grid.calibrate)
    return Plan(meta, cfg, extra={"grid": grid})


def run(args) -> int:
    grid = plan(args).extra["grid"]
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
