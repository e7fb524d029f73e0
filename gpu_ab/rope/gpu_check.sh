#!/bin/bash
# RoPE A/B (gpu_ab/rope/README.md): the RoPE GPU tests under default and APEX_ROPE_VARIANT=fast_path,
# memcheck of the fast-path kernels, ROCm apex's unchanged test_fused_rope.py under fast_path (when the
# tree has .upstream/rocm), then bench_rope.py --impls apex --dtypes bf16 for default, fast_path, default.
# Usage (repo root): gpu_ab/rope/gpu_check.sh LOGDIR. Estimate: build ~40 s, tests + memcheck + upstream
# suite ~50 s (in parallel), bench 3 x ~12 s: ~130 s.
set -u
LOG=${1:?usage: gpu_check.sh LOGDIR}
mkdir -p "$LOG"
export PYTHONPATH=$PWD:$PWD/compatibility APEX_CACHE_DIR=/tmp/cache_ab TORCH_CUDA_ARCH_LIST=9.0
TESTS=tests/apex/transformer/functional/test_fused_rope.py
VARIANTS="fast_path"
UPSTREAM=.upstream/rocm/tests/L0/run_transformer/test_fused_rope.py

start=$(date +%s)
# Build once (the variants are one library, chosen at run time).
python3 -c "import torch; from apex.transformer.functional import fused_apply_rotary_pos_emb as f; \
print(f(torch.randn(2, 1, 1, 8, device='cuda'), torch.randn(2, 1, 1, 8, device='cuda')).sum().item(), 'built')" \
  > "$LOG/build.log" 2>&1 || { echo "BUILD FAILED"; tail -30 "$LOG/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"

# The RoPE GPU tests on default and on each variant (opcheck and torch.compile check the op layer the
# variants share: default only), memcheck of each variant's kernels, the upstream suite: in parallel.
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
if [ -f "$UPSTREAM" ]; then
  # Unchanged, from its own directory, importing this tree's apex and compatibility modules.
  (cd "$(dirname "$UPSTREAM")" && APEX_ROPE_VARIANT=fast_path timeout 45 python3 "$(basename "$UPSTREAM")" -v) \
    > "$LOG/upstream_fast_path.log" 2>&1 & pids+=($!)
else
  echo "upstream suite: $UPSTREAM not in this tree, skipped" | tee "$LOG/upstream_fast_path.log"
fi
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
for f in "$LOG"/tests_*.log; do echo "$(basename "$f"): $(tail -1 "$f")"; done
for v in $VARIANTS; do echo "memcheck $v: $(grep -E 'ERROR SUMMARY|memcheck case done' "$LOG/memcheck_$v.log" | tr '\n' ' ')"; done
echo "upstream (fast_path): $(grep -E '^(OK|FAILED|Ran)|skipped' "$LOG/upstream_fast_path.log" | tr '\n' ' ')"
echo "tests + memcheck + upstream: $(( $(date +%s) - start )) s"
[ $fail = 0 ] || echo "SOME TESTS, MEMCHECK OR THE UPSTREAM SUITE FAILED (benching anyway)"

# Bench: one process a variant, the default first and last so drift shows.
i=0
for v in default $VARIANTS default; do
  i=$((i + 1))
  echo "== $v" | tee "$LOG/bench_${i}_$v.log"
  APEX_ROPE_VARIANT=$v python3 benchmarks/transformer/bench_rope.py --impls apex --dtypes bf16 \
    >> "$LOG/bench_${i}_$v.log" 2>&1
  cat "$LOG/bench_${i}_$v.log"
done
echo "total: $(( $(date +%s) - start )) s"
