#!/bin/bash
# RoPE A/B (gpu_ab/rope/README.md): GPU tests under every APEX_ROPE_VARIANT, memcheck of the new kernels,
# then bench_rope.py --impls apex --dtypes bf16 for default, flat, flat8, fasttrig, default (one process each).
# Usage (repo root): gpu_ab/rope/gpu_check.sh LOGDIR. Estimate: build 1.5-2.5 min, tests + memcheck ~1.5 min
# (in parallel), bench ~1.5 min.
set -u
LOG=${1:?usage: gpu_check.sh LOGDIR}
mkdir -p "$LOG"
export PYTHONPATH=$PWD:$PWD/compatibility APEX_CACHE_DIR=/tmp/cache_ab TORCH_CUDA_ARCH_LIST=9.0
TESTS=tests/apex/transformer/functional/test_fused_rope.py
VARIANTS="flat flat8 fasttrig"

start=$(date +%s)
# Build once (the variants are one library, chosen at run time).
python3 -c "import torch; from apex.transformer.functional import fused_apply_rotary_pos_emb as f; \
f(torch.randn(2, 1, 1, 8, device='cuda'), torch.randn(2, 1, 1, 8, device='cuda')); print('built')" \
  > "$LOG/build.log" 2>&1 || { echo "BUILD FAILED"; tail -30 "$LOG/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"

# Tests: the whole GPU suite on default; the kernel tests (not opcheck / torch.compile, which check the
# op layer the variants share) on each variant. All in parallel, with memcheck of each new kernel.
pids=()
python3 -m pytest -m gpu -q -x -p no:cacheprovider $TESTS > "$LOG/tests_default.log" 2>&1 & pids+=($!)
for v in $VARIANTS; do
  APEX_ROPE_VARIANT=$v python3 -m pytest -m gpu -q -x -p no:cacheprovider $TESTS \
    -k "not opcheck and not compiles_with_fullgraph" > "$LOG/tests_$v.log" 2>&1 & pids+=($!)
done
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for v in $VARIANTS; do
  APEX_ROPE_VARIANT=$v "$SAN" --tool memcheck --error-exitcode 9 python3 gpu_ab/rope/memcheck_case.py \
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
for v in default flat flat8 fasttrig default; do
  i=$((i + 1))
  echo "== $v" | tee "$LOG/bench_${i}_$v.log"
  APEX_ROPE_VARIANT=$v python3 benchmarks/transformer/bench_rope.py --impls apex --dtypes bf16 \
    >> "$LOG/bench_${i}_$v.log" 2>&1
  cat "$LOG/bench_${i}_$v.log"
done
echo "total: $(( $(date +%s) - start )) s"
exit $fail
