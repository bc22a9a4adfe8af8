"""Every flag more than one command shares, in one place: its type, default and help.

A type here turns the text into its typed value or raises `argparse.ArgumentTypeError`, so argparse
exits 2 with `argument --flag: ...` (one line, see cli.py). `add(p, "--dtype", ...)` adds a shared
flag to a command; `remember_defaults(p)` (the last line of every command's `add_arguments`) lets
`refuse(args, ...)` tell a flag the user set from its default, so that a flag a command (or one of
its workloads) cannot honour is an error naming it, never silently dropped.
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

from radixflow.config import (
    CHECKPOINT_MODES,
    DTYPES,
    HANDOFF_MODES,
    MAMBA_CACHE_MODES,
    SNAPSHOT_MODES,
    VLLM_VERSIONS,
    SchedulerConfig,
    help_of,
)

_DEFAULTS = "flag_defaults"  # the namespace attribute remember_defaults() sets


def _bad(text: str, what: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"{what}, got {text!r}")


# ----------------------------------------------------------------------------- numbers
def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise _bad(text, "not an integer") from None


def _float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise _bad(text, "not a number") from None
    if not math.isfinite(v):
        raise _bad(text, "must be a finite number")
    return v


def positive_int(text: str) -> int:
    v = _int(text)
    if v < 1:
        raise _bad(text, "must be >= 1")
    return v


def non_negative_int(text: str) -> int:
    v = _int(text)
    if v < 0:
        raise _bad(text, "must be >= 0")
    return v


def non_negative_float(text: str) -> float:
    v = _float(text)
    if v < 0:
        raise _bad(text, "must be a finite number >= 0")
    return v


def positive_fraction(text: str) -> float:
    """(0, 1]: a share of memory."""
    v = _float(text)
    if not 0 < v <= 1:
        raise _bad(text, "must be in (0, 1]")
    return v


def unit_interval(text: str) -> float:
    """[0, 1]."""
    v = _float(text)
    if not 0 <= v <= 1:
        raise _bad(text, "must be in [0, 1]")
    return v


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "ki": 2**10, "mi": 2**20, "gi": 2**30}


def byte_size(text: str) -> int:
    """'268435456', '256MiB', '1.5GiB', '512MB' -> bytes (> 0)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a byte size: {text!r} (examples: 268435456, 256MiB, 2GiB)")
    value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0 bytes, got {text!r}")
    return value


# ----------------------------------------------------------------------------- names
def dtype_name(text: str) -> str:
    """One of the engine's dtype names (engine._dtype, LLM(dtype=...)) -> its canonical name."""
    key = text.strip().lower()
    if key not in DTYPES:
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r}; choose from {', '.join(DTYPES)}")
    return DTYPES[key]


def device_name(text: str) -> str:
    """cpu | cuda | cuda:N (torch's device strings the engine runs on)."""
    key = text.strip().lower()
    if not re.fullmatch(r"cpu|cuda(:\d+)?", key):
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; choose from cpu, cuda, cuda:N")
    return key


def checkpoint_wait(text: str) -> str:
    """SchedulerConfig.checkpoint_wait: 'grid' or a positive token count (kept as text)."""
    key = text.strip().lower()
    if key != "grid" and not (key.isdigit() and int(key) > 0):
        raise _bad(text, "must be 'grid' or a positive token count")
    return key


