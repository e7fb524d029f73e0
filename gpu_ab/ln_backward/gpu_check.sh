#!/bin/bash
# LayerNorm / RMSNorm backward launch-shape A/B (APEX_LN_BWD_VARIANT: default, tworows, rowbar, wide).
# usage (repo root, GPU host): gpu_ab/ln_backward/gpu_check.sh LOGDIR      estimate: ~3.5 min wall
set -u
LOG=${1:?usage: gpu_check.sh LOGDIR}
mkdir -p "$LOG"
export PYTHONPATH=$PWD:$PWD/compatibility APEX_CACHE_DIR=/tmp/cache_ab TORCH_CUDA_ARCH_LIST=9.0 CUDA_VISIBLE_DEVICES=0
VARIANTS="default tworows rowbar wide"
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
T=tests/apex/normalization
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$LOG/summary.txt"; }

# 1. Build once (every later process loads it from the cache).
stamp build
python3 -c "from apex._ops import ops; ops('fused_layer_norm_cuda')" >"$LOG/build.txt" 2>&1 || { stamp "BUILD FAILED"; tail -30 "$LOG/build.txt"; exit 1; }

# 2. Backward-relevant GPU tests under each variant: 2 file subsets per variant, all 8 in parallel.
stamp tests
pids=()
for v in $VARIANTS; do
  env_v=$([ "$v" = default ] && echo "" || echo "$v")
  APEX_LN_BWD_VARIANT=$env_v python3 -m pytest -m gpu -q -x -p no:cacheprovider \
    $T/test_backward_variants.py $T/test_backward_kernels.py >"$LOG/tests_${v}_kernels.txt" 2>&1 &
  pids+=($!)
  APEX_LN_BWD_VARIANT=$env_v python3 -m pytest -m gpu -q -x -p no:cacheprovider \
    $T/test_fused_layer_norm.py $T/test_norm_autograd.py $T/test_norm_edge_cases.py \
    $T/test_fused_layer_norm_cuda_module.py >"$LOG/tests_${v}_modules.txt" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
for f in "$LOG"/tests_*.txt; do stamp "$(basename "$f" .txt): $(tail -1 "$f")"; done

# 3. compute-sanitizer (memcheck; racecheck and synccheck for the named barriers / two-row scratch) on small
#    cases of every new kernel instance: bf16 and fp16, LayerNorm and RMSNorm, the variants' edge shapes.
stamp sanitizer
cat >"$LOG/sanitize_case.py" <<'PY'
import sys, torch
sys.path.insert(0, "tests/apex/normalization")
from test_backward_kernels import check_backward
for dtype in (torch.bfloat16, torch.float16):
    for rms in (False, True):
        for rows, cols in [(3, 512), (5, 1024), (3, 4096), (3, 5120), (3, 8192), (2, 12296), (3, 16384)]:
            x = torch.randn(rows, cols, dtype=torch.float64).to("cuda", dtype)
            check_backward(x, dtype, rms, "weight" if rms else "weight_bias")
torch.cuda.synchronize()
print("ok")
PY
pids=()
for v in tworows rowbar wide; do
  for tool in memcheck racecheck synccheck; do
    APEX_LN_BWD_VARIANT=$v "$SAN" --tool $tool --error-exitcode 9 --kernel-name kns=backward_fused \
      python3 "$LOG/sanitize_case.py" >"$LOG/sanitizer_${v}_${tool}.txt" 2>&1 &
    pids+=($!)
  done
done
for p in "${pids[@]}"; do wait "$p"; done
for f in "$LOG"/sanitizer_*.txt; do stamp "$(basename "$f" .txt): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^ok|Error' "$f" | tr '\n' ' ')"; done

# 4. Bench, one process per variant, the default first and last (drift).
stamp bench
for run in default_first tworows rowbar wide default_last; do
  env_v=$run; [ "${run%%_*}" = default ] && env_v=""
  APEX_LN_BWD_VARIANT=$env_v python3 benchmarks/normalization/bench_norms.py --kinds layer rms --dtypes bf16 \
    --impls apex >"$LOG/bench_$run.txt" 2>&1
  stamp "bench_$run (APEX_LN_BWD_VARIANT='$env_v') done"
done
stamp "all done"
