#!/usr/bin/env bash
# Builds llama.cpp's own HTTP server (`llama-server`) from the llama.cpp vendored in the
# llama-cpp-python 0.3.36 sdist (the one scripts/install_llamacpp.sh builds the binding from), plus
# what the HF -> GGUF conversion needs (gguf 0.19.0, sentencepiece and the sdist's converter), for
# the venv given as $1 (default .venv). Only benchmarks/serve_peers.py needs it: never part of the
# default or test install. It does NOT build the Python binding (that is install_llamacpp.sh's job).
#
# The vendored tree is configured with CMake directly (not through pip): Release, GGML_NATIVE=ON
# (AVX-512 / OpenMP where the CPU has them), no prebuilt web UI (it would be downloaded), no
# OpenSSL, no curl, no tests or examples; Ninja when present, else make. Layout, all under
# $VENV/share/radixflow-llamacpp/: the sdist (shared with install_llamacpp.sh), server-src/ (the
# vendored llama.cpp), server-build/ and bin/llama-server. Idempotent: a stamp next to the binary
# makes re-runs instant; an interrupted build resumes where it stopped.
#
# Build time: about 10 minutes on an idle 2-core machine (2 jobs), 20-25 on a loaded one.
# LLAMASERVER_JOBS sets the parallel jobs (default: the number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${1:-.venv}
source scripts/llamacpp_sdist.sh
binary="$share/bin/llama-server"
stamp="$share/bin/.llama-server-stamp"
cmake_flags=(
  -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF
)
wanted="llama-server from llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION ${cmake_flags[*]}; gguf==$GGUF_VERSION sentencepiece converter"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ] && [ -x "$binary" ] \
  && [ -f "$share/conversion/__init__.py" ]; then
  exit 0
fi
start=$(date +%s)
install_converter
mkdir -p "$share/bin"
src="$share/server-src"
if [ ! -f "$src/tools/server/server.cpp" ]; then
  rm -rf "$src.tmp" && mkdir -p "$src.tmp"
  tar xzf "$sdist" -C "$src.tmp" --strip-components=3 "$top"
  rm -rf "$src" && mv "$src.tmp" "$src"
fi
build="$share/server-build"
generator=()
if command -v ninja >/dev/null; then
  generator=(-G Ninja)
fi
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$src" -B "$build" "${generator[@]}" "${cmake_flags[@]}" >"$share/server-configure.log" 2>&1 \
    || { tail -30 "$share/server-configure.log" >&2; echo "llama-server: cmake configure failed (log: $share/server-configure.log)" >&2; exit 1; }
fi
jobs=${LLAMASERVER_JOBS:-$(nproc)}
cmake --build "$build" --target llama-server -j "$jobs" >"$share/server-build.log" 2>&1 \
  || { tail -30 "$share/server-build.log" >&2; echo "llama-server: build failed (log: $share/server-build.log)" >&2; exit 1; }
cp "$build/bin/llama-server" "$binary.tmp" && mv "$binary.tmp" "$binary"
"$binary" --version 2>&1 | head -3
echo "$wanted" > "$stamp"
echo "llama-server (llama.cpp vendored in llama-cpp-python $LLAMA_CPP_PYTHON_VERSION, GGML_NATIVE=ON) built at" \
  "$binary in $(( $(date +%s) - start )) s; gguf $GGUF_VERSION and the converter in $share"
