"""Lazy warm-up probes run between requests only after a quiet gap (server/engine_loop.py WARM_QUIET_S):
a client that sends its next request as soon as it has an answer never queues behind a probe step."""

import time
from types import SimpleNamespace

from radixflow.engine.engine import EngineConfig
from radixflow.server import engine_loop
from radixflow.server.engine_loop import EngineLoop
from radixflow.server.metrics import ServerMetrics


def _loop(unfinished: bool, warming: bool) -> EngineLoop:
    loop = EngineLoop(EngineConfig(model="tiny-qwen3.5"), ServerMetrics())
    loop.engine = SimpleNamespace(has_unfinished=unfinished, warming=warming, idle_until=lambda: None)
    return loop


def test_no_probe_step_right_after_a_request_step():
    loop = _loop(unfinished=False, warming=True)
    assert loop._wait_time(True) == 0.0  # never stepped a request: the probes may start at once
    loop._busy_at = time.monotonic()  # a request was just stepped
    wait = loop._wait_time(True)
    assert engine_loop.WARM_QUIET_S - 0.5 < wait <= engine_loop.WARM_QUIET_S
    assert loop._quiet_for() < engine_loop.WARM_QUIET_S
    loop._busy_at = time.monotonic() - engine_loop.WARM_QUIET_S - 0.1  # quiet long enough
    assert loop._wait_time(True) == 0.0 and loop._quiet_for() >= engine_loop.WARM_QUIET_S


def test_idle_without_probes_blocks_and_busy_does_not_wait():
    assert _loop(unfinished=False, warming=False)._wait_time(True) is None
    assert _loop(unfinished=True, warming=True)._wait_time(True) == 0.0
