#!/bin/bash
# index_mul_2d A/B (gpu_ab/index_mul/README.md): the tests of the variants' new edges first, then the
# backward tests, on default and on keys16_deep (which runs both new code paths), memcheck of
# keys16_deep's kernels, then bench_index_mul_2d.py --impls apex for default, keys16, deep,
# keys16_deep, default (one process each).
# Usage (repo root): gpu_check.sh LOGDIR. Estimate: build ~30 s, tests + memcheck ~35 s (capped at
# 45 s, in parallel), bench ~10 s a process: ~115 s.
set -u
LOG=${1:?usage: gpu_check.sh LOGDIR}
mkdir -p "$LOG"
export PYTHONPATH=$PWD:$PWD/compatibility APEX_CACHE_DIR=/tmp/cache_ab TORCH_CUDA_ARCH_LIST=9.0
TESTS=tests/apex/contrib/index_mul_2d/test_index_mul_2d.py
FIRST="piece_lengths or sources_at_16_bits"
THEN="backward and not piece_lengths and not sources_at_16_bits and not opcheck and not compiles"

start=$(date +%s)
python3 -c "import torch; from apex._ops import ops; l = ops('fused_index_mul_2d'); \
print(l.index_mul_2d_backward(torch.ones(4, 8, device='cuda'), torch.ones(2, 8, device='cuda'), \
torch.ones(4, 8, device='cuda'), torch.zeros(4, dtype=torch.long, device='cuda'))[0].sum().item(), 'built')" \
  > "$LOG/build.log" 2>&1 || { echo "BUILD FAILED"; tail -30 "$LOG/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"

# The new edges' tests first, then the other backward tests, under a 45 s cap a variant.
pids=()
export TESTS FIRST THEN
for v in default keys16_deep; do
  APEX_INDEX_MUL_VARIANT=$v timeout 45 bash -c 'python3 -m pytest -m gpu -q -x -p no:cacheprovider $TESTS -k "$FIRST"; \
first=$?; python3 -m pytest -m gpu -q -x -p no:cacheprovider $TESTS -k "$THEN"; exit $(( $? | first ))' \
    > "$LOG/tests_$v.log" 2>&1 & pids+=($!)
done
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
APEX_INDEX_MUL_VARIANT=keys16_deep timeout 45 "$SAN" --tool memcheck --error-exitcode 9 \
  python3 gpu_ab/index_mul/memcheck_case.py > "$LOG/memcheck_keys16_deep.log" 2>&1 & pids+=($!)
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
for f in "$LOG"/tests_*.log; do echo "$(basename "$f"): $(grep -E 'passed|failed|error' "$f" | tr '\n' ' ')"; done
echo "memcheck keys16_deep: $(grep -E 'ERROR SUMMARY|memcheck case done' "$LOG/memcheck_keys16_deep.log" | tr '\n' ' ')"
echo "tests + memcheck: $(( $(date +%s) - start )) s"
[ $fail = 0 ] || echo "SOME TESTS OR MEMCHECK FAILED OR TIMED OUT (rc 124 = the 45 s cap; benching anyway)"

# Bench: one process a variant, the default first and last so drift shows.
i=0
for v in default keys16 deep keys16_deep default; do
  i=$((i + 1))
  echo "== $v" | tee "$LOG/bench_${i}_$v.log"
  APEX_INDEX_MUL_VARIANT=$v python3 benchmarks/contrib/bench_index_mul_2d.py --impls apex >> "$LOG/bench_${i}_$v.log" 2>&1
  cat "$LOG/bench_${i}_$v.log"
done
echo "total: $(( $(date +%s) - start )) s"
exit $fail
