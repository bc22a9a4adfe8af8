"""The hand-off's host bookkeeping (SPEC §15): the folded plan against separate levels, and issue 25's
trim of a separate level, side by side.

On engine_handoff.py's bench-like round (two ~630-token producers, 10 dependents of 8-45 tokens), the
bookkeeping a forward does on the host for its recurrent scans: each level's rows, decode hand-offs,
the scan plan and the plan's row index for each recurrent layer. Two comparisons, interleaved repeats,
medians and the ratio printed:

- `fold`: the engine as it runs (engine/models/batch.py `FOLD = True`: the dependents folded into
  their producers' plan, one level: `_fold_schedule`'s order, split calls, fold copies) against
  `FOLD = False` (the same rows in level 0 and a separate level 1, two plans). This is what the
  folded hand-off's host bookkeeping costs now that the bench round has no separate level;
- `trim` (with `FOLD = False`, where a separate level still runs): level 1's bookkeeping before issue
  25's trim (the chunk-shape pass over every candidate chunk even when the engine fixed the chunk, the
  row index built per layer) against `Level.scan_plan` and `ChunkPlan.row_index` as they are now. Same
  plans either way (checked).
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
from radixflow.engine.models import batch as batch_mod  # noqa: E402
from radixflow.engine.models.batch import BatchContext  # noqa: E402
from radixflow.engine.models.chunk_plan import chunk_candidates, plan_shape  # noqa: E402
from radixflow.engine.tiny import ensure_tiny_model  # noqa: E402


def _median_pair(f, g, repeat: int) -> tuple[float, float]:
    a, b = [], []
    for _ in range(repeat):
        for fn, ts in ((f, a), (g, b)):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return statistics.median(a), statistics.median(b)


def compare(name: str, repeat: int) -> None:
    cpu = torch.device("cpu")
    model = load_model(ensure_tiny_model(name), cpu).model
    costs = engine_scan_costs(model, 16)
    layers = len(model.cache_layout().states)
    hand, _, _ = eh._bench_round(256, True)

    def plans(first: int, before: bool = False) -> list:
        """Levels first.. of the round (with the module's FOLD): their bookkeeping, as now or before the trim."""
        ctx = BatchContext(hand, eh.BLOCK, cpu, None, costs)
        out = []
        for lv in ctx.levels[first:]:
            _ = lv.decode_rows, lv.decode_hands
            if before:
                shapes = {c: plan_shape(lv._plan_rows, c, ctx.hands) for c in chunk_candidates(64)}
                out.append(lv.chunk_plan(costs.choose(shapes)))
                for _ in range(layers):
                    torch.tensor(out[-1].rows, dtype=torch.long)
            else:
                out.append(lv.scan_plan(64))
                for _ in range(layers):
                    _ = out[-1].row_index
        return out

    def folded() -> list:
        batch_mod.FOLD = True
        return plans(0)

    def separate() -> list:
        batch_mod.FOLD = False
        return plans(0)

    fold = folded()
    sep = separate()
    assert len(fold) == 1 and len(sep) == 2, (len(fold), len(sep))  # the round's dependents all fold
    mf, ms = _median_pair(folded, separate, repeat)
    print(f"{name:16s} fold: host bookkeeping of the round's plans folded {mf * 1e3:.3f} ms (1 level, "
          f"{fold[0].fold_calls} fold calls, {len(fold[0].folds)} fold copies, {len(fold[0].steps)} scan calls), "
          f"separate levels {ms * 1e3:.3f} ms ({len(sep)} levels, {sum(len(p.steps) for p in sep)} scan calls); "
          f"ratio {mf / ms:.2f}", flush=True)

    batch_mod.FOLD = False  # level 1 exists only without folding
    try:
        same = [(p.chunk, p.rows, p.steps) for p in plans(1, True)] == [(p.chunk, p.rows, p.steps) for p in plans(1)]
        ma, mb = _median_pair(lambda: plans(1, True), lambda: plans(1), repeat)
    finally:
        batch_mod.FOLD = True
    print(f"{name:16s} trim (FOLD off): level-1 host bookkeeping before {ma * 1e3:.3f} ms, after {mb * 1e3:.3f} ms, "
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
