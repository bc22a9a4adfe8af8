"""One batch that exercises every kind of dependent row (SPEC §15), and its cold references.

`handoff_batch(model)` runs a set-up call (a snapshot at 40 for a resuming producer, a decode row's
state at 89), then ONE call whose rows are:

  0  unrelated row from 0 (level 0)                    6  producer resuming at 40 from a snapshot
  1  producer [0, 150)                                 7  after 6 at 41: d - a = 1 < K - 1
  2  after 1 at 37: inside a page and a scan chunk,   8  after 7 at 42: level 2, its conv window and
     with its own state_out capture                      partial page reach back through row 7 into row 6's
  3  after 1 at 150: the producer's end                9  decode row at 89 (a 1-token producer)
  4  after 1 at 64: a 1-token dependent on a page     10  after 9 at 90
     boundary                                         11  after 1 at 37, beside row 2: two dependents
  5  after 2 at 50: level 2                                 at one depth (sibling candidates)

and returns every row's logits beside the full prompt each row continues (what a cold run computes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixflow.engine.models import RowInput

BLOCK = 16
# row -> what the case is, for failure messages
CASES = {0: "unrelated level-0 row", 1: "producer", 2: "dependent inside a page and a chunk",
         3: "dependent at the producer's end", 4: "1-token dependent at a page boundary",
         5: "level-2 dependent", 6: "producer resuming from a snapshot", 7: "dependent with d - a < K - 1",
         8: "level-2 dependent with d - a < K - 1", 9: "decode producer", 10: "dependent of a decode row",
         11: "second dependent at row 2's depth"}
DEPENDENTS = (2, 3, 4, 5, 7, 8, 10, 11)
CAPTURE_SLOT, CAPTURE_AT = 4, 10   # row 2 captures its state after 10 of its tokens (position 47)
PRODUCER_SLOT = 5                  # row 1 captures at 37, the depth it hands to rows 2 and 11 (a branch point)


def ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def pages(first: int, n_tokens: int, start_index: int = 0) -> list[int]:
    """Pages [first, ...) for page indices start_index .. ceil(n_tokens / BLOCK) - 1."""
    return list(range(first, first + -(-n_tokens // BLOCK) - start_index))


@dataclass
class HandoffRun:
    rows: list[RowInput]
    prompts: dict[int, list[int]]      # row -> the full token sequence the row ends
    logits: dict[int, torch.Tensor]    # row -> logits at the row's positions


def setup_rows(hybrid: bool) -> tuple[list[RowInput], dict[str, list[int]]]:
    x, x2, y = ids(150, 1), ids(70, 2), ids(90, 3)
    rows = [RowInput(x2[:40], 0, pages(30, 70), None, [(40, 1)] if hybrid else [], []),
            RowInput(y[:89], 0, pages(60, 90), None, [(89, 2)] if hybrid else [], [])]
    return rows, {"x": x, "x2": x2, "y": y}


def handoff_rows(seq: dict[str, list[int]], hybrid: bool, after: bool = True) -> tuple[list[RowInput],
                                                                                        dict[int, list[int]]]:
    """The hand-off call's rows and the full prompt of each; after=False drops every `after`."""
    x, x2, y = seq["x"], seq["x2"], seq["y"]
    u, t2, t3, t5, t7, t8, t10 = ids(70, 4), ids(20, 5), ids(9, 6), ids(30, 7), ids(12, 8), ids(5, 9), ids(6, 10)
    t11 = ids(14, 11)
    xp, x2p, yp = pages(0, 150), pages(30, 70), pages(60, 90)
    prompts = {0: u, 1: x, 2: x[:37] + t2, 3: x + t3, 4: x[:64] + [11], 5: x[:37] + t2[:13] + t5,
               6: x2, 7: x2[:41] + t7, 8: x2[:41] + t7[:1] + t8, 9: y, 10: y[:90] + t10, 11: x[:37] + t11}
    own = iter(range(100, 128))                       # private pages of the dependents
    tables: dict[int, list[int]] = {0: pages(80, 70), 1: xp, 6: x2p, 9: yp}

    def dep_table(producer: int, d: int, end: int) -> list[int]:
        q = d // BLOCK
        return tables[producer][:q] + [next(own) for _ in range(-(-end // BLOCK) - q)]

    spec = {2: (1, 37), 3: (1, 150), 4: (1, 64), 5: (2, 50), 7: (6, 41), 8: (7, 42), 10: (9, 90), 11: (1, 37)}
    for i in sorted(spec):
        p, d = spec[i]
        tables[i] = dep_table(p, d, len(prompts[i]))
    starts = {0: 0, 1: 0, 6: 40, 9: 89, **{i: d for i, (_, d) in spec.items()}}
    state_in = {6: 1, 9: 2} if hybrid else {}
    rows = []
    for i in range(len(prompts)):
        toks = prompts[i][starts[i]:]
        outs = {0: [(70, 3)], 1: [(37, PRODUCER_SLOT)], 2: [(CAPTURE_AT, CAPTURE_SLOT)]}.get(i, []) if hybrid else []
        rows.append(RowInput(toks, starts[i], tables[i], state_in.get(i), outs, list(range(len(toks))),
                             spec[i][0] if after and i in spec else None))
    return rows, prompts


def run_handoff(model, clock=None) -> tuple[HandoffRun, object]:
    """Set-up call, then the hand-off call; returns the run and the cache (for resuming captures)."""
    hybrid = model.is_hybrid
    cache = model.allocate_cache(160, BLOCK, 8)
    first, seq = setup_rows(hybrid)
    model(first, cache)
    rows, prompts = handoff_rows(seq, hybrid)
    out = model(rows, cache, clock)
    logits, at = {}, 0
    for i, r in enumerate(rows):
        logits[i] = out[at:at + len(r.token_ids)]
        at += len(r.token_ids)
    return HandoffRun(rows, prompts, logits), cache


def cold_logits(model, prompt: list[int]) -> torch.Tensor:
    """All-position logits of the whole prompt in one row from position 0."""
    cache = model.allocate_cache(-(-len(prompt) // BLOCK), BLOCK, 1)
    return model([RowInput(prompt, 0, pages(0, len(prompt)), None, [], list(range(len(prompt))))], cache)
