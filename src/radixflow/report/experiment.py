"""Paper-scale experiments on the simulator: a grid of cells run over the CPU cores, resumable.

`paper` is SPEC §11's setup (six models x six arms x three streams x two orders, 1,551 questions per
stream, 5 req/s for Qwen and 1.5 req/s for Nemotron); `quick` is a small grid that still feeds every
table and figure of the report.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import importlib.util
import io
import multiprocessing
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from radixflow.config import SchedulerConfig, software_versions
from radixflow.core.branch import group_requests
from radixflow.core.policies import ARMS, get_arm
from radixflow.integrations.vllm.sim_backend import arm_runner
from radixflow.report import paper
from radixflow.report.calibrate import GridTools, calibrate_all
from radixflow.report.cells import MANIFEST, Cell, is_done, read_json, write_atomic
from radixflow.sim.cost_model import get_gpu
from radixflow.sim.runner import SimSetup, run_arm
from radixflow.spec import get_spec
from radixflow.workloads.figure1 import FIGURE1_BUDGETS, figure1_records
from radixflow.workloads.qa import ORDERS, STREAMS, paper_questions, stream_records
from radixflow.workloads.trace import branch_from_record

DIAGRAM_ARMS = ("radix", "radixflow")  # prefix-stop and state-ready traversal
DIAGRAM_MODEL = "qwen3.5-0.8b"  # any hybrid model: the instance is about tokens, not time
MULTITURN_MODELS = ("qwen3-8b", "qwen3.5-0.8b")  # one full-attention, one hybrid
TRACE_MODULE = "radixflow.commands.trace"


# The simulator's source, hashed into every cell's fingerprint: scheduler, index, cost model, the
# workloads the cells build. A cell made by other code is rerun; an unrelated edit elsewhere is not.
SIM_SOURCES = (
    "cache",
    "core",
    "sim",
    "spec",
    "config.py",
    "workloads/qa.py",
    "workloads/figure1.py",
    "workloads/trace.py",
)


@functools.cache
def code_version() -> str:
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha1()
    for name in SIM_SOURCES:
        for p in sorted((root / name).rglob("*.py")) if (root / name).is_dir() else [root / name]:
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:12]


@dataclass
class Grid:
    models: tuple[str, ...] = paper.MODELS
    arms: tuple[str, ...] = tuple(ARMS)
    streams: tuple[str, ...] = STREAMS
    orders: tuple[str, ...] = ORDERS
    questions: int | None = None  # per stream; None = all 1,551
    seed: int = 0
    gpu: str = "a800"
    rate: float | None = None  # None = the paper's rate per model
    calibrate: bool = False
    snapshot_mode: str = "vllm-align"  # SchedulerConfig.snapshot_mode (hybrid models); vLLM's own by default
    checkpoints: str = "boundary"  # SchedulerConfig.checkpoints (hybrid models): boundary | branch (SPEC §14)
    checkpoint_wait: str = "grid"  # SchedulerConfig.checkpoint_wait (branch checkpoints)
    handoff: str = "off"  # SchedulerConfig.handoff (SPEC §15), QA cells
    handoff_max_levels: int = 2  # SchedulerConfig.handoff_max_levels
    branch_gap: float = 0.0005  # mean s between a question's branches: the paper sends each on its own (§6)
    scheduler: str = "radixflow"  # radixflow | vllm (vLLM 0.33's Scheduler, integrations/vllm/sim_backend.py)
    # vllm-align: vLLM's --prefix-match-unit for every model (0 = the block B, vLLM 0.33's default: no
    # partial hits; one rule for every model, docs/simulator.md "Partial hits"); none outside vllm-align
    prefix_match_unit: int = 0
    # vllm-align: whose rules (SchedulerConfig.vllm_version, .mamba_cache_mode) for every model; the
    # defaults are vLLM 0.33's, the paper ran 0.29 (docs/simulator.md "What vLLM 0.29 did")
    vllm_version: str = "0.33"
    mamba_cache_mode: str = "align"
    budgets: dict[str, tuple[int, int]] = field(default_factory=lambda: dict(paper.BUDGETS))

    def unit_of(self, model: str) -> int:
        return self.prefix_match_unit if self.snapshot_mode == "vllm-align" else 0

    def rate_of(self, model: str) -> float:
        return self.rate if self.rate is not None else paper.RATES.get(model, 5.0)

    def cells(self) -> list[Cell]:
        qa = [Cell("qa", m, a, s, o) for m in self.models for a in self.arms for s in self.streams for o in self.orders]
        extra = [Cell("figure1", DIAGRAM_MODEL, a) for a in DIAGRAM_ARMS]
        if importlib.util.find_spec(TRACE_MODULE) is not None:
            extra += [Cell("multiturn", m) for m in MULTITURN_MODELS]
        return extra + qa

    def fingerprint(self, cell: Cell) -> dict:
        fp = {
            "kind": cell.kind,
            "seed": self.seed,
            "gpu": self.gpu,
            "code": code_version(),
            "snapshot_mode": self.snapshot_mode,
        }
        if self.checkpoints != "boundary":  # absent from older cells: they stay valid
            fp.update(checkpoints=self.checkpoints, checkpoint_wait=self.checkpoint_wait)
        if self.handoff != "off":  # likewise
            fp.update(handoff=self.handoff, handoff_max_levels=self.handoff_max_levels)
        if cell.kind == "qa":
            fp.update(branch_gap=self.branch_gap, scheduler=self.scheduler)
            if self.unit_of(cell.model):  # absent at 0, so cells run before the field keep their fingerprint
                fp.update(prefix_match_unit=self.unit_of(cell.model))
            if (self.vllm_version, self.mamba_cache_mode) != ("0.33", "align"):  # absent at the defaults, likewise
                fp.update(vllm_version=self.vllm_version, mamba_cache_mode=self.mamba_cache_mode)
        if cell.kind == "qa":
            fp.update(
                questions=self.questions,
                rate=self.rate_of(cell.model),
                budgets=list(self.budgets.get(cell.model, (16, 8192))),
            )
        return fp


PRESETS = {
    "paper": Grid(),
    "quick": Grid(questions=24),
}


def preset(name: str) -> Grid:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    return replace(PRESETS[name], budgets=dict(PRESETS[name].budgets))


# ----------------------------------------------------------------------------- one cell
def sim_setup(grid: Grid, model: str, budgets: tuple[int, int], hook=None) -> SimSetup:
    spec = get_spec(model)
    cfg = SchedulerConfig(max_num_seqs=budgets[0], max_num_batched_tokens=budgets[1], snapshot_mode=grid.snapshot_mode,
                          prefix_match_unit=grid.unit_of(model), checkpoints=grid.checkpoints,
                          vllm_version=grid.vllm_version, mamba_cache_mode=grid.mamba_cache_mode,
                          checkpoint_wait=grid.checkpoint_wait, handoff=grid.handoff,
                          handoff_max_levels=grid.handoff_max_levels)
    cfg.validate()
    return SimSetup(spec, get_gpu(grid.gpu), cfg, round_hook=hook)


def qa_branches(grid: Grid, model: str, stream: str, order: str, questions=None, seed=None):
    seed = grid.seed if seed is None else seed
    qs = questions if questions is not None else paper_questions(seed, grid.questions)
    recs = stream_records(qs, stream, order, grid.rate_of(model), seed, prefix=f"{stream}-{order}:",
                          branch_gap=grid.branch_gap)
    vocab = get_spec(model).vocab_size
    return [branch_from_record(r, f"{stream}/{order}", vocab) for r in recs]


def _qa_cell(grid: Grid, cell: Cell) -> dict:
    budgets = grid.budgets.get(cell.model, (16, 8192))
    setup = sim_setup(grid, cell.model, budgets)
    runner = arm_runner(grid.scheduler)
    m, runs = runner(setup, get_arm(cell.arm), [qa_branches(grid, cell.model, cell.stream, cell.order)])
    run = runs[0]
    hist = [0] * (budgets[0] + 1)
    for r in run.scheduler.rounds:
        hist[r.rows] += 1
    lat = [round(r.latency, 6) for r in group_requests(run.branches) if r.latency is not None]
    arm = {**m.to_dict(), "rows_hist": hist, "latencies": lat}
    return {
        "meta": {
            "kind": "qa",
            "model": cell.model,
            "arm": cell.arm,
            "stream": cell.stream,
            "order": cell.order,
            "rate": grid.rate_of(cell.model),
            "questions": grid.questions,
            "max_num_seqs": budgets[0],
            "max_num_batched_tokens": budgets[1],
            "snapshot_mode": grid.snapshot_mode,
            "checkpoints": grid.checkpoints,
            "checkpoint_wait": grid.checkpoint_wait,
            "handoff": grid.handoff,
            "handoff_max_levels": grid.handoff_max_levels,
            "state_interval": setup.scheduler_config().state_interval,
            "block_size": setup.scheduler_config().block_size,
            "branch_gap": grid.branch_gap,
            "scheduler": grid.scheduler,
            "prefix_match_unit": setup.scheduler_config().prefix_match_unit,
            "vllm_version": grid.vllm_version,
            "mamba_cache_mode": setup.scheduler_config().mamba_cache_mode,
        },
        "arms": [arm],
    }


def _figure1_cell(grid: Grid, cell: Cell) -> dict:
    diagram = []

    def hook(sched, batch):
        diagram.append(
            [
                {
                    "branch": f.branch.request_id,
                    "group": f.branch.namespace,
                    "start": f.start,
                    "tokens": f.num_tokens,
                }
                for f in batch.fragments
            ]
        )

    budgets = (FIGURE1_BUDGETS["max_num_seqs"], FIGURE1_BUDGETS["max_num_batched_tokens"])
    # The toy instance fixes its own boundaries (SPEC §11), whatever mode the grid runs in.
    setup = sim_setup(replace(grid, snapshot_mode="every-boundary", checkpoints="boundary", prefix_match_unit=0,
                              vllm_version="0.33", mamba_cache_mode="align", handoff="off"),
                      cell.model, budgets, hook)
    vocab = setup.spec.vocab_size
    m, _ = run_arm(setup, get_arm(cell.arm), [[branch_from_record(r, "figure1", vocab) for r in figure1_records()]])
    arm = get_arm(cell.arm)
    return {
        "meta": {
            "kind": "figure1",
            "model": cell.model,
            "arm": cell.arm,
            "traversal": arm.traversal.name,
            "max_num_seqs": budgets[0],
            "max_num_batched_tokens": budgets[1],
        },
        "arms": [m.to_dict()],
        "diagram": diagram,
    }


def _multiturn_cell(grid: Grid, cell: Cell) -> dict:
    """Delegates to `radixflow trace multi-turn` (another module owns the multi-turn simulation),
    through the command's own add_arguments/run, without loading the other commands."""
    trace = importlib.import_module(TRACE_MODULE)
    parser = argparse.ArgumentParser()
    trace.add_arguments(parser)
    with tempfile.TemporaryDirectory() as d:  # outside cells/, so a crash leaves no stray cell
        tmp = Path(d) / "trace.json"
        args = parser.parse_args(["multi-turn", "--model", cell.model, "--checkpoints", grid.checkpoints,
                                  "--json", str(tmp)])
        with contextlib.redirect_stdout(io.StringIO()):  # its table would scramble the progress bar
            rc = trace.run(args)
        if rc or not tmp.exists():
            raise RuntimeError(f"radixflow trace multi-turn --model {cell.model} exited with {rc}")
        data = read_json(tmp)
    data.setdefault("meta", {}).update(kind="multiturn", model=cell.model)
    return data


