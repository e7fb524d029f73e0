#!/bin/bash
# LayerNorm / RMSNorm A/B (APEX_LN_VARIANT: default, pdl, balanced, packed; see README.md).
# usage (repo root, GPU host): gpu_ab/ln/gpu_check.sh LOGDIR      estimate: ~140 s wall
set -u
LOG=${1:?usage: gpu_check.sh LOGDIR}
mkdir -p "$LOG"
export PYTHONPATH=$PWD:$PWD/compatibility APEX_CACHE_DIR=/tmp/cache_ab TORCH_CUDA_ARCH_LIST=9.0
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
T=tests/apex/normalization
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$LOG/summary.txt"; }

# 1. Build once (every later process loads it from the cache).
stamp build
python3 -c "from apex._ops import ops; ops('fused_layer_norm_cuda')" >"$LOG/build.txt" 2>&1 || { stamp "BUILD FAILED"; tail -30 "$LOG/build.txt"; exit 1; }

# 2. GPU tests of each variant's paths, and compute-sanitizer memcheck on small cases of the new
#    kernels / launches, all in parallel.
stamp "tests + memcheck"
PYT="python3 -m pytest -m gpu -q -x -p no:cacheprovider"
pids=()
APEX_LN_VARIANT= $PYT $T/test_ln_variants.py >"$LOG/tests_default.txt" 2>&1 & pids+=($!)
APEX_LN_VARIANT=pdl $PYT $T/test_ln_variants.py $T/test_backward_kernels.py $T/test_norm_autograd.py \
  >"$LOG/tests_pdl.txt" 2>&1 & pids+=($!)
APEX_LN_VARIANT=balanced $PYT $T/test_ln_variants.py $T/test_backward_kernels.py $T/test_backward_launch_shapes.py \
  -k "not dependent" >"$LOG/tests_balanced.txt" 2>&1 & pids+=($!)
APEX_LN_VARIANT=packed $PYT $T/test_forward_many_rows_cuda.py $T/test_ln_variants.py -k "float16 or dependent" \
  >"$LOG/tests_packed.txt" 2>&1 & pids+=($!)
cat >"$LOG/sanitize_case.py" <<'PY'
import sys, torch
sys.path.insert(0, "tests/apex/normalization")
from apex.normalization import FusedLayerNorm, FusedRMSNorm
for dtype in (torch.bfloat16, torch.float16):
    for module in (FusedLayerNorm, FusedRMSNorm):
        # forward widths: one warp, several, ragged (1000, 5120), 8 vectors a thread (32768); backward:
        # rows just past a round of 132 SMs (balanced), then the chain of dependent launches (pdl)
        for rows, cols in [(5, 1000), (9, 1024), (3, 5120), (2, 32768), (1981, 1024), (133, 16384)]:
            norm = module(cols).to("cuda", dtype)
            x = torch.randn(rows, cols, device="cuda", dtype=dtype, requires_grad=True)
            torch.autograd.grad(norm(norm(x)).float().square().sum(), [x, *norm.parameters()])
torch.cuda.synchronize()
print("ok")
PY
for v in pdl balanced packed; do
  APEX_LN_VARIANT=$v "$SAN" --tool memcheck --error-exitcode 9 python3 "$LOG/sanitize_case.py" \
    >"$LOG/memcheck_$v.txt" 2>&1 & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
for f in "$LOG"/tests_*.txt; do stamp "$(basename "$f" .txt): $(tail -1 "$f")"; done
for f in "$LOG"/memcheck_*.txt; do stamp "$(basename "$f" .txt): $(grep -E 'ERROR SUMMARY|^ok' "$f" | tr '\n' ' ')"; done

# 3. Bench, one process per variant, the default first and last (drift).
stamp bench
for run in default_first pdl balanced packed default_last; do
  v=$run; [ "${run%%_*}" = default ] && v=""
  APEX_LN_VARIANT=$v python3 benchmarks/normalization/bench_norms.py --kinds layer rms --dtypes bf16 \
    --impls apex >"$LOG/bench_$run.txt" 2>&1
  stamp "bench_$run (APEX_LN_VARIANT='$v') done"
done
stamp "all done"
