#!/usr/bin/env bash
# The main job from a fresh clone: install, then compare prefix-stop (radix) with state-ready traversal
# (radixflow) on the real PyTorch engine (tiny-qwen3.5, random weights, CPU) over an overloaded
# multi-candidate trace, under --handoff off (the wait, the paper's setting) and auto (the default, SPEC §15).
# Extra arguments go to `radixflow bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --no-vllm
mkdir -p runs
.venv/bin/radixflow bench --model tiny-qwen3.5 --policy radix,radixflow --questions 32 --handoff-compare off,auto \
    --json runs/bench-tiny-qwen3.5.json "$@"
