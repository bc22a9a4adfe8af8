"""The vLLM CPU harness leaves nothing behind: its tiny model directory goes when the process ends."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from vllm_factories import load_harness


def test_the_tiny_model_directory_is_removed_when_the_process_exits(tmp_path):
    load_harness()  # skips (or fails under RADIXFLOW_REQUIRE_VLLM=1) without vLLM
    code = ("from radixflow.integrations.vllm import cpu_harness as h; "
            "h.build_scheduler(h.SchedulerSetup()); print(h._tiny_model_dir().name)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "TMPDIR": str(tmp_path)}).stdout
    used = Path(out.split()[-1])
    assert used.parent == tmp_path and used.name.startswith("radixflow-vllm-model-")
    assert not used.exists() and list(tmp_path.iterdir()) == []
