"""The warm-up probes kept on disk and run lazily (engine/calibration/probes.py `WarmUp`, store.py): a stored
probe is reused only under its whole key, gives the engine the decisions the probe that wrote it gave, and a
lazy engine reaches the same state a step at a time."""

from __future__ import annotations

import json

import torch

from radixflow.config import SchedulerConfig
from radixflow.engine.calibration import fix_chunk
from radixflow.engine.calibration.probes import WarmUp
from radixflow.engine.calibration.store import ProbeStore
from radixflow.engine.engine import Engine, EngineConfig
from radixflow.engine.loader import load_model
from radixflow.engine.tiny import resolve_model

MODEL = "tiny-qwen3.5"


def _fresh():
    """A newly loaded model object: no probe of an earlier engine in this process applies to it."""
    path = resolve_model(MODEL)
    return load_model(path).model, path


def test_a_stored_probe_gives_the_same_decisions(tmp_path):
    store = ProbeStore(tmp_path)
    model, path = _fresh()
    first = WarmUp(model, path, 16, 64, True, store)
    assert first.pending == ["scan", "rounds"]
    first.run()
    assert first.source == {"scan": "probed", "rounds": "probed"} and len(list(tmp_path.glob("*.json"))) == 2
    model2, _ = _fresh()
    again = WarmUp(model2, path, 16, 64, True, store)
    assert again.done and again.source == {"scan": "disk", "rounds": "disk"}
    assert (again._raw.per_slot, again._raw.per_step) == (first._raw.per_slot, first._raw.per_step)
    assert again.scan == first.scan  # the chunk every level runs
    assert again.cal.probe_rounds == first.cal.probe_rounds and again.cal.probe_levels == first.cal.probe_levels
    assert again.cal.handoff_costs() == first.cal.handoff_costs()  # what `--handoff auto` weighs
    assert again.cal.round_fit == first.cal.round_fit and again.cal.fold_fit == first.cal.fold_fit


def test_a_changed_key_misses(tmp_path):
    store = ProbeStore(tmp_path)
    model, path = _fresh()
    WarmUp(model, path, 16, 64, True, store).run()
    # another page size: the round probe's forwards differ, the scan probe's do not
    other, _ = _fresh()
    w = WarmUp(other, path, 8, 64, True, store)
    assert w.source == {"scan": "disk"} and w.pending == ["rounds"]
    # another thread count: nothing applies
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        third, _ = _fresh()
        assert WarmUp(third, path, 16, 64, True, store).pending == ["scan", "rounds"]
    finally:
        torch.set_num_threads(threads)
    # a file whose key was altered, or that cannot be parsed, is a miss
    for f in tmp_path.glob("scan-*.json"):
        doc = json.loads(f.read_text())
        doc["key"]["torch"] = "0.0"
        f.write_text(json.dumps(doc))
    fourth, _ = _fresh()
    assert WarmUp(fourth, path, 16, 64, True, store).pending == ["scan", "rounds"]
    for f in tmp_path.glob("*.json"):
        f.write_text("{not json")
    fifth, _ = _fresh()
    assert WarmUp(fifth, path, 16, 64, True, store).pending == ["scan", "rounds"]


def _config(warmup: str, cache: str | None) -> EngineConfig:
    return EngineConfig(model=MODEL, kv_cache_memory=16 << 20, max_model_len=1024, warmup=warmup, probe_cache=cache,
                        scheduler=SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=512, block_size=16,
                                                  state_interval=64))