def eviction_list(text: str) -> str:
    """A comma list of eviction policies, each checked (cache/eviction/registry.py); kept as text."""
    from radixflow.cache.eviction import parse_evictions

    try:
        return ",".join(parse_evictions(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def eviction_name(text: str) -> str:
    """One eviction policy (the engine's cache runs one)."""
    if "," in text:
        raise argparse.ArgumentTypeError(f"one eviction policy, got {text!r}")
    return eviction_list(text)


def arm_list(text: str) -> str:
    """'all' or a comma list of the scheduling arms (core/policies.py); kept as text."""
    from radixflow.core.policies import parse_arms

    try:
        parse_arms(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def gpu_name(text: str) -> str:
    from radixflow.sim.cost_model import GPUS

    key = text.strip().lower()
    if key not in GPUS:
        raise argparse.ArgumentTypeError(f"unknown GPU {text!r}; choose from {', '.join(GPUS)}")
    return key


def sim_model(text: str) -> str:
    """A model spec preset or a directory with an HF config.json (the simulator's models)."""
    from radixflow.spec import get_spec

    try:
        get_spec(text)
    except (ValueError, OSError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def engine_model(text: str) -> str:
    """A built-in model's name (tiny, or `random:` at real size) or a model directory (the engine's
    models; the files are read or built later)."""
    from radixflow.engine.random_models import RANDOM_MODELS
    from radixflow.engine.tiny import TINY_MODELS

    if text in TINY_MODELS or text in RANDOM_MODELS or Path(text).expanduser().is_dir():
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is neither a model directory nor a tiny model name "
                                     f"(tiny models: {', '.join(TINY_MODELS)}; random weights at real "
                                     f"size: {', '.join(RANDOM_MODELS)})")


def names_list(allowed):
    """A type: a comma list of names from `allowed` -> a tuple."""
    def names(text: str) -> tuple[str, ...]:
        items = tuple(x.strip().lower() for x in text.split(",") if x.strip())
        bad = [x for x in items if x not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(bad) or 'empty list'}; "
                                             f"choose from {', '.join(allowed)}")
        return items

    return names


# ----------------------------------------------------------------------------- the shared flags
def _sched(name: str, **kw) -> dict:
    return {"help": help_of(SchedulerConfig, name), **kw}


FLAGS: dict[str, dict] = {
    # scheduler (SchedulerConfig: a flag --x-y sets field x_y; common.scheduler_config reads them all)
    "--max-num-seqs": _sched("max_num_seqs", type=positive_int, default=None),
    "--max-num-batched-tokens": _sched("max_num_batched_tokens", type=positive_int, default=None),
    "--block-size": _sched("block_size", type=positive_int, default=16),
    "--state-interval": _sched("state_interval", type=positive_int, default=512),
    "--snapshot-mode": _sched("snapshot_mode", default="every-boundary", choices=SNAPSHOT_MODES),
    "--checkpoints": _sched("checkpoints", default="boundary", choices=CHECKPOINT_MODES),
    "--checkpoint-wait": _sched("checkpoint_wait", type=checkpoint_wait, default="grid"),
    "--tail-checkpoints": _sched("tail_checkpoints", type=non_negative_int, default=None),
    # None: SchedulerConfig's default (auto), or off where the run is the wait path's (common.scheduler_config)
    "--handoff": {**_sched("handoff", default=None, choices=HANDOFF_MODES),
                  "help": help_of(SchedulerConfig, "handoff") + " (off where not given: --workload figure1, the "
                                                                 "paper's rounds; --scheduler vllm, which cannot)"},
    "--handoff-max-levels": _sched("handoff_max_levels", type=positive_int, default=2),
    "--prefix-match-unit": _sched("prefix_match_unit", type=non_negative_int, default=0),
    "--vllm-version": _sched("vllm_version", default="0.33", choices=VLLM_VERSIONS),
    "--mamba-cache-mode": _sched("mamba_cache_mode", default="align", choices=MAMBA_CACHE_MODES),
    "--eviction": {"type": eviction_name, "default": None,
                   "help": help_of(SchedulerConfig, "eviction") + " (default lru)"},
    # the engine (EngineConfig)
    "--device": {"type": device_name, "default": "cpu", "help": "cpu | cuda | cuda:N"},
    "--dtype": {"type": dtype_name, "default": "float32",
                "help": f"weights and activations: {' | '.join(DTYPES)} (recurrent state stays float32)"},
    "--kv-cache-memory": {"type": byte_size, "default": None,
                          "help": "bytes for KV pages and state snapshots (suffixes: KiB MiB GiB, kB MB GB)"},
    "--max-model-len": {"type": positive_int, "default": 8192, "help": "longest prompt + max_tokens"},
    "--torch-threads": {"type": non_negative_int, "default": None,
                        "help": "intra-op CPU threads of torch (0 or unset: torch's default; 1 is steadier when "
                                "other processes share the cores)"},
    # simulator
    "--gpu": {"type": gpu_name, "default": "a800", "help": "the GPU the cost model prices (sim/cost_model.py)"},
    "--gpu-memory-utilization": {"type": positive_fraction, "default": 0.8,
                                 "help": "share of GPU memory for weights + cache (vLLM's flag)"},
    "--state-memory-fraction": {"type": unit_interval, "default": None,
                                "help": "hybrid models: a fixed share of the cache memory for state slots "
                                        "(default: one unified pool that pages and slots share, as vLLM's "
                                        "hybrid allocator)"},
    # everything else
    "--policy": {"type": arm_list, "default": "radix,radixflow",
                 "help": "comma list of scheduling arms (core/policies.py) or 'all'"},
    "--seed": {"type": non_negative_int, "default": 0, "help": "seed of the workload and of sampling"},
    "--json": {"dest": "json_path", "default": None, "help": "write the results here"},
}


def add(p, *names: str, **overrides) -> None:
    """Adds shared flags (FLAGS) to parser or group `p`; `overrides` (default, help, ...) apply to each."""
    for name in names:
        kw = {**FLAGS[name], **overrides}
        p.add_argument(name, **kw)


def add_scheduler_flags(p, eviction: bool = True) -> None:
    """The SchedulerConfig flags every command that runs the Scheduler has (`eviction=False`: the
    caller adds its own --eviction)."""
    add(p, "--max-num-seqs", "--max-num-batched-tokens", "--block-size", "--state-interval", "--snapshot-mode",
        "--checkpoints", "--checkpoint-wait", "--tail-checkpoints", "--handoff", "--handoff-max-levels")
    if eviction:
        add(p, "--eviction")
    p.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false",
                   help="disable prefix caching (--enable-prefix-caching is the default)")
    p.add_argument("--enable-prefix-caching", dest="enable_prefix_caching", action="store_true")
    p.set_defaults(enable_prefix_caching=True)


# ----------------------------------------------------------------------------- flags set vs defaults
def remember_defaults(p: argparse.ArgumentParser) -> None:
    """Records each option's default (typed as argparse would type it) and its flag, so `given` and
    `refuse` can tell what the user set. Call it after every add_argument / set_defaults of `p`."""
    table = {}
    for a in p._actions:
        if not a.option_strings or a.dest in (argparse.SUPPRESS, "help"):
            continue
        d = p.get_default(a.dest)
        if isinstance(d, str) and callable(a.type):
            d = a.type(d)
        flag = max(a.option_strings, key=len)
        if a.dest in table and a.const is True:  # --enable-x / --no-x: name the one that turns it off
            continue
        table[a.dest] = (flag, d)
    p.set_defaults(**{_DEFAULTS: table})


def given(args, dest: str) -> bool:
    """True if `dest` holds another value than its default (False where remember_defaults was not run)."""
    table = getattr(args, _DEFAULTS, None) or {}
    return dest in table and getattr(args, dest, None) != table[dest][1]


def flag_of(args, dest: str) -> str:
    table = getattr(args, _DEFAULTS, None) or {}
    return table[dest][0] if dest in table else "--" + dest.replace("_", "-")


def refuse(args, dests, why: str) -> None:
    """ValueError naming the first of `dests` the user set: `why` says what cannot honour it."""
    for dest in dests:
        if given(args, dest):
            value = getattr(args, dest)
            shown = "" if isinstance(value, bool) else f" {value}"
            raise ValueError(f"{flag_of(args, dest)}{shown}: {why}")
