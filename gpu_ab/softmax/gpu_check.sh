#!/bin/bash
# Softmax A/B (gpu_ab/softmax/README.md): the long-row GPU tests under each APEX_SOFTMAX_VARIANT,
# memcheck of row_forward_ahead, then bench_softmax.py --impls apex --dtypes bf16 for default, ahead,
# ahead512, default (one process each).
# Usage (repo root): gpu_ab/softmax/gpu_check.sh LOGDIR. Estimate: build ~30 s, tests + memcheck
# ~50 s (in parallel), bench ~4 x 12 s: ~130 s.
set -u
LOG=${1:?usage: gpu_check.sh LOGDIR}
mkdir -p "$LOG"
export PYTHONPATH=$PWD:$PWD/compatibility APEX_CACHE_DIR=/tmp/cache_ab TORCH_CUDA_ARCH_LIST=9.0
TESTS=tests/apex/transformer/functional/test_fused_softmax.py
VARIANTS="ahead ahead512"

start=$(date +%s)
python3 -c "from apex._ops import ops; ops('fused_softmax'); print('built')" > "$LOG/build.log" 2>&1 \
  || { echo "BUILD FAILED"; tail -30 "$LOG/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"

# The tests reaching the row kernel (long rows: the only kernel the variants change), under each
# variant; the new test under default too. Memcheck of each variant. All in parallel.
pids=()
python3 -m pytest -m gpu -q -x -p no:cacheprovider $TESTS -k "few_rows_per_block" \
  > "$LOG/tests_default.log" 2>&1 & pids+=($!)
for v in $VARIANTS; do
  APEX_SOFTMAX_VARIANT=$v python3 -m pytest -m gpu -q -x -p no:cacheprovider $TESTS \
    -k "long_rows or mask_shared_by_heads or far_negative or every_width or broadcast_masks or fully_masked" \
    > "$LOG/tests_$v.log" 2>&1 & pids+=($!)
done
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for v in $VARIANTS; do
  APEX_SOFTMAX_VARIANT=$v "$SAN" --tool memcheck --error-exitcode 9 python3 gpu_ab/softmax/memcheck_case.py \
    > "$LOG/memcheck_$v.log" 2>&1 & pids+=($!)
done
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
for f in "$LOG"/tests_*.log; do echo "$(basename "$f"): $(tail -1 "$f")"; done
for v in $VARIANTS; do echo "memcheck $v: $(grep -E 'ERROR SUMMARY|memcheck case done' "$LOG/memcheck_$v.log" | tr '\n' ' ')"; done
echo "tests + memcheck: $(( $(date +%s) - start )) s"
[ $fail = 0 ] || echo "SOME TESTS OR MEMCHECK FAILED (benching anyway)"

# Bench: one process a variant, the default first and last so drift shows.
i=0
for v in default $VARIANTS default; do
  i=$((i + 1))
  echo "== $v" | tee "$LOG/bench_${i}_$v.log"
  APEX_SOFTMAX_VARIANT=$v python3 benchmarks/transformer/bench_softmax.py --impls apex --dtypes bf16 \
    >> "$LOG/bench_${i}_$v.log" 2>&1
  cat "$LOG/bench_${i}_$v.log"
done
echo "total: $(( $(date +%s) - start )) s"
exit $fail
