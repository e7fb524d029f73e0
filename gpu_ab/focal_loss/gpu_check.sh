#!/bin/bash
# Focal loss A/B, APEX_FOCAL_VARIANT=half2 / half2_occ (gpu_ab/focal_loss/README.md): build once; the
# new range tests (test_bf16_gradient_ranges) under half2 and half2_occ FIRST; then in parallel the
# existing focal GPU tests under half2 and under half2_occ, the range tests under default, and memcheck
# of a small bf16 backward under each variant; then bench_focal_loss.py --impls apex --dtypes bf16 for
# default, half2, half2_occ, default (one process each; drift shows).
# Usage (repo root): gpu_ab/focal_loss/gpu_check.sh LOGDIR. Estimate: build ~30-40 s, range tests
# ~10 s, parallel tests + memcheck ~30 s (capped at 50), bench 4 x ~10 s: ~120 s, at most ~145 s.
set -u
LOG=${1:?usage: gpu_check.sh LOGDIR}
mkdir -p "$LOG"
export PYTHONPATH=$PWD:$PWD/compatibility APEX_CACHE_DIR=/tmp/cache_ab TORCH_CUDA_ARCH_LIST=9.0
TESTS=tests/apex/contrib/focal_loss/test_focal_loss.py
PYTEST="python3 -m pytest -m gpu -q -x -p no:cacheprovider"
NEW="gradient_ranges"
# The op layer (opcheck, torch.compile) is the variants' and the default's alike.
OLD="not gradient_ranges and not opcheck and not compiles_with_fullgraph"

start=$(date +%s)
python3 -c "import torch, focal_loss_cuda; print('built')" > "$LOG/build.log" 2>&1 \
  || { echo "BUILD FAILED"; tail -30 "$LOG/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"

fail=0
pids=()
for v in half2 half2_occ; do
  APEX_FOCAL_VARIANT=$v timeout 40 $PYTEST $TESTS -k "$NEW" > "$LOG/tests_new_$v.log" 2>&1 & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || fail=1; done
for v in half2 half2_occ; do echo "tests_new_$v: $(tail -1 "$LOG/tests_new_$v.log")"; done
echo "new tests: $(( $(date +%s) - start )) s"

pids=()
for v in half2 half2_occ; do
  APEX_FOCAL_VARIANT=$v timeout 50 $PYTEST $TESTS -k "$OLD" > "$LOG/tests_old_$v.log" 2>&1 & pids+=($!)
done
timeout 50 $PYTEST $TESTS -k "$NEW" > "$LOG/tests_new_default.log" 2>&1 & pids+=($!)
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for v in half2 half2_occ; do
  APEX_FOCAL_VARIANT=$v timeout 50 "$SAN" --tool memcheck --error-exitcode 9 \
    python3 gpu_ab/focal_loss/memcheck_case.py > "$LOG/memcheck_$v.log" 2>&1 & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || fail=1; done
for t in old_half2 old_half2_occ new_default; do echo "tests_$t: $(tail -1 "$LOG/tests_$t.log")"; done
for v in half2 half2_occ; do
  echo "memcheck $v: $(grep -E 'ERROR SUMMARY|memcheck case done' "$LOG/memcheck_$v.log" | tr '\n' ' ')"
done
echo "tests + memcheck: $(( $(date +%s) - start )) s (a timeout shows as exit 124 and no summary line)"
[ $fail = 0 ] || echo "SOME TESTS OR MEMCHECK FAILED OR TIMED OUT (benching anyway)"

i=0
for v in default half2 half2_occ default; do
  i=$((i + 1))
  echo "== $v" | tee "$LOG/bench_${i}_$v.log"
  APEX_FOCAL_VARIANT=$v timeout 25 python3 benchmarks/contrib/bench_focal_loss.py --impls apex --dtypes bf16 \
    >> "$LOG/bench_${i}_$v.log" 2>&1
  grep -E "bf16|copy|apex" "$LOG/bench_${i}_$v.log"
done
echo "total: $(( $(date +%s) - start )) s"
