"""Warm-up probe results kept on disk, so an engine on the same model and machine starts without probing.

One JSON file per probe and key under `$RADIXFLOW_CACHE/probes/` (next to the model cache): `scan-<h>.json`
holds the scan probe's `ScanCosts` (before the engine fixes its chunk), `rounds-<h>.json` the round
probe's observations (`HandoffCalibration.probe_*`, the initial round lengths, the probe's seconds).
`<h>` is a hash of the key, which the file also holds in full and which must match field by field:

- the model's shapes: a hash of its `config.json` (the weights' values do not change a timing),
- the machine: the CPU's model name and torch's CPU capability (AVX2, AVX-512, ...), the device, dtype
  and torch's thread count of the thread that probes,
- the software: torch's and radixflow's versions and a hash of the engine's model and probe sources
  (engine/models/*.py, engine/calibration/*.py), the scan-thread policy and whether dependents fold,
- the round probe also: the page size and the scan chunk the engine fixed (the forwards it times).

Invalidation: a file is used only when its whole key matches; anything else (another CPU, thread count,
torch, an edit to the model code) misses, the probe runs again and writes a file of its own key. The
timings in a file are those of the load the machine had when it was written (a probe during which other
processes kept the cores busy is not written: probes.py `Disturbance`); delete the directory (or serve with
`--probe-cache off`) to measure again. A file that cannot be read or parsed is a miss.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from functools import cache
from pathlib import Path

import torch

from radixflow.engine.models.chunk_plan import ScanCosts

FORMAT = 1  # bump when what a file holds changes meaning


def default_dir() -> Path:
    """`$RADIXFLOW_CACHE/probes` (the model cache is `$RADIXFLOW_CACHE/models`)."""
    return Path(os.environ.get("RADIXFLOW_CACHE", "~/.cache/radixflow")).expanduser() / "probes"


@cache
def _version() -> str | None:
    """radixflow's installed version (from its metadata: `radixflow/__init__` imports the engine)."""
    from importlib import metadata

    try:
        return metadata.version("radixflow")
    except metadata.PackageNotFoundError:
        return None


@cache
def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@cache
def code_hash() -> str:
    """A hash of the sources whose edits change what the probes time."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for f in sorted([*(root / "models").glob("*.py"), *(root / "calibration").glob("*.py")]):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def config_hash(model_dir: str | Path) -> str:
    """A hash of the model's shapes: its `config.json` (parsed, so formatting does not count)."""
    raw = json.loads((Path(model_dir) / "config.json").read_text())
    return hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()[:16]


def machine_key(model, model_dir: str | Path) -> dict:
    """The key fields every probe shares (read on the thread that probes: its torch thread count)."""
    from radixflow.engine.models import batch as batch_mod
    from radixflow.engine.models import threads as threads_mod

    p = next(model.parameters())
    return {"format": FORMAT, "model": config_hash(model_dir), "cpu": _cpu_name(),
            "capability": torch.backends.cpu.get_cpu_capability(), "device": str(p.device), "dtype": str(p.dtype),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "radixflow": _version(),
            "code": code_hash(), "scan_threads": threads_mod.SCAN_THREADS.fixed, "fold": bool(batch_mod.FOLD)}


class ProbeStore:
    """Reads and writes probe results under `directory` (see the module docstring)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory).expanduser()

    def path(self, kind: str, key: dict) -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
        return self.directory / f"{kind}-{digest}.json"

    def load(self, kind: str, key: dict) -> dict | None:
        """The data stored for `kind` under exactly `key`, or None."""
        f = self.path(kind, key)
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(doc, dict) or doc.get("key") != json.loads(json.dumps(key)):
            return None
        return doc.get("data")

    def save(self, kind: str, key: dict, data: dict) -> Path | None:
        """Writes atomically (a temporary sibling renamed into place); None if the directory is not writable."""
        f = self.path(kind, key)
        try:
            f.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{f.name}.", dir=f.parent)
            with os.fdopen(fd, "w") as out:
                json.dump({"key": key, "data": data}, out, indent=1)
            os.replace(tmp, f)
        except OSError:
            return None
        return f


def scan_to_json(costs: ScanCosts | None) -> dict:
    if costs is None:
        return {"none": True}
    return {"per_slot": {str(k): v for k, v in costs.per_slot.items()},
            "per_step": {str(k): v for k, v in costs.per_step.items()}}


def scan_from_json(data: dict) -> ScanCosts | None:
    if data.get("none"):
        return None
    return ScanCosts({int(k): float(v) for k, v in data["per_slot"].items()},
                     {int(k): float(v) for k, v in data["per_step"].items()})


ROUND_FIELDS = ("probe_rounds", "probe_levels", "probe_base", "probe_folds")


def rounds_to_json(cal) -> dict:
    return {**{f: [list(o) for o in getattr(cal, f)] for f in ROUND_FIELDS},
            "lengths": list(cal.lengths), "probe_seconds": cal.probe_seconds}


def rounds_into(cal, data: dict) -> None:
    """The stored round probe's observations into `cal` (its fits remade on next use)."""
    for f in ROUND_FIELDS:
        setattr(cal, f, [tuple(o) for o in data[f]])
    cal.lengths.extend(float(x) for x in data["lengths"])
    cal.probe_seconds = float(data["probe_seconds"])
    cal._round_fit = cal._level_fit = cal._base_fit = cal._fold_fit = None
