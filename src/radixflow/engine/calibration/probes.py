"""The warm-up probes: synthetic scans and forwards on the loaded model that warm-start the engine's
measured costs (`ScanCosts`, the scan chunk each level runs; `HandoffCalibration`'s probe observations),
once per model object, then carried from engine to engine."""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Iterator
from dataclasses import replace

import torch

from radixflow.engine.calibration.model import HandoffCalibration
from radixflow.engine.calibration.solvers import nnls
from radixflow.engine.models import batch as batch_mod
from radixflow.engine.models.cache import RowInput
from radixflow.engine.models.chunk_plan import ScanCosts, build_chunk_plan, chunk_candidates, plan_shape
from radixflow.engine.models.level_clock import LevelClock

_SCAN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_CALIB: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def scan_costs(model) -> ScanCosts | None:
    """The model's measured scan costs (probed once per model object; None without recurrent layers)."""
    if model not in _SCAN:
        _SCAN[model] = _probe_scans(model)
    return _SCAN[model]


def engine_scan_costs(model, interval: int) -> ScanCosts | None:
    """The model's scan costs with one chunk fixed for every level: the cheapest for rows cut at every
    `interval` tokens (state captures) and for short tails (dependent rows), predicted from the probe."""
    return fix_chunk(scan_costs(model), interval)


