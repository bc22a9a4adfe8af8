#!/usr/bin/env bash
# The numeric tests under every CPU capability torch offers on this machine (ATEN_CPU_CAPABILITY=default,
# avx2, avx512 where the CPU has them) at 1 and 2 threads: the fidelity bounds (tests/fidelity.py) must
# hold whichever kernels the CPU picks, not only this machine's. Default tests: tests/engine tests/core;
# other pytest arguments replace them. PYTHON=... uses that interpreter instead of installing .venv.
#   bash scripts/test_numerics.sh                 # the whole matrix
#   bash scripts/test_numerics.sh tests/engine/test_equivalence.py -x
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then
  py=$PYTHON
else
  bash scripts/setup.sh
  py=.venv/bin/python
fi
[ "$#" -gt 0 ] || set -- tests/engine tests/core
# libgomp's threads spin while they wait: on a busy machine a 2-thread run then crawls (a small matmul
# loop measured ~300x slower than with PASSIVE). Waiting passively changes no result.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
# torch's best kernels here (ATEN_CPU_CAPABILITY unset): it offers that level and every lower one.
best=$(env -u ATEN_CPU_CAPABILITY "$py" -c "import torch; print(torch.backends.cpu.get_cpu_capability().lower())")
case "$best" in
  avx512) caps="default avx2 avx512" ;;
  avx2) caps="default avx2" ;;
  default) caps="default" ;;
  *) caps="default $best" ;;  # another CPU (e.g. arm64's sve256): the scalar kernels and torch's pick
esac
caps=${CAPABILITIES:-$caps}  # e.g. CAPABILITIES="default avx2": only those
echo "torch's best CPU capability here: $best; running: $caps x OMP_NUM_THREADS 1 2"
summary=() failed=0 last=$(mktemp)
for cap in $caps; do
  for threads in 1 2; do
    got=$(ATEN_CPU_CAPABILITY=$cap "$py" -c "import torch; print(torch.backends.cpu.get_cpu_capability().lower())")
    if [ "$got" != "$cap" ]; then
      echo "error: ATEN_CPU_CAPABILITY=$cap gave torch's $got kernels" >&2
      exit 1
    fi
    echo "== ATEN_CPU_CAPABILITY=$cap OMP_NUM_THREADS=$threads"
    start=$SECONDS
    set +e
    ATEN_CPU_CAPABILITY=$cap OMP_NUM_THREADS=$threads "$py" -m pytest -p no:cacheprovider "$@" | tee "$last"
    rc=${PIPESTATUS[0]}
    set -e
    summary+=("$cap x $threads thread(s): $(tail -1 "$last") ($((SECONDS - start)) s, exit $rc)")
    [ "$rc" -eq 0 ] || failed=1
  done
done
rm -f "$last"
printf '%s\n' "${summary[@]}"
exit "$failed"