def run_cell(task: tuple[Grid, Cell, str]) -> tuple[str, float, str | None]:
    """Runs one cell and writes its JSON; returns (name, wall seconds, error or None). Never raises."""
    grid, cell, root = task
    path = cell.path(root)
    t0 = time.perf_counter()
    try:
        if cell.kind == "qa":
            data = _qa_cell(grid, cell)
        elif cell.kind == "figure1":
            data = _figure1_cell(grid, cell)
        else:
            data = _multiturn_cell(grid, cell)
        wall = time.perf_counter() - t0
        data["meta"].update(
            command="experiment",
            gpu=grid.gpu,
            seed=grid.seed,
            wall_time=wall,
            versions=software_versions(),
            fingerprint=grid.fingerprint(cell),
        )
        write_atomic(path, data)
        return cell.name, wall, None
    except (Exception, SystemExit) as e:  # a failing cell is reported by name; the others go on
        return cell.name, time.perf_counter() - t0, f"{type(e).__name__}: {e}"


# Paper-preset models in the order they are run: whole models one after another, cheapest first, so
# a run stopped early leaves complete models (the small hybrids evict snapshots most and run longest).
MODEL_ORDER = ("qwen3-8b", "nemotron-nano-9b-v2", "qwen3.5-27b", "qwen3.5-9b", "qwen3.5-4b", "qwen3.5-0.8b")


