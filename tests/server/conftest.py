"""Session servers for tests/server (helpers live in server_harness.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from server_harness import SUITE_KEY_VAR, send_suite_key, start_server  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def suite_api_key():
    """RADIXFLOW_TEST_API_KEY=k runs the suite with every server behind --api-key k (server_harness.py)."""
    key = os.environ.get(SUITE_KEY_VAR)
    with pytest.MonkeyPatch.context() as mp:
        if key:
            send_suite_key(mp, key)
            mp.setenv("RADIXFLOW_API_KEY", key)  # `radixflow serve` processes the tests start
        else:
            mp.delenv("RADIXFLOW_API_KEY", raising=False)  # a developer's own key must not leak in
        yield key


@pytest.fixture(scope="session")
def hybrid_server():
    """tiny-qwen3.5 (hybrid: KV + state snapshots every 64 tokens), shared by the test files."""
    live = start_server("tiny-qwen3.5")
    yield live
    live.stop()


@pytest.fixture(scope="session")
def dense_server():
    """tiny-qwen3 (full attention only) with --block-size 1: hits at every token."""
    live = start_server("tiny-qwen3", block_size=1, state_interval=1, max_num_batched_tokens=2048)
    yield live
    live.stop()
