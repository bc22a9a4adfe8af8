#!/usr/bin/env bash
# Installs llama.cpp's Python binding (llama-cpp-python 0.3.36, built from its sdist for this CPU)
# plus `gguf` and `sentencepiece` (the HF -> GGUF converter shipped in the sdist imports both) into
# the venv given as $1 (default .venv). Only benchmarks/engine_peers.py needs it: it is the `peers`
# extra, never part of the default or test install. Idempotent: a stamp in the venv makes re-runs instant.
#
# The sdist is downloaded once and kept (scripts/llamacpp_sdist.sh, shared with install_llamaserver.sh):
# the build runs from it, and its converter (vendor/llama.cpp/convert_hf_to_gguf.py, its conversion/
# package and the gguf-py it was written against) is unpacked into $VENV/share/radixflow-llamacpp/,
# where benchmarks/engine_peers.py imports it.
#
# Build time: about 9 minutes on 2 cores (CMAKE_BUILD_PARALLEL_LEVEL=2, GGML_NATIVE picks up AVX-512
# and OpenMP); more on a loaded machine.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${1:-.venv}
source scripts/llamacpp_sdist.sh
stamp="$VENV/.radixflow-llamacpp-$LLAMA_CPP_PYTHON_VERSION"
wanted="llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION gguf==$GGUF_VERSION sentencepiece native converter"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ] && [ -f "$share/conversion/__init__.py" ]; then
  exit 0
fi
start=$(date +%s)
install_converter
CMAKE_ARGS="-DGGML_NATIVE=ON" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
  quiet "$VENV/bin/python" -m pip install -q --no-cache-dir "$sdist"
"$VENV/bin/python" - <<'PY'
import gguf  # noqa: F401
import sentencepiece  # noqa: F401
import llama_cpp
assert llama_cpp.__version__ == "0.3.36", llama_cpp.__version__
print("llama_cpp", llama_cpp.__version__, "system:", llama_cpp.llama_print_system_info().decode().strip())
PY
echo "$wanted" > "$stamp"
echo "llama-cpp-python $LLAMA_CPP_PYTHON_VERSION (built from sdist, GGML_NATIVE=ON), gguf $GGUF_VERSION and the" \
  "sdist's converter ($share) installed into $VENV in $(( $(date +%s) - start )) s"
