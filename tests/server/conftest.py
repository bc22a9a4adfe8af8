"""Session servers for tests/server (helpers live in server_harness.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from server_harness import start_server  # noqa: E402


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
