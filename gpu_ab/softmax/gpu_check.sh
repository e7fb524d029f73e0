#!/bin/bash
# Softmax A/B (gpu_ab/softmax/README.md): the long-row GPU tests under each APEX_SOFTMAX_VARIANT (the
# new one-kept-column test first), memcheck of each variant's kernels, then
# bench_softmax.py --impls apex --dtypes bf16 for default, wide, wide2, default (one process each).
# Usage (repo root): gpu_check.sh LOGDIR. Estimate: build ~30 s, tests + memcheck ~45 s (in parallel,
# each capped at 75 s), bench ~4 x 12 s: ~125 s.
set -u
LOG=${1:?usage: gpu_check.sh LOGDIR}
mkdir -p "$LOG"
export PYTHONPATH=$PWD:$PWD/compatibility APEX_CACHE_DIR=/tmp/cache_ab TORCH_CUDA_ARCH_LIST=9.0
TESTS=tests/apex/transformer/functional/test_fused_softmax.py
VARIANTS="wide wide2"

start=$(date +%s)
python3 -c "from apex._ops import ops; ops('fused_softmax'); print('built')" > "$LOG/build.log" 2>&1 \
  || { echo "BUILD FAILED"; tail -30 "$LOG/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"

# The tests reaching the row kernel without a causal bound (all the variants change), new one first,
# under every variant (default too: the new test covers the default kernel). Memcheck of each variant.
pids=()
for v in default $VARIANTS; do
  APEX_SOFTMAX_VARIANT=$v timeout 75 python3 -m pytest -m gpu -q -x -p no:cacheprovider \
    "$TESTS::test_long_rows_one_kept_column" "$TESTS::test_long_rows_at_row_kernel_thresholds" \
    "$TESTS::test_long_rows_few_rows_per_block_two_heads" "$TESTS::test_long_rows_ragged_chunks_and_many_mask_rows" \
    > "$LOG/tests_$v.log" 2>&1 & pids+=($!)
done
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for v in $VARIANTS; do
  APEX_SOFTMAX_VARIANT=$v timeout 75 "$SAN" --tool memcheck --error-exitcode 9 python3 gpu_ab/softmax/memcheck_case.py \
    > "$LOG/memcheck_$v.log" 2>&1 & pids+=($!)
done
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
for f in "$LOG"/tests_*.log; do echo "$(basename "$f"): $(tail -1 "$f")"; done
for v in $VARIANTS; do echo "memcheck $v: $(grep -E 'ERROR SUMMARY|memcheck case done' "$LOG/memcheck_$v.log" | tr '\n' ' ')"; done
echo "tests + memcheck: $(( $(date +%s) - start )) s"
[ $fail = 0 ] || echo "SOME TESTS OR MEMCHECK FAILED OR TIMED OUT (benching anyway)"

# Bench: one process a variant, the default first and last so drift shows.
i=0
for v in default $VARIANTS default; do
  i=$((i + 1))
  echo "== $v" | tee "$LOG/bench_${i}_$v.log"
  APEX_SOFTMAX_VARIANT=$v timeout 40 python3 benchmarks/transformer/bench_softmax.py --impls apex --dtypes bf16 \
    >> "$LOG/bench_${i}_$v.log" 2>&1
  cat "$LOG/bench_${i}_$v.log"
done
echo "total: $(( $(date +%s) - start )) s"
exit $fail
