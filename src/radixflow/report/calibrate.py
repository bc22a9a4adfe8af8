"""The paper's budget calibration: pick S and T once for the native arm, then freeze them for all arms.

As the paper did with vLLM's auto-tuner, each model runs `radix` on 64 held-out questions (a seed the
experiment never uses) over a small grid of (S, T). Throughput is measured with the questions sent as
one burst (at the arrival rate every pair merely keeps up, which says nothing about capacity),
latency at the model's arrival rate. The pair with the highest throughput wins; pairs within 1 % of
it are ordered by that latency, then by smaller budgets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from radixflow.core.policies import get_arm
from radixflow.report import paper
from radixflow.report.cells import CALIBRATION, read_json, write_atomic
from radixflow.sim.runner import run_arm
from radixflow.workloads.qa import paper_questions

S_GRID = (8, 16, 32, 64, 128)
T_GRID = (2048, 4096, 8192, 16384)
HELD_OUT_SEED_OFFSET = 1000
STREAM, ORDER = "mixed", "forward"


class GridTools(NamedTuple):
    """What calibration borrows from the experiment grid; passed in, since the grid module calls us."""

    sim_setup: Callable  # (grid, model, (S, T)) -> SimSetup
    qa_branches: Callable  # (grid, model, stream, order, questions=, seed=) -> branches
    pool_map: Callable  # (fn, tasks, jobs, on_done) -> None


def _run(grid, tools: GridTools, model: str, budgets: tuple[int, int], rate: float | None):
    qa_branches, sim_setup = tools.qa_branches, tools.sim_setup
    seed = grid.seed + HELD_OUT_SEED_OFFSET
    qs = paper_questions(seed, paper.CALIBRATION_QUESTIONS)
    g = replace(grid, rate=rate)
    branches = qa_branches(g, model, STREAM, ORDER, questions=qs, seed=seed)
    m, runs = run_arm(sim_setup(g, model, budgets), get_arm("radix"), [branches])
    return m, runs[0].makespan - min(b.arrival for b in branches)


def _trial(task) -> dict:
    """Capacity with the 64 questions as one burst; latency at the model's arrival rate."""
    grid, tools, model, s, t = task
    burst, span = _run(grid, tools, model, (s, t), 0.0)
    paced, _ = _run(grid, tools, model, (s, t), None)
    return {
        "model": model,
        "max_num_seqs": s,
        "max_num_batched_tokens": t,
        "rounds": burst.rounds,
        "throughput": burst.requests / span if span > 0 else 0.0,
        "latency_mean": paced.latency_mean,
    }


def choose(trials: list[dict]) -> dict:
    """Highest throughput; within 1 % of it, lowest mean latency, then smaller S and T."""
    best = max(t["throughput"] for t in trials)
    near = [t for t in trials if t["throughput"] >= 0.99 * best]
    return min(near, key=lambda t: (t["latency_mean"], t["max_num_seqs"], t["max_num_batched_tokens"]))


def calibrate_all(grid, root: Path, jobs: int, tools: GridTools) -> dict[str, tuple[int, int]]:
    """Budgets per model; reuses `calibration.json` for the models it already has."""
    path = Path(root) / CALIBRATION
    saved = read_json(path) if path.exists() else {}
    todo = [m for m in grid.models if m not in saved]
    tasks = [(grid, tools, m, s, t) for m in todo for s in S_GRID for t in T_GRID]
    trials: list[dict] = []
    if tasks:
        tools.pool_map(_trial, tasks, jobs, trials.append)
    for m in todo:
        mine = sorted(
            (t for t in trials if t["model"] == m),
            key=lambda t: (t["max_num_seqs"], t["max_num_batched_tokens"]),
        )
        pick = choose(mine)
        saved[m] = {
            "max_num_seqs": pick["max_num_seqs"],
            "max_num_batched_tokens": pick["max_num_batched_tokens"],
            "paper": list(paper.BUDGETS.get(m, ())),
            "questions": paper.CALIBRATION_QUESTIONS,
            "stream": STREAM,
            "order": ORDER,
            "search": mine,
        }
    write_atomic(path, saved)
    return {m: (saved[m]["max_num_seqs"], saved[m]["max_num_batched_tokens"]) for m in grid.models}
