#!/bin/bash
# LayerNorm / RMSNorm backward A/B: APEX_LN_VARIANT=spread and =pairfold against the default (README.md).
# usage (repo root, GPU host): gpu_ab/ln/gpu_check.sh LOGDIR      estimate: ~110 s wall
set -u
LOG=${1:?usage: gpu_check.sh LOGDIR}
mkdir -p "$LOG"
export PYTHONPATH=$PWD:$PWD/compatibility APEX_CACHE_DIR=/tmp/cache_ab TORCH_CUDA_ARCH_LIST=9.0
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
T=tests/apex/normalization
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$LOG/summary.txt"; }

# 1. Build once (~21 s cold on 16 cores; every later process loads it from the cache).
stamp build
python3 -c "from apex._ops import ops; ops('fused_layer_norm_cuda')" >"$LOG/build.txt" 2>&1 || { stamp "BUILD FAILED"; tail -30 "$LOG/build.txt"; exit 1; }

# 2. In parallel, capped at 35 s each (~180 tests): the grid-edge tests (first in the file: the
#    variants' new boundaries, bitwise repeatability), the persistent grid's last rounds and the
#    repeatability tests, under each variant and the default; memcheck of a small fwd+bwd under both
#    variants at once.
stamp "tests + memcheck"
PYT="timeout 35 python3 -m pytest -m gpu -q -x -p no:cacheprovider"
pids=()
for v in spread pairfold default; do
  APEX_LN_VARIANT=${v#default} $PYT $T/test_backward_launch_shapes.py $T/test_backward_kernels.py \
    -k "grid_edges or rows_past_a_round or repeatable" >"$LOG/tests_$v.txt" 2>&1 & pids+=($!)
done
cat >"$LOG/sanitize_case.py" <<'PY'
import torch
from apex.normalization import FusedLayerNorm, FusedRMSNorm
for dtype in (torch.bfloat16, torch.float32):
    for module in (FusedLayerNorm, FusedRMSNorm):
        # one block, an odd grid, 15 slots over 3 blocks, 2 slots, one slot of 16384 (prefetching)
        for rows, cols in [(1, 1024), (31, 1024), (3, 16384), (263, 8192), (133, 4096)]:
            norm = module(cols).to("cuda", dtype)
            x = torch.randn(rows, cols, device="cuda", dtype=dtype, requires_grad=True)
            torch.autograd.grad(norm(x).float().square().sum(), [x, *norm.parameters()])
torch.cuda.synchronize()
print("ok")
PY
APEX_LN_VARIANT=spread+pairfold timeout 60 "$SAN" --tool memcheck --error-exitcode 9 python3 "$LOG/sanitize_case.py" \
  >"$LOG/memcheck_both.txt" 2>&1 & pids+=($!)
for p in "${pids[@]}"; do wait "$p"; done
for f in "$LOG"/tests_*.txt; do stamp "$(basename "$f" .txt): $(tail -1 "$f")"; done
stamp "memcheck_both: $(grep -E 'ERROR SUMMARY|^ok' "$LOG/memcheck_both.txt" | tr '\n' ' ')"

# 3. Bench, one process per variant, the default first and last (drift); compare GB/s, not % of copy.
stamp bench
for run in default_first spread pairfold default_last; do
  v=$run; [ "${run%%_*}" = default ] && v=""
  APEX_LN_VARIANT=$v python3 benchmarks/normalization/bench_norms.py --kinds layer rms --dtypes bf16 \
    --impls apex >"$LOG/bench_$run.txt" 2>&1
  stamp "bench_$run (APEX_LN_VARIANT='$v') done"
done
stamp "all done"
