"""A results directory: one JSON file per cell, named so a cell's file can be found without reading it.

Cells are the unit of work and of resumption. Kinds:
- `qa`: one model x arm x stream x order of the multi-candidate workload (`simulate`'s JSON schema,
  one arm, plus `rows_hist` and `latencies` on the arm for Figure 4);
- `figure1`: the Figure 1 instance under one arm, plus `diagram` (the rows of every round);
- `multiturn`: `radixflow trace multi-turn` output for one model (`{"turns": [...]}`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

CELL_DIR = "cells"
MANIFEST = "manifest.json"
CALIBRATION = "calibration.json"


class Cell(NamedTuple):
    kind: str  # qa | figure1 | multiturn
    model: str
    arm: str = ""
    stream: str = ""
    order: str = ""

    @property
    def name(self) -> str:
        return "__".join(p for p in self if p)

    def path(self, root: str | Path) -> Path:
        return Path(root) / CELL_DIR / f"{self.name}.json"

    @classmethod
    def from_name(cls, name: str) -> Cell:
        parts = name.split("__")
        if not parts or parts[0] not in ("qa", "figure1", "multiturn") or len(parts) > 5:
            raise ValueError(f"not a cell name: {name!r}")
        return cls(*parts)


def _clean(x):
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def write_atomic(path: Path, payload: dict) -> None:
    """Writes JSON through a temporary file, so an interrupted run never leaves half a cell."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(_clean(payload), indent=1) + "\n")
    tmp.replace(path)


def read_json(path: Path) -> dict:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict):
        raise ValueError("top level is not a JSON object")
    return data


def is_done(path: Path, fingerprint: dict) -> bool:
    """A finished cell: readable, and made with the same settings (else it is run again)."""
    try:
        data = read_json(path)
    except (OSError, ValueError):
        return False
    return data.get("meta", {}).get("fingerprint") == fingerprint


@dataclass
class Results:
    """Everything the report reads from a results directory, with the problems it met."""

    root: Path
    cells: dict[Cell, dict] = field(default_factory=dict)
    bench: list[tuple[str, dict]] = field(default_factory=list)  # (file name, payload)
    problems: list[str] = field(default_factory=list)
    manifest: dict = field(default_factory=dict)
    calibration: dict = field(default_factory=dict)

    def of_kind(self, kind: str) -> dict[Cell, dict]:
        return {c: d for c, d in self.cells.items() if c.kind == kind}


def _check_cell(cell: Cell, data: dict) -> None:
    if cell.kind == "multiturn":
        if not isinstance(data.get("turns"), list):
            raise ValueError("no 'turns' list")
        return
    arms = data.get("arms")
    if not isinstance(arms, list) or len(arms) != 1 or not isinstance(arms[0], dict):
        raise ValueError("expected 'arms' with exactly one arm")
    for key in ("rounds", "host_time", "fragments"):
        if not isinstance(arms[0].get(key), (int, float)):
            raise ValueError(f"arm has no numeric {key!r}")


def load_results(root: str | Path) -> Results:
    """Reads every cell (and any bench JSON) under `root`; unreadable or missing cells become problems."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"results directory {root} does not exist: run `radixflow experiment` first")
    res = Results(root)
    for name, attr in ((MANIFEST, "manifest"), (CALIBRATION, "calibration")):
        p = root / name
        if p.exists():
            try:
                setattr(res, attr, read_json(p))
            except (OSError, ValueError) as e:
                res.problems.append(f"{name} is corrupt ({e}); ignored")
    for p in sorted((root / CELL_DIR).glob("*.json")) if (root / CELL_DIR).is_dir() else []:
        try:
            cell = Cell.from_name(p.stem)
            data = read_json(p)
            _check_cell(cell, data)
        except (OSError, ValueError, TypeError) as e:
            res.problems.append(f"cell {p.stem}: corrupt ({e}); left out")
            continue
        res.cells[cell] = data
    for name in res.manifest.get("cells", []):
        try:
            cell = Cell.from_name(name)
        except ValueError:
            continue
        if cell not in res.cells and not any(name in msg for msg in res.problems):
            res.problems.append(f"cell {name}: missing; left out")
    for p in sorted(root.rglob("*.json")):
        if CELL_DIR in p.relative_to(root).parts or p.parent == root and p.name in (MANIFEST, CALIBRATION):
            continue
        try:
            data = read_json(p)
        except (OSError, ValueError) as e:
            res.problems.append(f"{p.relative_to(root)}: unreadable ({e}); left out")
            continue
        if data.get("meta", {}).get("command") == "bench" and isinstance(data.get("arms"), list):
            res.bench.append((str(p.relative_to(root)), data))
    return res
