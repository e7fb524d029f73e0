#!/bin/bash
# LayerNorm / RMSNorm A/B (APEX_LN_VARIANT=packed against the default; see README.md).
# usage (repo root, GPU host): gpu_ab/ln/gpu_check.sh LOGDIR      estimate: ~150 s wall
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

# 2. In parallel (<= 40 s): the forward's GPU tests under packed; the dependent-launch chain and the
#    persistent grid's last round under the default (both moved files); memcheck of packed.
stamp "tests + memcheck"
PYT="python3 -m pytest -m gpu -q -x -p no:cacheprovider"
pids=()
APEX_LN_VARIANT=packed $PYT $T/test_forward_many_rows_cuda.py $T/test_dependent_launches.py \
  >"$LOG/tests_packed.txt" 2>&1 & pids+=($!)
APEX_LN_VARIANT= $PYT $T/test_dependent_launches.py $T/test_backward_launch_shapes.py -k "dependent or past_a_round" \
  >"$LOG/tests_default.txt" 2>&1 & pids+=($!)
cat >"$LOG/sanitize_case.py" <<'PY'
import torch
from apex.normalization import FusedLayerNorm, FusedRMSNorm
for dtype in (torch.bfloat16, torch.float16):
    for module in (FusedLayerNorm, FusedRMSNorm):
        # forward widths: one warp, several, ragged (1000, 5120), 8 vectors a thread (32768), and a
        # chain of two norms (a forward reading the forward before it)
        for rows, cols in [(5, 1000), (9, 1024), (3, 5120), (2, 32768), (133, 4096)]:
            norm = module(cols).to("cuda", dtype)
            x = torch.randn(rows, cols, device="cuda", dtype=dtype, requires_grad=True)
            torch.autograd.grad(norm(norm(x)).float().square().sum(), [x, *norm.parameters()])
torch.cuda.synchronize()
print("ok")
PY
APEX_LN_VARIANT=packed "$SAN" --tool memcheck --error-exitcode 9 python3 "$LOG/sanitize_case.py" \
  >"$LOG/memcheck_packed.txt" 2>&1 & pids+=($!)
for p in "${pids[@]}"; do wait "$p"; done
for f in "$LOG"/tests_*.txt; do stamp "$(basename "$f" .txt): $(tail -1 "$f")"; done
stamp "memcheck_packed: $(grep -E 'ERROR SUMMARY|^ok' "$LOG/memcheck_packed.txt" | tr '\n' ' ')"

# 3. Bench (<= 90 s), one process per variant, the default first and last (drift).
stamp bench
for run in default_first packed default_last; do
  v=$run; [ "${run%%_*}" = default ] && v=""
  APEX_LN_VARIANT=$v python3 benchmarks/normalization/bench_norms.py --kinds layer rms --dtypes bf16 \
    --impls apex >"$LOG/bench_$run.txt" 2>&1
  stamp "bench_$run (APEX_LN_VARIANT='$v') done"
done
stamp "all done"
