#!/bin/bash
# A/B of the xentropy kernels (see README.md): GPU tests under each variant, compute-sanitizer on
# the new kernels, then the benchmark per variant (base first and last, so drift shows).
# usage: gpu_ab/xentropy/gpu_check.sh LOGDIR   (from the repository root; ~4 minutes on an H200)
set -u
LOG=${1:?usage: gpu_check.sh LOGDIR}
mkdir -p "$LOG"
export PYTHONPATH=$PWD:$PWD/compatibility APEX_CACHE_DIR=/tmp/cache_ab TORCH_CUDA_ARCH_LIST=9.0
TESTS=tests/apex/contrib/xentropy/test_xentropy.py
VARIANTS="fast warp"
status=0
step() { echo "=== $* ($(date +%T))" | tee -a "$LOG/summary.txt"; }

step build
python3 -c "import xentropy_cuda; xentropy_cuda.forward" 2>&1 | tee "$LOG/build.log" || status=1

step "tests, base (all GPU tests)"
python3 -m pytest -m gpu -q -x -p no:cacheprovider "$TESTS" 2>&1 | tee "$LOG/tests_base.log" | tail -3
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
for v in $VARIANTS; do
  # The kernels differ by variant, the op registration not: torch.compile / opcheck run once above.
  step "tests, $v"
  APEX_XENTROPY_VARIANT=$v python3 -m pytest -m gpu -q -x -p no:cacheprovider -k "not compiles and not opcheck" \
    "$TESTS" 2>&1 | tee "$LOG/tests_$v.log" | tail -3
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
done

step "memcheck, warp (reaches the block and warp forward and the block backward)"
SANITIZER=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
APEX_XENTROPY_VARIANT=warp "$SANITIZER" --tool memcheck --error-exitcode 1 \
  python3 gpu_ab/xentropy/memcheck_case.py 2>&1 | tee "$LOG/memcheck_warp.log" | tail -3
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

n=0
for v in base $VARIANTS base; do
  n=$((n + 1))
  step "bench $n, $v"
  APEX_XENTROPY_VARIANT=$v python3 benchmarks/contrib/bench_xentropy.py --impls apex 2>&1 | tee "$LOG/bench_${n}_$v.log"
done
step "done, status $status"
exit $status
