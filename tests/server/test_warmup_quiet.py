"""Lazy warm-up probes run between requests only after a quiet gap (server/engine_loop.py WARM_QUIET_S):
a client that sends its next request as soon as it has an answer never queues behind a probe step."""

from types import SimpleNamespace

from radixflow.engine.engine import EngineConfig
from radixflow.server.engine_loop import WARM_QUIET_S, EngineLoop
from radixflow.server.metrics import ServerMetrics


def _loop(unfinished: bool, warming: bool, now: list[float]) -> EngineLoop:
    loop = EngineLoop(EngineConfig(model="tiny-qwen3.5"), ServerMetrics())
    loop.engine = SimpleNamespace(has_unfinished=unfinished, warming=warming, idle_until=lambda: None)
    loop._clock = lambda: now[0]  # the test's own clock: no wall time involved
    return loop


def test_no_probe_step_until_the_quiet_gap_has_passed():
    now = [100.0]
    loop = _loop(unfinished=False, warming=True, now=now)
    loop._open()  # ready: the gap counts from here, so a first request sent at once finds no probe step
    assert loop.ready.is_set() and loop._wait_time(True) == WARM_QUIET_S
    now[0] += 5.0
    assert loop._wait_time(True) == 0.0  # no request came: the probes start
    loop._busy_at = now[0]  # a request was just stepped
    assert loop._wait_time(True) == WARM_QUIET_S and loop._quiet_for() == 0.0
    now[0] += WARM_QUIET_S / 2
    assert loop._wait_time(True) == WARM_QUIET_S / 2 and loop._quiet_for() < WARM_QUIET_S
    now[0] += WARM_QUIET_S / 2
    assert loop._wait_time(True) == 0.0 and loop._quiet_for() >= WARM_QUIET_S


def test_idle_without_probes_blocks_and_busy_does_not_wait():
    assert _loop(unfinished=False, warming=False, now=[0.0])._wait_time(True) is None
    assert _loop(unfinished=True, warming=True, now=[0.0])._wait_time(True) == 0.0
