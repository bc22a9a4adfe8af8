#!/usr/bin/env bash
# Installs what the tests need, then runs the linter and the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests benchmarks
set +e
# The vLLM plugin tests must run, not skip, here: setup.sh installed vLLM.
RADIXFLOW_REQUIRE_VLLM=1 .venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
