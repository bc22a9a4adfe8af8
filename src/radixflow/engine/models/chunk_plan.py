"""Flat chunk layout of a batch's multi-token rows, for the chunked linear scans (GDN and SSD).

Each row is cut into segments at its state_out points and every segment is zero-padded to a
multiple of `chunk`: zero padding leaves a gated-delta or SSD state untouched, so the state after
a segment's last chunk is exactly the state after that many tokens. The chunks of all rows are
stacked step-major with the rows sorted by chunk count (longest first), so at scan step s the
active rows are the first n_s local rows and their chunks a contiguous range: every per-step
access in the sequential scan is a view, never a gather.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ChunkPlan:
    rows: list[int]                 # batch row index of each local row, in scan order
    chunk: int
    gather: torch.Tensor            # [M * chunk] packed token index, or N for a padding slot
    token_index: torch.Tensor       # [Np] packed indices of these rows' tokens
    flat_index: torch.Tensor        # [Np] where each of those tokens sits in the [M * chunk] layout
    steps: list[tuple[int, int]]    # per scan step: (first chunk id, number of active local rows)
    captures: dict[int, tuple[torch.Tensor, torch.Tensor]]  # step -> (local rows, slots) saved after it

    def to_chunks(self, x: torch.Tensor) -> torch.Tensor:
        """Packed [N, H, ...] -> [M, H, chunk, ...]; padding reads a zero row appended at index N."""
        ext = torch.cat((x, x.new_zeros((1, *x.shape[1:]))))
        y = ext[self.gather].view(-1, self.chunk, *x.shape[1:])
        return y.transpose(1, 2).contiguous()


def row_chunks(offset: int, n: int, cuts: list[tuple[int, int]], chunk: int
               ) -> tuple[list[list[int]], list[tuple[int, int]]]:
    """Chunks of one row (packed token index per slot, -1 = padding) and its (step, slot) captures."""
    slots_at: dict[int, list[int]] = {}
    for k, slot in cuts:
        slots_at.setdefault(k, []).append(slot)
    chunks: list[list[int]] = []
    captures: list[tuple[int, int]] = []
    prev = 0
    for cut in sorted(set(slots_at) | {n}):
        toks = list(range(offset + prev, offset + cut))
        toks += [-1] * (-len(toks) % chunk)
        chunks.extend(toks[i:i + chunk] for i in range(0, len(toks), chunk))
        captures.extend((len(chunks) - 1, slot) for slot in slots_at.get(cut, []))
        prev = cut
    return chunks, captures


def build_chunk_plan(rows: list[tuple[int, int, int, list[tuple[int, int]]]], chunk: int, num_tokens: int,
                     device: torch.device) -> ChunkPlan:
    """rows: (batch row index, packed offset, length, state_out) of each multi-token row."""
    per_row = [row_chunks(off, n, cuts, chunk) for _, off, n, cuts in rows]
    order = sorted(range(len(rows)), key=lambda r: -len(per_row[r][0]))
    gather: list[int] = []
    token_index: list[int] = []
    flat_index: list[int] = []
    steps: list[tuple[int, int]] = []
    for s in range(len(per_row[order[0]][0]) if rows else 0):
        active = [r for r in order if len(per_row[r][0]) > s]  # a prefix of `order`
        steps.append((len(gather) // chunk, len(active)))
        for r in active:
            for tok in per_row[r][0][s]:
                if tok >= 0:
                    token_index.append(tok)
                    flat_index.append(len(gather))
                gather.append(tok if tok >= 0 else num_tokens)
    captures: dict[int, list[tuple[int, int]]] = {}
    for local, r in enumerate(order):
        for step, slot in per_row[r][1]:
            captures.setdefault(step, []).append((local, slot))

    def t(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    return ChunkPlan([rows[r][0] for r in order], chunk, t(gather), t(token_index), t(flat_index), steps,
                     {s: (t([p[0] for p in v]), t([p[1] for p in v])) for s, v in captures.items()})
