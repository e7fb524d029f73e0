#!/bin/bash
# Focal loss A/B (gpu_ab/focal/README.md): the focal GPU tests under the base kernels and under
# APEX_FOCAL_VARIANT=rows and rows_exp, memcheck of the rows kernels, then
# bench_focal_loss.py --impls apex (bf16 and fp32) for base, rows, rows_exp, base.
# Usage (repo root): gpu_ab/focal/gpu_check.sh LOGDIR. Estimate: build ~30 s, tests + memcheck ~40 s
# (in parallel), bench 4 x ~15 s: ~130 s.
set -u
LOG=${1:?usage: gpu_check.sh LOGDIR}
mkdir -p "$LOG"
export PYTHONPATH=$PWD:$PWD/compatibility APEX_CACHE_DIR=/tmp/cache_ab TORCH_CUDA_ARCH_LIST=9.0
TESTS=tests/apex/contrib/focal_loss/test_focal_loss.py
VARIANTS="rows rows_exp"

start=$(date +%s)
# Build once (the variants are one library, chosen at run time).
python3 -c "import torch, focal_loss_cuda; print('built')" > "$LOG/build.log" 2>&1 \
  || { echo "BUILD FAILED"; tail -30 "$LOG/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"

# The focal GPU tests on the base kernels and on each variant (opcheck and torch.compile check the op
# layer the variants share: base only), memcheck of each variant's kernels: all in parallel.
pids=()
timeout 60 python3 -m pytest -m gpu -q -x -p no:cacheprovider $TESTS > "$LOG/tests_base.log" 2>&1 & pids+=($!)
for v in $VARIANTS; do
  APEX_FOCAL_VARIANT=$v timeout 60 python3 -m pytest -m gpu -q -x -p no:cacheprovider $TESTS \
    -k "not opcheck and not compiles_with_fullgraph" > "$LOG/tests_$v.log" 2>&1 & pids+=($!)
done
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for v in $VARIANTS; do
  APEX_FOCAL_VARIANT=$v timeout 60 "$SAN" --tool memcheck --error-exitcode 9 python3 gpu_ab/focal/memcheck_case.py \
    > "$LOG/memcheck_$v.log" 2>&1 & pids+=($!)
done
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
for f in "$LOG"/tests_*.log; do echo "$(basename "$f"): $(tail -1 "$f")"; done
for v in $VARIANTS; do echo "memcheck $v: $(grep -E 'ERROR SUMMARY|memcheck case done' "$LOG/memcheck_$v.log" | tr '\n' ' ')"; done
echo "tests + memcheck: $(( $(date +%s) - start )) s"
[ $fail = 0 ] || echo "SOME TESTS OR MEMCHECK FAILED (benching anyway)"

# Bench: one process a variant, the base first and last so drift shows.
i=0
for v in base $VARIANTS base; do
  i=$((i + 1))
  echo "== $v" | tee "$LOG/bench_${i}_$v.log"
  APEX_FOCAL_VARIANT=$v python3 benchmarks/contrib/bench_focal_loss.py --impls apex >> "$LOG/bench_${i}_$v.log" 2>&1
  cat "$LOG/bench_${i}_$v.log"
done
echo "total: $(( $(date +%s) - start )) s"