def test_a_lazy_engine_serves_with_safe_defaults_then_installs_the_probes(tmp_path):
    eng = Engine(_config("lazy", str(tmp_path)))
    assert eng.warming and eng.executor.scan_costs is None  # levels run the unmeasured default chunk
    cal = eng.executor.calibration
    assert cal is eng.scheduler.handoff_source and cal.handoff_costs() is None  # `auto` hands off meanwhile
    steps = 0
    while eng.warm_step():
        steps += 1
    assert steps > 10 and not eng.warming  # one scan layout or one synthetic forward per step
    w = eng.warmup
    assert eng.executor.scan_costs == fix_chunk(w._raw, 64) and eng.executor.calibration is cal
    assert cal.scan == eng.executor.scan_costs and cal.handoff_costs() is not None
    assert any(name == "first forward (after ready)" for name, _ in eng.startup)
    # an eager engine on a new model object reads what the lazy one stored: the same decisions
    eager = Engine(_config("eager", str(tmp_path)))
    assert eager.warmup.source == {"scan": "disk", "rounds": "disk"} and not eager.warming
    assert eager.executor.scan_costs == eng.executor.scan_costs
    assert eager.executor.calibration.handoff_costs() == cal.handoff_costs()  # what `auto` weighs


class _Busy:
    """A Disturbance whose machine reads as busy: other processes used `cores` cores during every step."""

    def __init__(self, cores: float):
        self.cores = cores

    def __call__(self):
        from radixflow.engine.calibration.probes import Disturbance

        clock = [0.0]
        busy = [0.0]

        def tick() -> float:
            clock[0] += 1.0
            return clock[0]

        def machine() -> float:  # the machine's busy seconds: ours (0) plus the others'
            busy[0] += self.cores
            return busy[0]
        return Disturbance(busy=machine, own=lambda: 0.0, clock=tick, spare=0.0)


def test_a_probe_taken_beside_other_work_is_retried_then_used_but_not_kept(tmp_path):
    from radixflow.engine.calibration import probes

    store = ProbeStore(tmp_path)
    model, path = _fresh()
    w = WarmUp(model, path, 16, 64, True, store)
    w.meter = _Busy(1.5)
    w.run()
    # every attempt disturbed: each probe was taken ATTEMPTS times, the engine has its costs, no file is kept
    assert w.attempts == {"scan": probes.ATTEMPTS, "rounds": probes.ATTEMPTS}
    assert w.done and w.scan is not None and w.cal.handoff_costs() is not None
    assert set(w.disturbed) == {"scan", "rounds"} and all(v > probes.OTHERS_MAX for v in w.disturbed.values())
    assert not list(tmp_path.glob("*.json")) and not w.saved
    # a quiet machine: one attempt each, and both kept
    model2, _ = _fresh()
    q = WarmUp(model2, path, 16, 64, True, store)
    q.meter = _Busy(0.0)
    q.run()
    assert q.attempts == {"scan": 1, "rounds": 1} and not q.disturbed and len(list(tmp_path.glob("*.json"))) == 2
    # no store: nothing would outlive the engine, so a disturbed probe is taken once
    model3, _ = _fresh()
    n = WarmUp(model3, path, 16, 64, True, None)
    n.meter = _Busy(1.5)
    n.run()
    assert n.attempts == {"scan": 1, "rounds": 1} and set(n.disturbed) == {"scan", "rounds"}


def test_disturbance_counts_only_other_processes_during_the_steps():
    from radixflow.engine.calibration.probes import Disturbance, exhaust

    t = {"wall": 0.0, "busy": 0.0, "own": 0.0}

    def steps():
        for _ in range(4):
            t["wall"] += 2.0
            t["own"] += 3.0        # this process: 1.5 cores (its threads), not counted
            t["busy"] += 3.0 + 1.0  # the machine: ours plus 0.5 cores of someone else's
            yield
        return "costs"

    d = Disturbance(busy=lambda: t["busy"], own=lambda: t["own"], clock=lambda: t["wall"], spare=0.0)
    gen = d.metered(steps())
    assert next(gen) is None
    t["wall"] += 100.0   # between two steps (a lazy server answering requests): not counted
    t["busy"] += 150.0
    assert exhaust(gen) == "costs"
    assert d.wall == 8.0 and d.others == 0.5 and not d.quiet
    # the same half core of others' work on a machine with a core our threads leave free: no contention
    d.spare = 1.0
    assert d.quiet
    unreadable = Disturbance(busy=lambda: None, own=lambda: 0.0, clock=lambda: t["wall"])
    assert exhaust(unreadable.metered(steps())) == "costs" and unreadable.others is None and unreadable.quiet
