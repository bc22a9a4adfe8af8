#!/usr/bin/env bash
# Installs vLLM 0.33.0 for the CPU tests of the vLLM plugin (tests/integrations/test_vllm_plugin.py) into
# the virtual environment whose python is $1 (default .venv/bin/python). Idempotent: a stamp file in
# that environment makes re-runs instant.
#
# vLLM itself goes in with --no-deps: its own requirements pin a CUDA torch and GPU kernels that a CPU
# machine neither needs nor can use. What its scheduler, configs and request objects import is listed
# below (found by removing one package at a time until the tests broke). torch stays at the CPU build
# 2.13.0 already installed there (vLLM pins 2.14, which the scheduler does not need), and an installed
# transformers is kept at its version, so the project's own pins win. vLLM's declared requirements
# (torch 2.14, CUDA packages, ...) are therefore not met, on purpose: it goes in last, so no pip run
# here resolves against it and reports them as conflicts; the script ends with one line saying so.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${1:-.venv/bin/python}
VLLM_VERSION=0.33.0
TORCH_VERSION=2.13.0
REQUIREMENTS=(
  numpy packaging pydantic regex psutil cbor2 pyzmq urllib3 requests aiohttp
  "transformers>=5.16.1" openai openai-harmony pillow pybase64 cachetools msgspec cloudpickle
  uvloop py-cpuinfo prometheus_client fastapi partial_json_parser einops
  "xgrammar==0.2.8" "llguidance>=1.7.0,<1.8.0"
)

if [ ! -x "$PY" ]; then
  echo "error: $PY is not an executable python; pass the venv's python, e.g. .venv/bin/python" >&2
  exit 2
fi
env_dir=$("$PY" -c 'import sys; print(sys.prefix)')
stamp="$env_dir/.radixflow-vllm-$VLLM_VERSION"
wanted="vllm==$VLLM_VERSION torch==$TORCH_VERSION ${REQUIREMENTS[*]}"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ]; then
  exit 0
fi

constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
# A constraint, not a requirement: pip may keep or install torch 2.13.0, never pull another build.
echo "torch==$TORCH_VERSION" > "$constraints"
installed_transformers=$("$PY" -c 'from importlib.metadata import version; print(version("transformers"))' \
  2>/dev/null || true)
if [ -n "$installed_transformers" ]; then
  # The project pins its own transformers (5.23); vLLM's scheduler works with it.
  echo "transformers==$installed_transformers" >> "$constraints"
else
  echo "transformers<5.21.0" >> "$constraints"  # vLLM 0.33.0's own range
fi

# While vLLM is installed, pip checks its unmet requirements whenever it installs one of them: out
# first (a re-run after a version change), in last.
if "$PY" -m pip show -q vllm >/dev/null 2>&1; then
  "$PY" -m pip uninstall -q -y vllm
fi
"$PY" -m pip install -q -c "$constraints" "torch==$TORCH_VERSION"
"$PY" -m pip install -q -c "$constraints" "${REQUIREMENTS[@]}"
"$PY" -m pip install -q --no-deps "vllm==$VLLM_VERSION"
unmet=$("$PY" - <<'PY' | tail -n 1
import os
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
import vllm.v1.core.sched.async_scheduler  # noqa: F401  (fails here, not in the tests, if a package is missing)
import torch
assert torch.__version__.startswith("2.13.0"), f"torch {torch.__version__} is not the CPU build 2.13.0"
from importlib.metadata import PackageNotFoundError, requires, version
from packaging.requirements import Requirement
unmet, total = 0, 0
for text in requires("vllm") or []:
    req = Requirement(text)
    if req.marker is None or req.marker.evaluate({"extra": ""}):
        total += 1
        try:
            unmet += not req.specifier.contains(version(req.name), prereleases=True)
        except PackageNotFoundError:
            unmet += 1
print(f"{unmet} of its {total}")
PY
)
echo "$wanted" > "$stamp"
echo "vLLM $VLLM_VERSION installed into $env_dir with --no-deps for the CPU scheduler tests: $unmet declared" \
  "requirements are not met on purpose (CUDA torch 2.14 and GPU kernels its model runner needs, not its scheduler)"
