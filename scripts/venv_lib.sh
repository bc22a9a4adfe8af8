# Shared by the install scripts of the venvs of their own (install_sglang.sh, install_vllm_cpu.sh); sourced.

# ensure_venv VENV: create the venv with $PYTHON (default python3) unless it exists.
ensure_venv() {
  if [ ! -x "$1/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$1"
  fi
}

# stamp_is_current STAMP WANTED: whether STAMP holds WANTED and is newer than pyproject.toml.
stamp_is_current() {
  [ -f "$1" ] && [ "$(cat "$1")" = "$2" ] && [ ! pyproject.toml -nt "$1" ]
}

# quiet CMD...: CMD's output without pip's lines that only say a --no-deps package's declared
# requirements are unmet (and blank lines); on failure all of it, on stderr, and CMD's status.
quiet() {
  local out
  out=$("$@" 2>&1) || { echo "$out" >&2; return 1; }
  echo "$out" | grep -v -e "^WARNING: Location" -e "requires" -e "dependency resolver" -e "incompatible" \
    -e "^$" || true
}
