#!/bin/bash
# SwiGLU A/B (gpu_ab/swiglu/README.md): the SwiGLU GPU tests under each APEX_SWIGLU_VARIANT, memcheck of
# the new kernels, then bench_swiglu.py --impls apex (bf16) for default, flat, flat_pdl, flat_cs,
# default, and (time allowing) flat, flat_pdl, flat_cs, default again: the gaps are < 1 point.
# Usage (repo root): gpu_ab/swiglu/gpu_check.sh LOGDIR. Estimate: build ~30 s, tests + memcheck
# ~40 s (in parallel), bench ~10 s a process: ~140 s with the second round, which is skipped past 150 s.
set -u
LOG=${1:?usage: gpu_check.sh LOGDIR}
mkdir -p "$LOG"
export PYTHONPATH=$PWD:$PWD/compatibility APEX_CACHE_DIR=/tmp/cache_ab TORCH_CUDA_ARCH_LIST=9.0
TESTS=tests/apex/transformer/functional/test_fused_bias_swiglu.py
VARIANTS="flat flat_pdl flat_cs"
BUDGET=150

start=$(date +%s)
# Build once (the variants are one library, chosen at run time).
python3 -c "import torch; from apex.transformer.functional import fused_bias_swiglu as f; \
print(f(torch.randn(4, 16, device='cuda')).sum().item(), 'built')" \
  > "$LOG/build.log" 2>&1 || { echo "BUILD FAILED"; tail -30 "$LOG/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"

# Tests on default and each variant (opcheck and torch.compile check the op layer the variants
# share: default only), with memcheck of the new kernels (flat_cs takes all of them). In parallel.
pids=()
python3 -m pytest -m gpu -q -x -p no:cacheprovider $TESTS > "$LOG/tests_default.log" 2>&1 & pids+=($!)
for v in $VARIANTS; do
  APEX_SWIGLU_VARIANT=$v python3 -m pytest -m gpu -q -x -p no:cacheprovider $TESTS \
    -k "not opcheck and not compiles_with_fullgraph" > "$LOG/tests_$v.log" 2>&1 & pids+=($!)
done
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
APEX_SWIGLU_VARIANT=flat_cs "$SAN" --tool memcheck --error-exitcode 9 python3 gpu_ab/swiglu/memcheck_case.py \
  > "$LOG/memcheck_flat_cs.log" 2>&1 & pids+=($!)
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
for f in "$LOG"/tests_*.log; do echo "$(basename "$f"): $(tail -1 "$f")"; done
echo "memcheck flat_cs: $(grep -E 'ERROR SUMMARY|memcheck case done' "$LOG/memcheck_flat_cs.log" | tr '\n' ' ')"
echo "tests + memcheck: $(( $(date +%s) - start )) s"
[ $fail = 0 ] || echo "SOME TESTS OR MEMCHECK FAILED (benching anyway)"

# Bench: one process a variant, the default first and last of each round so drift shows.
i=0
bench() {
  i=$((i + 1))
  echo "== $1" | tee "$LOG/bench_${i}_$1.log"
  APEX_SWIGLU_VARIANT=$1 python3 benchmarks/transformer/bench_swiglu.py --impls apex --dtypes bf16 \
    >> "$LOG/bench_${i}_$1.log" 2>&1
  grep -E "^(bias-)?swiglu" "$LOG/bench_${i}_$1.log" | grep -v "max |apex.* ok$"
}
bench_start=$(date +%s)
for v in default $VARIANTS default; do bench "$v"; done
# A second round (4 processes) only if it fits the budget at the first round's pace (5 processes).
per=$(( ($(date +%s) - bench_start + 4) / 5 ))
if [ $(( $(date +%s) - start + 4 * per )) -le $BUDGET ]; then
  for v in $VARIANTS default; do bench "$v"; done
else
  echo "second bench round skipped: $(( $(date +%s) - start )) s so far, ~$per s a process, budget $BUDGET s"
fi
echo "total: $(( $(date +%s) - start )) s"
