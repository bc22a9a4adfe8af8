#!/usr/bin/env bash
# Installs SGLang 0.5.23 for the CPU tests and benchmark of the SGLang backends
# (tests/integrations/test_sglang_*.py, benchmarks/sglang_eviction.py) into a venv of its own,
# .venv-sglang/ (git-ignored), with radixflow installed there in editable mode. Idempotent: a stamp
# file in the venv makes re-runs instant.
#
# Why a separate venv: SGLang pins torch 2.14.1 (a CUDA build) and transformers 5.19.0, while the
# project runs the CPU build of torch 2.13.0 and transformers 5.23.0. SGLang goes in with --no-deps;
# what its radix cache, pools, allocators and test kit import is listed below (found by importing
# sglang.test.kits.unified_radix_cache.fixtures until it stopped failing). torch stays the CPU
# build 2.13.0 (a constraint), transformers 5.23.0. Two GPU-only imports (torchvision, sgl_kernel) are
# not installed: radixflow.integrations.sglang.cpu_shim stands in for them at import time.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv_lib.sh

VENV=${SGLANG_VENV:-.venv-sglang}
SGLANG_VERSION=0.5.23
TORCH_VERSION=2.13.0
REQUIREMENTS=(
  numpy packaging pydantic regex psutil requests aiohttp orjson pybase64 msgspec pyzmq tqdm pillow pyyaml
  starlette ipython dill sentencepiece gguf partial_json_parser datasets "openai" "compressed-tensors"
  "apache-tvm-ffi==0.1.11" "triton==3.9.0" "transformers==5.23.0" rich pytest hypothesis
)
ensure_venv "$VENV"
stamp="$VENV/.radixflow-sglang-$SGLANG_VERSION"
wanted="sglang==$SGLANG_VERSION torch==$TORCH_VERSION ${REQUIREMENTS[*]}"
if stamp_is_current "$stamp" "$wanted"; then
  exit 0
fi
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
printf 'torch==%s\ntransformers==5.23.0\n' "$TORCH_VERSION" > "$constraints"
quiet "$VENV/bin/python" -m pip install -q -c "$constraints" "torch==$TORCH_VERSION"
quiet "$VENV/bin/python" -m pip install -q --no-deps "sglang==$SGLANG_VERSION"
quiet "$VENV/bin/python" -m pip install -q -c "$constraints" "${REQUIREMENTS[@]}"
quiet "$VENV/bin/python" -m pip install -q --no-deps -e .
"$VENV/bin/python" - <<'PY'
import torch
assert torch.__version__.startswith("2.13.0"), f"torch {torch.__version__} is not the CPU build 2.13.0"
from radixflow.integrations.sglang import cpu_shim
cpu_shim.install()
import sglang.test.kits.unified_radix_cache.fixtures  # noqa: F401  (fails here, not in the tests)
PY
echo "$wanted" > "$stamp"
echo "SGLang $SGLANG_VERSION installed into $VENV with --no-deps (CPU torch $TORCH_VERSION, transformers 5.23.0, the cache's imports only; pip reports SGLang's declared CUDA/torch 2.14.1 requirements as unmet: expected)"
