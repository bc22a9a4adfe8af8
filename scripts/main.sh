#!/usr/bin/env bash
# The main job from a fresh clone: install, then compare the arms.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/radixflow simulate --model qwen3.5-27b --policy radix,radix+flex,radixflow --questions 300 "$@"
