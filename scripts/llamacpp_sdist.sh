# Sourced by scripts/install_llamacpp.sh and scripts/install_llamaserver.sh (not run by itself): the
# llama-cpp-python sdist both build from, kept in $VENV/share/radixflow-llamacpp/, and its converter.
# Expects VENV (the venv's path, created here if missing); sets VENV (absolute), share, sdist, top.
LLAMA_CPP_PYTHON_VERSION=0.3.36
GGUF_VERSION=0.19.0
if [ ! -x "$VENV/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$VENV"
fi
VENV=$(cd "$VENV" && pwd -P)
share="$VENV/share/radixflow-llamacpp"
sdist="$share/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
top="llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"

# pip's output without the lines about other packages' unmet requirements (vLLM is installed --no-deps).
quiet() {
  local out
  out=$("$@" 2>&1) || { echo "$out" >&2; return 1; }
  echo "$out" | grep -v -e "^WARNING: Location" -e "requires" -e "dependency resolver" -e "incompatible" || true
}

# The sdist, downloaded once (only llama-cpp-python itself as source; its build tools as wheels) and
# moved into place whole, so a concurrent run of the other script sees it complete or not at all.
fetch_sdist() {
  mkdir -p "$share"
  if [ ! -f "$sdist" ]; then
    local tmp
    tmp=$(mktemp -d)
    quiet "$VENV/bin/python" -m pip download -q --no-deps --no-binary llama-cpp-python -d "$tmp" \
      "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
    mv "$tmp"/llama_cpp_python-*.tar.gz "$sdist"
    rm -rf "$tmp"
  fi
}

# gguf, sentencepiece and the sdist's HF -> GGUF converter (convert_hf_to_gguf.py, its conversion/
# package and the gguf-py it was written against), unpacked into $share for benchmarks/llamacpp_convert.py.
install_converter() {
  if ! "$VENV/bin/python" -c "import importlib.metadata as m, sentencepiece; assert m.version('gguf') == '$GGUF_VERSION'" \
      2>/dev/null; then
    quiet "$VENV/bin/python" -m pip install -q "gguf==$GGUF_VERSION" sentencepiece
  fi
  fetch_sdist
  tar xzf "$sdist" -C "$share" --strip-components=3 "$top/convert_hf_to_gguf.py" "$top/conversion" "$top/gguf-py"
}
