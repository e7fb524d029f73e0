#!/bin/bash
# Focal loss A/B (gpu_ab/focal/README.md): GPU tests under each APEX_FOCAL_VARIANT, memcheck of the
# lean kernels, then bench_focal_loss.py --impls apex --dtypes bf16 for default, lean, lean_bwd, default
# (one process each).
# Usage (repo root): gpu_ab/focal/gpu_check.sh LOGDIR. Estimate: build ~1 min, tests + memcheck ~1 min
# (in parallel), bench ~30 s: under 3 minutes.
set -u
LOG=${1:?usage: gpu_check.sh LOGDIR}
mkdir -p "$LOG"
export PYTHONPATH=$PWD:$PWD/compatibility APEX_CACHE_DIR=/tmp/cache_ab TORCH_CUDA_ARCH_LIST=9.0
TESTS=tests/apex/contrib/focal_loss/test_focal_loss.py
VARIANTS="lean lean_bwd"
# lean runs both lean kernels, lean_bwd only the backward one: memcheck of lean covers both.
MEMCHECK="lean"

start=$(date +%s)
# Build once (the variants are one library, chosen at run time).
python3 -c "import torch; from apex.contrib.focal_loss import focal_loss as f; \
print(f.focal_loss(torch.randn(4, 8, device='cuda'), torch.zeros(4, dtype=torch.long, device='cuda'), \
torch.ones(1, device='cuda'), 8, 0.25, 2.0).item(), 'built')" \
  > "$LOG/build.log" 2>&1 || { echo "BUILD FAILED"; tail -30 "$LOG/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"

# Tests: the whole GPU suite on default and on each variant (the kernels' tests; opcheck and
# torch.compile check the op layer the variants share, so they run on default only), with memcheck
# of each variant's kernels. All in parallel.
pids=()
python3 -m pytest -m gpu -q -x -p no:cacheprovider $TESTS > "$LOG/tests_default.log" 2>&1 & pids+=($!)
for v in $VARIANTS; do
  APEX_FOCAL_VARIANT=$v python3 -m pytest -m gpu -q -x -p no:cacheprovider $TESTS \
    -k "not opcheck and not compiles_with_fullgraph" > "$LOG/tests_$v.log" 2>&1 & pids+=($!)
done
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for v in $MEMCHECK; do
  APEX_FOCAL_VARIANT=$v "$SAN" --tool memcheck --error-exitcode 9 python3 gpu_ab/focal/memcheck_case.py \
    > "$LOG/memcheck_$v.log" 2>&1 & pids+=($!)
done
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
for f in "$LOG"/tests_*.log; do echo "$(basename "$f"): $(tail -1 "$f")"; done
for v in $MEMCHECK; do echo "memcheck $v: $(grep -E 'ERROR SUMMARY|memcheck case done' "$LOG/memcheck_$v.log" | tr '\n' ' ')"; done
echo "tests + memcheck: $(( $(date +%s) - start )) s"
[ $fail = 0 ] || echo "SOME TESTS OR MEMCHECK FAILED (benching anyway)"

# Bench: one process a variant
# (bf16: fp32 takes the same kernels under every variant), the default first and last so drift shows.
i=0
for v in default $VARIANTS default; do
  i=$((i + 1))
  echo "== $v" | tee "$LOG/bench_${i}_$v.log"
  APEX_FOCAL_VARIANT=$v python3 benchmarks/contrib/bench_focal_loss.py --impls apex --dtypes bf16 \
    >> "$LOG/bench_${i}_$v.log" 2>&1
  cat "$LOG/bench_${i}_$v.log"
done
echo "total: $(( $(date +%s) - start )) s"
exit $fail