def fix_chunk(costs: ScanCosts | None, interval: int) -> ScanCosts | None:
    """`costs` with the chunk every level runs fixed (`engine_scan_costs`' decision, from measured costs)."""
    if costs is None:
        return None
    layout = [(0, 0, 32 * interval, [(k * interval, 0) for k in range(1, 32)])]
    layout += [(i, 0, max(1, interval // 2) + i, []) for i in range(1, 9)]
    shapes = {c: plan_shape(layout, c) for c in costs.per_slot}
    return replace(costs, fixed=costs.choose(shapes))


def calibration(model, block_size: int, scan: ScanCosts | None = None) -> HandoffCalibration:
    """The model's calibration: probed on first use (at `scan`'s chunk: the first engine's, so the probe's
    folds run the calls the engine's do; None: each probe forward picks its own), then carried from
    engine to engine (the last run's)."""
    if model not in _CALIB:
        cal = HandoffCalibration()
        t0 = time.perf_counter()
        _probe_rounds(model, block_size, cal, scan)
        cal.probe_seconds = time.perf_counter() - t0
        _CALIB[model] = cal
    return _CALIB[model]


def exhaust(steps: Iterator[None]):
    """Runs a probe's steps to the end; returns what the probe returns (its eager form)."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value


# A probe during whose steps other processes (and the hypervisor: steal time) used more than the cores our
# threads leave free plus this many timed a shared machine, not the model: its costs are used by this engine
# but not kept on disk, and the probe is taken again, up to ATTEMPTS times (the least disturbed attempt is
# the one used). On a 2-core machine probing on 2 threads: a quarter of a core.
OTHERS_MAX = 0.25
ATTEMPTS = 3
# Both counters tick at 1/CLK_TCK (10 ms) per core: each step's reading may be off by a few ticks, so a
# probe's estimate carries this much slack per step, and a short probe (a tiny model's) is never judged busy.
TICK_SLACK_S = 0.02


def _busy_seconds() -> float | None:
    """CPU seconds every process of the machine has used (all cores, steal included), from /proc/stat;
    None where there is none (not Linux)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 8:
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[1:8])
    steal = int(fields[8]) if len(fields) > 8 else 0
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system


def _spare_cores() -> float:
    """The cores this process may run on that torch's threads leave free (others using them contend with nothing)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return float(max(0, cores - torch.get_num_threads()))


class Disturbance:
    """Wall seconds of a probe's steps and the CPU seconds other processes used meanwhile (the machine's
    busy time from /proc/stat less this process's own, every thread of it), summed over the steps only:
    what a lazy server does between two steps (answering requests) is not counted. `others` is their
    ratio, the cores used by others on average; None where the machine's busy time cannot be read.
    `spare`: the cores our threads leave free (`_spare_cores()` unless given)."""

    def __init__(self, busy=_busy_seconds, own=_own_seconds, clock=time.perf_counter,
                 spare: float | None = None) -> None:
        self._busy, self._own, self._clock = busy, own, clock
        self.spare = _spare_cores() if spare is None else spare
        self.wall = 0.0
        self.steps = 0
        self.other_seconds: float | None = 0.0

    def metered(self, steps: Iterator[None]):
        """`steps` run one at a time, each one measured; returns what `steps` returns."""
        while True:
            b0, s0, t0 = self._busy(), self._own(), self._clock()
            try:
                next(steps)
            except StopIteration as stop:
                self._add(b0, s0, t0)
                return stop.value
            self._add(b0, s0, t0)
            yield

    def _add(self, b0, s0, t0) -> None:
        b1, s1, t1 = self._busy(), self._own(), self._clock()
        self.wall += t1 - t0
        self.steps += 1
        if b0 is None or b1 is None or self.other_seconds is None:
            self.other_seconds = None
        else:
            self.other_seconds += max(0.0, (b1 - b0) - (s1 - s0))

    @property
    def others(self) -> float | None:
        if self.other_seconds is None:
            return None
        return self.other_seconds / self.wall if self.wall > 0 else 0.0

    @property
    def quiet(self) -> bool:
        """Others used at most the spare cores plus OTHERS_MAX, give or take the counters' ticks (or it cannot
        be told: then the probe is taken as it is)."""
        o = self.other_seconds
        return o is None or o <= (self.spare + OTHERS_MAX) * self.wall + TICK_SLACK_S * (self.steps + 4)


def _scan_layers(model) -> list:
    """(kind, module) of each recurrent layer: 'gdn' (Qwen3.5's GatedDeltaNet) or 'ssd' (Mamba-2)."""
    from radixflow.engine.models.nemotron_h import Mamba2Mixer
    from radixflow.engine.models.qwen3_5 import GatedDeltaNet

    out = []
    for m in model.modules():
        if isinstance(m, GatedDeltaNet):
            out.append(("gdn", m))
        elif isinstance(m, Mamba2Mixer):
            out.append(("ssd", m))
    return out


def _scan_runner(kind: str, m, device: torch.device):
    """A function running one layer's chunked scan over a plan, on random inputs of the layer's sizes."""
    from radixflow.engine.models import gated_delta, ssd

    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape):
        return torch.rand(*shape, generator=gen).to(device)

    if kind == "gdn":
        h, dk, dv = m.nv, m.dk, m.dv

        def run(plan, n: int, r: int) -> None:
            args = [rand(n, h, dk) * 0.1, rand(n, h, dk) * 0.1, rand(n, h, dv), -rand(n, h), rand(n, h)]
            init = torch.zeros(r, h, dk, dv, device=device)
            out = torch.empty(n, h, dv, device=device)
            gated_delta._prefill(args, init, plan, init[:1], out)
        return run
    c = m.c
    h, p, s, g = c.mamba_num_heads, c.mamba_head_dim, c.ssm_state_size, c.n_groups

    def run(plan, n: int, r: int) -> None:  # noqa: F811 - one runner per kind
        args = [rand(n, h, p), -rand(n, h) * 0.1, rand(n, g, s), rand(n, g, s)]
        init = torch.zeros(r, h, p, s, device=device)
        out = torch.empty(n, h, p, device=device)
        ssd._prefill(args, init, plan, init[:1], out, g)
    return run


def _model_chunk(kind: str, m) -> int:
    return m.c.chunk_size if kind == "ssd" else 64  # gated_delta_rule's chunk


def _probe_scans(model, repeat: int = 3) -> ScanCosts | None:
    """`scan_steps` run to the end."""
    return exhaust(scan_steps(model, repeat))


def scan_steps(model, repeat: int = 3) -> Iterator[None]:
    """The scan probe, one layout of one chunk per step (returns its `ScanCosts`): time one layer of
    each recurrent kind at every candidate chunk on four layouts (one long row:
    many steps, few slots; many short rows: one step, padded slots; rows cut every 16 tokens; between),
    fit each chunk's two costs, and sum them over the model's recurrent layers."""
    layers = _scan_layers(model)
    if not layers:
        return None
    device = next(model.parameters()).device
    per_slot: dict[int, float] = {}
    per_step: dict[int, float] = {}
    kinds: dict[str, tuple[object, int]] = {}
    for kind, m in layers:
        if kind not in kinds:
            kinds[kind] = (m, sum(k == kind for k, _ in layers))
    for kind, (m, count) in kinds.items():
        run = _scan_runner(kind, m, device)
        for chunk in chunk_candidates(_model_chunk(kind, m)):
            layouts = [[(0, 0, 256, [])], [(i, 16 * i, 16, []) for i in range(16)],
                       [(i, 64 * i, 64, [(k, 0) for k in (16, 32, 48)]) for i in range(4)],
                       [(i, 32 * i, 32, []) for i in range(8)]]
            samples = []
            for rows in layouts:
                plan = build_chunk_plan(rows, chunk, 256, device)
                run(plan, 256, len(rows))  # warm-up
                best = float("inf")
                for _ in range(repeat):
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    t0 = time.perf_counter()
                    run(plan, 256, len(rows))
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    best = min(best, time.perf_counter() - t0)
                samples.append((plan.num_slots, len(plan.steps), best))
                yield
            k, s = nnls([(a, b) for a, b, _ in samples], [t for *_, t in samples])
            if s <= 0:  # a noisy fit put all the time on slots; a step call is never free: the cheapest
                # measured time per step (a step with its chunk's slots, an over-estimate) bounds it
                s = min(t / steps for _, steps, t in samples)
            per_slot[chunk] = per_slot.get(chunk, 0.0) + count * k
            per_step[chunk] = per_step.get(chunk, 0.0) + count * s
    return ScanCosts(per_slot, per_step)


def _probe_rounds(model, block_size: int, cal: HandoffCalibration, scan: ScanCosts | None = None,
                  repeat: int = 2) -> None:
    """`round_steps` run to the end."""
    exhaust(round_steps(model, block_size, cal, scan, repeat))


def round_steps(model, block_size: int, cal: HandoffCalibration, scan: ScanCosts | None = None,
                repeat: int = 2) -> Iterator[None]:
    """The round probe, one synthetic forward per step (each case best of `repeat`), into `cal`. Warm start:
    synthetic forwards through a scratch cache, plain rows (the round fit) and a producer
    with dependents of a few sizes (the level fit, and the fold fit from every repeat), best of `repeat`
    each."""
    hybrid = model.is_hybrid
    device = next(model.parameters()).device
    costs = (scan or scan_costs(model)) if hybrid else None
    gen = torch.Generator().manual_seed(0)
    vocab = min(model.vocab_size, 256)

    def ids(n: int) -> list[int]:
        return torch.randint(0, vocab, (n,), generator=gen).tolist()

    plain = [[16], [128], [16] * 8, [64] * 4]
    # dependents of multi-token producers (folded: no level, unless batch.FOLD is off) and of 1-token
    # producers (a separate level: what the level fit prices)
    handed = [(128, [(128, 16)]), (128, [(64, 8), (128, 8)]), (128, [(96, 24)] * 4),
              (128, [(64, 40), (96, 40), (112, 40), (128, 40)] * 2), (256, [(256, 1)] * 4),
              (1, [(1, 16)]), (1, [(1, 8), (1, 24)]), (1, [(1, 40)] * 4), (1, [(1, 1)] * 4)] if hybrid else []
    pages = sum(-(-n // block_size) + 1 for lens in plain for n in lens)
    pages = max(pages, max((-(-p // block_size) + len(d) * 4 for p, d in handed), default=0))
    cache = model.allocate_cache(pages + 8, block_size, 4 if hybrid else 0)

    def timed(rows: list[RowInput]) -> Iterator[None]:  # one step per forward; returns (best, levels)
        best, levels, base = float("inf"), {}, 0.0
        for i in range(repeat):
            if i:
                yield
            clock = LevelClock(device, time_fold=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            model(rows, cache, clock, costs)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t = time.perf_counter() - t0
            if clock.fold_copies:  # folded dependents: every repeat is an observation of the fold's cost
                cal.probe_folds.append((clock.fold_calls, clock.fold_rows, clock.fold_copied, clock.fold_measured))
            if t < best:
                best, levels, base = t, clock.by_level, clock.base
        if hybrid:  # level 0: every row without a producer, and the folded dependents
            all_lens = [len(r.token_ids) for r in rows]
            lens = [n for n, k in zip(all_lens, batch_mod.row_levels([r.after for r in rows], all_lens)) if k == 0]
            cal.probe_base.append((sum(n == 1 for n in lens), sum(n > 1 for n in lens),
                                   sum(n for n in lens if n > 1), max(lens), base))
        return best, levels

    for lens in plain:
        rows, page = [], 0
        for n in lens:
            need = -(-n // block_size)
            rows.append(RowInput(ids(n), 0, list(range(page, page + need)), None, [], [n - 1]))
            page += need
        t, _ = yield from timed(rows)
        cal.probe_rounds.append((len(rows), sum(lens), t))
        cal.lengths.append(t)
        yield
    for plen, deps in handed:
        need = -(-plen // block_size)
        rows = [RowInput(ids(plen), 0, list(range(need)), None, [], [plen - 1])]
        page = need
        for d, n in deps:
            q = d // block_size
            own = -(-(d + n) // block_size) - q
            rows.append(RowInput(ids(n), d, list(range(q)) + list(range(page, page + own)), None, [], [n - 1],
                                 after=0))
            page += own
        t, levels = yield from timed(rows)
        extra = sum(levels.values())
        cal.probe_rounds.append((len(rows), plen + sum(n for _, n in deps), t - extra))
        cal.lengths.append(t)
        if levels:  # a separate level ran (folded dependents run in level 0)
            cal.probe_levels.append((len(deps), sum(n for _, n in deps), max(n for _, n in deps), extra))
        yield
    cal._round_fit = cal._level_fit = cal._base_fit = cal._fold_fit = None


class WarmUp:
    """The probes one engine needs (a hybrid model's): the scan probe, whose costs fix the chunk every
    level runs (`fix_chunk`), and, where the engine calibrates (`--handoff on | auto`), the round probe.
    Each comes from an earlier engine on the same model object in this process, else from `store` (disk,
    store.py), else is probed: all at once (`run`, the engine's eager start) or a step at a time (`step`,
    a server between requests: `Engine.warm_step`). `scan` (the engine's costs, its chunk fixed) and
    `cal` are what the engine reads; until a probe has run they are the engine's safe defaults: no scan
    costs (each level runs `chunk_plan.unmeasured_chunk`'s chunk) and a calibration holding only what the
    engine measured itself (`auto` hands off while it has no costs, as the rule does without a model)."""

    def __init__(self, model, model_dir, block_size: int, interval: int, calibrate: bool, store=None) -> None:
        self.model, self.model_dir, self.block_size, self.interval = model, model_dir, block_size, interval
        self.store = store
        self.scan: ScanCosts | None = None
        self.cal: HandoffCalibration | None = HandoffCalibration() if calibrate else None
        self.source: dict[str, str] = {}     # "scan" / "rounds" -> "memory" | "disk" | "probed"
        self.seconds: dict[str, float] = {}  # the probes run here: their seconds
        self.saved: dict[str, str] = {}      # the files written
        self.attempts: dict[str, int] = {}   # the probes run here: how many times each was taken
        self.disturbed: dict[str, float] = {}  # a probe no attempt of which was quiet: others' cores
        self.meter = Disturbance             # one per attempt (tests substitute their own)
        self._raw: ScanCosts | None = None
        self._steps: Iterator[None] | None = None
        self._load()

    # ------------------------------------------------------------------ what is known already
    def _key(self, kind: str) -> dict:
        from radixflow.engine.calibration.store import machine_key

        key = machine_key(self.model, self.model_dir)
        if kind == "rounds":
            key.update(block_size=self.block_size, chunk=self.scan.fixed if self.scan is not None else None)
        return key

    def _load(self) -> None:
        from radixflow.engine.calibration.store import rounds_into, scan_from_json

        m = self.model
        if m in _SCAN:
            self._set_scan(_SCAN[m], "memory")
        elif self.store is not None:
            data = self.store.load("scan", self._key("scan"))
            if data is not None:
                _SCAN[m] = scan_from_json(data)
                self._set_scan(_SCAN[m], "disk")
        if self.cal is None or "scan" not in self.source:
            return
        if m in _CALIB:
            self.cal = _CALIB[m]
            self.source["rounds"] = "memory"
        elif self.store is not None:
            data = self.store.load("rounds", self._key("rounds"))
            if data is not None:
                rounds_into(self.cal, data)
                _CALIB[m] = self.cal
                self.source["rounds"] = "disk"

    def _set_scan(self, raw: ScanCosts | None, source: str) -> None:
        self._raw = raw
        self.scan = fix_chunk(raw, self.interval)
        self.source["scan"] = source

    @property
    def done(self) -> bool:
        return "scan" in self.source and (self.cal is None or "rounds" in self.source)

    @property
    def pending(self) -> list[str]:
        return [k for k in ("scan", "rounds") if k not in self.source and (k == "scan" or self.cal is not None)]

    # ------------------------------------------------------------------ probing what is not
    def steps(self) -> Iterator[None]:
        from radixflow.engine.calibration.store import rounds_to_json, scan_to_json

        if "scan" not in self.source:
            t0 = time.perf_counter()
            raw = yield from self._attempts("scan", lambda: scan_steps(self.model))
            _SCAN[self.model] = raw
            self.seconds["scan"] = time.perf_counter() - t0
            self._set_scan(raw, "probed")
            self._save("scan", scan_to_json(raw))
        if self.cal is not None and "rounds" not in self.source:
            t0 = time.perf_counter()

            def rounds() -> Iterator[None]:
                probe = HandoffCalibration()  # probed apart, then handed over whole: no fit sees half a probe
                yield from round_steps(self.model, self.block_size, probe, self.scan)
                return probe
            probe = yield from self._attempts("rounds", rounds)
            probe.probe_seconds = time.perf_counter() - t0
            for f in ("probe_rounds", "probe_levels", "probe_base", "probe_folds"):
                setattr(self.cal, f, getattr(probe, f))
            self.cal.lengths.extend(probe.lengths)
            self.cal.probe_seconds = probe.probe_seconds
            self.cal._round_fit = self.cal._level_fit = self.cal._base_fit = self.cal._fold_fit = None
            _CALIB[self.model] = self.cal
            self.seconds["rounds"] = probe.probe_seconds
            self.source["rounds"] = "probed"
            self._save("rounds", rounds_to_json(probe))

    def _attempts(self, kind: str, make):
        """Runs the probe `make()` until an attempt's steps were quiet (`Disturbance`), at most ATTEMPTS
        times where a store would keep it (once without one: nothing outlives the engine); returns the least
        disturbed attempt's result, and records in `disturbed[kind]` the cores others used during it when
        even that one was not quiet (it is then not kept on disk)."""
        best = None
        for attempt in range(1, (ATTEMPTS if self.store is not None else 1) + 1):
            self.attempts[kind] = attempt
            meter = self.meter()
            result = yield from meter.metered(make())
            if best is None or (meter.others or 0.0) < (best[0].others or 0.0):
                best = (meter, result)
            if meter.quiet:
                break
        meter, result = best
        if not meter.quiet:
            self.disturbed[kind] = meter.others
        return result

    def _save(self, kind: str, data: dict) -> None:
        if self.store is not None and kind not in self.disturbed:
            f = self.store.save(kind, self._key(kind), data)
            if f is not None:
                self.saved[kind] = str(f)

    def run(self) -> None:
        """Every probe still missing, now."""
        exhaust(self.steps())

    def step(self) -> bool:
        """One step of the probes still missing; False once none is left."""
        if self.done:
            return False
        if self._steps is None:
            self._steps = self.steps()
        try:
            next(self._steps)
        except StopIteration:
            self._steps = None
        return not self.done
