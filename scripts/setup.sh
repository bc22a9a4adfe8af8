#!/usr/bin/env bash
# Creates .venv and installs radixflow with its test dependencies (idempotent); --no-vllm skips vLLM.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.radixflow-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  # The CPU build of torch 2.13.0 is what this machine ships; a bare `torch` would pull a CUDA build.
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -e ".[test]"
  touch "$stamp"
fi
# vLLM 0.33.0 (no deps, CPU torch kept) for the plugin's tests against vLLM's own scheduler.
if [ "${1:-}" != "--no-vllm" ]; then
  bash scripts/install_vllm.sh .venv/bin/python
fi
