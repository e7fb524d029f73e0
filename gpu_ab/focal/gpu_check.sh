#!/bin/bash
# Focal loss A/B (gpu_ab/focal/README.md): the 16-bit forward with one correction a row,
# APEX_FOCAL_VARIANT=fix_fwd / fix_fwd_occ. GPU tests under each variant (the new positive-placement
# test first, then the focal suite without opcheck / torch.compile, which check the op layer the
# variants share), memcheck of the new kernel, then bench_focal_loss.py --impls apex for
# default, fix_fwd, fix_fwd_occ, default (one process each, bf16 and fp32; fp32 is unchanged by the
# switch: a drift check).
# Usage (repo root): gpu_ab/focal/gpu_check.sh LOGDIR. Estimate: build ~25 s, tests + memcheck
# ~40 s (in parallel, capped at 75 s), bench ~4 x 12 s: ~2 minutes.
set -u
LOG=${1:?usage: gpu_check.sh LOGDIR}
mkdir -p "$LOG"
export PYTHONPATH=$PWD:$PWD/compatibility APEX_CACHE_DIR=/tmp/cache_ab TORCH_CUDA_ARCH_LIST=9.0
TESTS=tests/apex/contrib/focal_loss/test_focal_loss.py
NEW="test_16_bit_positive_in_every_place"
VARIANTS="fix_fwd fix_fwd_occ"

start=$(date +%s)
python3 -c "import torch; from apex.contrib.focal_loss import focal_loss as f; \
print(f.focal_loss(torch.randn(4, 8, device='cuda'), torch.zeros(4, dtype=torch.long, device='cuda'), \
torch.ones(1, device='cuda'), 8, 0.25, 2.0).item(), 'built')" \
  > "$LOG/build.log" 2>&1 || { echo "BUILD FAILED"; tail -30 "$LOG/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"

# Per variant: the new test first (its own pytest run, so a time cap cannot skip it), then the rest.
pids=()
for v in default $VARIANTS; do
  ( APEX_FOCAL_VARIANT=$v timeout 75 python3 -m pytest -m gpu -q -x -p no:cacheprovider $TESTS -k "$NEW" \
      > "$LOG/tests_new_$v.log" 2>&1 || exit 1
    APEX_FOCAL_VARIANT=$v timeout 60 python3 -m pytest -m gpu -q -x -p no:cacheprovider $TESTS \
      -k "not $NEW and not opcheck and not compiles_with_fullgraph" > "$LOG/tests_rest_$v.log" 2>&1 ) & pids+=($!)
done
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for v in $VARIANTS; do
  APEX_FOCAL_VARIANT=$v timeout 75 "$SAN" --tool memcheck --error-exitcode 9 python3 gpu_ab/focal/memcheck_case.py \
    > "$LOG/memcheck_$v.log" 2>&1 & pids+=($!)
done
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
for f in "$LOG"/tests_*.log; do echo "$(basename "$f"): $(tail -1 "$f")"; done
for v in $VARIANTS; do echo "memcheck $v: $(grep -E 'ERROR SUMMARY|memcheck case done' "$LOG/memcheck_$v.log" | tr '\n' ' ')"; done
echo "tests + memcheck: $(( $(date +%s) - start )) s"
[ $fail = 0 ] || echo "SOME TESTS OR MEMCHECK FAILED (benching anyway)"

i=0
for v in default $VARIANTS default; do
  i=$((i + 1))
  echo "== $v" | tee "$LOG/bench_${i}_$v.log"
  APEX_FOCAL_VARIANT=$v timeout 40 python3 benchmarks/contrib/bench_focal_loss.py --impls apex \
    >> "$LOG/bench_${i}_$v.log" 2>&1
  cat "$LOG/bench_${i}_$v.log"
done
echo "total: $(( $(date +%s) - start )) s"
exit $fail
