"""vLLM 0.32's deferral route (the scan's skip after the prefix lookup, `_ec_transfer_pending`) checked on
0.33's scheduler, which asks the same question at the same point: both routes must schedule identically.

Needs vLLM installed by scripts/install_vllm.sh; skipped otherwise, failed under RADIXFLOW_REQUIRE_VLLM=1.
"""

from __future__ import annotations

import pytest
from vllm_factories import load_harness

load_harness()

from radixflow.integrations.vllm import scheduler as plugin  # noqa: E402
from radixflow.integrations.vllm.sweep import run_config, smoke_configs  # noqa: E402


@pytest.mark.parametrize("config", smoke_configs(), ids=lambda c: c.name)
def test_deferring_after_the_lookup_schedules_as_deferring_at_the_lookahead(config, monkeypatch):
    at_lookahead = run_config(config, plugin=True)
    monkeypatch.setattr(plugin, "DEFER_AT_LOOKAHEAD", False)
    after_lookup = run_config(config, plugin=True)
    assert after_lookup == at_lookahead
    if config.name.startswith("qa1tok"):
        assert after_lookup.deferrals > 0  # the route was taken, not bypassed
