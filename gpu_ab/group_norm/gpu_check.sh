#!/bin/bash
# Group norm A/B (gpu_ab/group_norm/README.md): build once, the group norm GPU tests on default and
# each APEX_GN_VARIANT (in parallel) with memcheck of each variant's kernels, then
# bench_group_norm.py --impls apex for default, each variant, default (drift shows).
# Usage (repo root): gpu_ab/group_norm/gpu_check.sh LOGDIR. Estimate: build ~50 s (six times the
# vector-path kernels), tests + memcheck <= 45 s (each process under `timeout`), bench ~6 s a
# process x 7: ~120-140 s.
set -u
LOG=${1:?usage: gpu_check.sh LOGDIR}
mkdir -p "$LOG"
export PYTHONPATH=$PWD:$PWD/compatibility APEX_CACHE_DIR=/tmp/cache_ab TORCH_CUDA_ARCH_LIST=9.0
TESTS=tests/apex/contrib/group_norm/test_group_norm.py
VARIANTS="pipe lean stream wide nocheck"
TEST_LIMIT=45  # seconds a test or memcheck process may run (a killed one shows as rc 124 below)

start=$(date +%s)
python3 -c "import torch, group_norm_cuda; from apex.contrib.group_norm import group_norm; \
print(group_norm(torch.randn(2, 8, 4, 4, device='cuda'), 2).sum().item(), 'built')" \
  > "$LOG/build.log" 2>&1 || { echo "BUILD FAILED"; tail -30 "$LOG/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"

# Tests: default takes the whole GPU suite; each variant skips what only the op layer (shared by the
# variants) decides, and the >2^31-element case (17 GB, ~10 s) runs under nocheck alone (stream's
# hints + the unchecked whole batches: every feature of the pipelined walk but wide's batch size).
# Memcheck of each variant's kernels beside them.
names=(); pids=()
timeout $TEST_LIMIT python3 -m pytest -m gpu -q -x -p no:cacheprovider $TESTS > "$LOG/tests_default.log" 2>&1 &
names+=(tests_default); pids+=($!)
for v in $VARIANTS; do
  skip="not opcheck and not compiles_with_fullgraph"
  [ "$v" = nocheck ] || skip="$skip and not int64"
  APEX_GN_VARIANT=$v timeout $TEST_LIMIT python3 -m pytest -m gpu -q -x -p no:cacheprovider $TESTS -k "$skip" \
    > "$LOG/tests_$v.log" 2>&1 &
  names+=(tests_$v); pids+=($!)
done
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for v in $VARIANTS; do
  APEX_GN_VARIANT=$v timeout $TEST_LIMIT "$SAN" --tool memcheck --error-exitcode 9 \
    python3 gpu_ab/group_norm/memcheck_case.py > "$LOG/memcheck_$v.log" 2>&1 &
  names+=(memcheck_$v); pids+=($!)
done
fail=0
for k in "${!pids[@]}"; do
  wait "${pids[$k]}"; rc=$?
  [ $rc = 0 ] || { fail=1; echo "${names[$k]}: rc $rc"; }
done
for f in "$LOG"/tests_*.log; do echo "$(basename "$f"): $(tail -1 "$f")"; done
for v in $VARIANTS; do
  echo "memcheck $v: $(grep -E 'ERROR SUMMARY|memcheck case done' "$LOG/memcheck_$v.log" | tr '\n' ' ')"
done
echo "tests + memcheck: $(( $(date +%s) - start )) s"
[ $fail = 0 ] || echo "SOME TESTS OR MEMCHECK FAILED (benching anyway)"

i=0
bench() {
  i=$((i + 1))
  echo "== $1" | tee "$LOG/bench_${i}_$1.log"
  APEX_GN_VARIANT=$1 python3 benchmarks/contrib/bench_group_norm.py --impls apex >> "$LOG/bench_${i}_$1.log" 2>&1
  grep -E "nhwc|nchw" "$LOG/bench_${i}_$1.log"
}
for v in default $VARIANTS default; do bench "$v"; done
echo "total: $(( $(date +%s) - start )) s"