def _run_order(cell: Cell) -> tuple:
    """Non-QA cells first; then model by model, and within a model the slower streams first."""
    if cell.kind != "qa":
        return (0, 0, 0.0)
    model = MODEL_ORDER.index(cell.model) if cell.model in MODEL_ORDER else len(MODEL_ORDER)
    return (1, model, -{"reuse": 0.5, "mixed": 0.8}.get(cell.stream, 1.0))


def pool_map(fn: Callable, tasks: list, jobs: int, on_done: Callable) -> None:
    if jobs <= 1 or len(tasks) <= 1:
        for t in tasks:
            on_done(fn(t))
        return
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(min(jobs, len(tasks))) as pool:
        for r in pool.imap_unordered(fn, tasks):
            on_done(r)


@dataclass
class RunReport:
    ran: list[tuple[str, float]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    wall: float = 0.0


def run_experiment(grid: Grid, root: str | Path, jobs: int, progress=None) -> RunReport:
    """Runs every unfinished cell of `grid` under `root`; `progress(total)` returns an advance callback."""
    root = Path(root)
    t0 = time.perf_counter()
    if grid.calibrate:
        grid.budgets.update(calibrate_all(grid, root, jobs, GridTools(sim_setup, qa_branches, pool_map)))
    cells = grid.cells()
    write_atomic(
        root / MANIFEST,
        {
            "grid": {**asdict(grid), "budgets": {k: list(v) for k, v in grid.budgets.items()}},
            "cells": [c.name for c in cells],
            "budget_source": "calibrated" if grid.calibrate else "paper",
            "code_version": code_version(),
        },
    )
    out = RunReport()
    todo = []
    for c in cells:
        (out.skipped.append(c.name) if is_done(c.path(root), grid.fingerprint(c)) else todo.append(c))
    todo.sort(key=_run_order)
    advance = progress(len(todo)) if progress else (lambda r: None)

    def done(r):
        name, wall, err = r
        (out.failed.append((name, err)) if err else out.ran.append((name, wall)))
        advance(r)

    pool_map(run_cell, [(grid, c, str(root)) for c in todo], jobs, done)
    out.wall = time.perf_counter() - t0
    return out
