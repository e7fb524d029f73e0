#!/bin/bash
# Softmax forward variants (APEX_SOFTMAX_VARIANT): build once, the softmax GPU tests under every
# variant (in parallel, beside compute-sanitizer memcheck of the new kernels), then the bench, one
# process per variant, default first and last. Usage: gpu_ab/softmax/gpu_check.sh LOGDIR (repo root
# as cwd). Estimated wall time: ~3.5 minutes (build ~1.5, tests ~1, bench 5 x ~15 s).
set -u
LOGDIR=${1:?usage: gpu_check.sh LOGDIR}
mkdir -p "$LOGDIR"
export PYTHONPATH=$PWD:$PWD/compatibility APEX_CACHE_DIR=/tmp/cache_ab TORCH_CUDA_ARCH_LIST=9.0
VARIANTS="keep tma tma_keep"
TESTS=tests/apex/transformer/functional/test_fused_softmax.py
# torch.compile and opcheck tests take long and see no kernel choice of their own.
SKIP="not compiles_with_fullgraph and not opcheck"

SANITIZER=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)

start=$SECONDS
python3 -c "from apex._ops import ops; ops('fused_softmax')" 2>&1 | tail -20 | tee "$LOGDIR/build.log"
echo "build: $((SECONDS - start)) s" | tee -a "$LOGDIR/times.log"

start=$SECONDS
pids=()
for v in default $VARIANTS; do
  APEX_SOFTMAX_VARIANT=$v python3 -m pytest -m gpu -q -x -p no:cacheprovider "$TESTS" -k "$SKIP" \
    > "$LOGDIR/test_$v.log" 2>&1 &
  pids+=($!)
done
for v in $VARIANTS; do
  APEX_SOFTMAX_VARIANT=$v "$SANITIZER" --tool memcheck --error-exitcode 1 \
    python3 gpu_ab/softmax/memcheck_cases.py > "$LOGDIR/memcheck_$v.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
for v in default $VARIANTS; do echo "tests $v: $(tail -1 "$LOGDIR/test_$v.log")"; done | tee -a "$LOGDIR/summary.log"
for v in $VARIANTS; do echo "memcheck $v: $(grep -E 'ERROR SUMMARY|worst' "$LOGDIR/memcheck_$v.log" | tr '\n' ' ')"; done \
  | tee -a "$LOGDIR/summary.log"
echo "tests + memcheck: $((SECONDS - start)) s" | tee -a "$LOGDIR/times.log"

start=$SECONDS
for v in default $VARIANTS default; do
  echo "== APEX_SOFTMAX_VARIANT=$v" | tee -a "$LOGDIR/bench.log"
  APEX_SOFTMAX_VARIANT=$v python3 benchmarks/transformer/bench_softmax.py --impls apex --dtypes bf16 2>&1 \
    | tee -a "$LOGDIR/bench.log"
done
echo "bench: $((SECONDS - start)) s" | tee -a "$LOGDIR/times.log"
