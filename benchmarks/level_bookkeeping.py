"""An extra level's host bookkeeping (SPEC §15), before and after issue 25's trim, side by side.

On engine_handoff.py's bench-like round (two ~630-token producers, 10 dependents of 8-45 tokens), the
level-1 bookkeeping the forward does on the host: its rows, decode hand-offs, the scan plan and the
plan's row index for each recurrent layer. `before`: the chunk-shape pass over every candidate chunk
(even when the engine fixed the chunk) and the row index built per layer, as before the trim;
`after`: `Level.scan_plan` and `ChunkPlan.row_index` as they are now. Same plans either way (checked).
Interleaved repeats, medians, the ratio printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import engine_handoff as eh  # noqa: E402
from radixflow.engine.calibration import engine_scan_costs  # noqa: E402
from radixflow.engine.loader import load_model  # noqa: E402
from radixflow.engine.models.batch import BatchContext  # noqa: E402
from radixflow.engine.models.chunk_plan import chunk_candidates, plan_shape  # noqa: E402
from radixflow.engine.tiny import ensure_tiny_model  # noqa: E402


def compare(name: str, repeat: int) -> None:
    cpu = torch.device("cpu")
    model = load_model(ensure_tiny_model(name), cpu).model
    costs = engine_scan_costs(model, 16)
    layers = len(model.cache_layout().states)
    hand, _, _ = eh._bench_round(256, True)

    def before() -> list:
        ctx = BatchContext(hand, eh.BLOCK, cpu, None, costs)
        plans = []
        for lv in ctx.levels[1:]:
            _ = lv.decode_rows, lv.decode_hands
            shapes = {c: plan_shape(lv._plan_rows, c, ctx.hands) for c in chunk_candidates(64)}
            plans.append(lv.chunk_plan(costs.choose(shapes)))
            for _ in range(layers):
                torch.tensor(plans[-1].rows, dtype=torch.long)
        return plans

    def after() -> list:
        ctx = BatchContext(hand, eh.BLOCK, cpu, None, costs)
        plans = []
        for lv in ctx.levels[1:]:
            _ = lv.decode_rows, lv.decode_hands
            plans.append(lv.scan_plan(64))
            for _ in range(layers):
                _ = plans[-1].row_index
        return plans

    same = [(p.chunk, p.rows, p.steps) for p in before()] == [(p.chunk, p.rows, p.steps) for p in after()]
    a, b = [], []
    for _ in range(repeat):
        for f, ts in ((before, a), (after, b)):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"{name:16s} level-1 host bookkeeping before {ma * 1e3:.3f} ms, after {mb * 1e3:.3f} ms, "
          f"ratio {mb / ma:.2f} ({layers} recurrent layers; same plans: {same})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=300)
    args = ap.parse_args()
    torch.set_num_threads(1)
    for name in eh.HYBRIDS:
        compare(name, args.repeat)


if __name__ == "__main__":
    main()
