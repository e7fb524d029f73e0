"""The candidate launch shapes of backward_fused (APEX_LN_BWD_VARIANT = tworows | rowbar | wide; see
BackwardShape in csrc/layer_norm/layer_norm_backward.cuh) at their boundaries, against the float64
formula of test_backward_kernels.py. The variant is read once per process, so this file checks whichever
one the process runs under (gpu_ab/ln_backward/gpu_check.sh runs it under each); under the default it
checks the same shapes on the default kernels.

- tworows (16-bit rows at 2 vectors per thread, where it holds more rows per SM): a row slot takes rows
  r and r + stride together, so row counts that leave the second row of a pair (or a whole pair) past
  the end; rows in one warp (512 columns: the four sums without the cross-warp step), 2-8 warps, and
  10 warps (5120: 40 warp totals, two per lane in the fold).
- rowbar (2 vectors per thread, blocks of up to 1024 threads): 32 row slots of one warp (512), 15 slots
  with a named barrier each (1024), 8 (2048), 3 slots of 320 threads (5120), 2 of 512 (8192); row counts
  below, at and above the slots of a block.
- wide (more than 8192 bf16 columns): 1024 threads (16384), 800 threads (12296: vectors past the row
  end, 50 warp totals), 544 threads (8200, just past the threshold).
"""
import os
import re

import pytest
import torch

from test_backward_kernels import check_backward, run_backward, statistics

pytestmark = pytest.mark.gpu

VARIANT = os.environ.get("APEX_LN_BWD_VARIANT", "")
# BackwardShape's value for each variant, as kernel names show it ("(...BackwardShape)1").
SHAPE_VALUE = {"": 0, "tworows": 1, "rowbar": 2, "wide": 3}

# (rows, cols) at the boundaries listed above, for every variant.
SHAPES = [
    (1, 512), (9, 512), (33, 512),
    (1, 1024), (5, 1024), (15, 1024), (16, 1024), (1037, 1024),
    (2, 1000), (7, 2048), (17, 2056),
    (1, 4096), (3, 4096), (265, 4096),
    (3, 5120), (41, 5120),
    (1, 8192), (5, 8192),
    (1, 8200), (3, 12296), (1, 16384), (133, 16384),
    (3, 1001),  # odd columns: the scalar kernels under every variant
]
DTYPES = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("params", ["weight_bias", "weight", "bias", "none"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_variant_backward(dtype, rms, params, shape):
    if rms and params in ("bias", "weight_bias"):
        pytest.skip("RMSNorm has no bias")
    x = (torch.randn(shape, dtype=torch.float64) * 2 + 0.5).to("cuda", dtype)
    check_backward(x, dtype, rms, params)


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("cols", [1024, 4096, 5120, 16384])
def test_variant_repeatable(rms, cols):
    """Bitwise the same grads from two calls (every row's slot and block fixed by the grid)."""
    x = torch.randn(1531, cols, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    weight = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
    bias = None if rms else torch.randn(cols, device="cuda", dtype=torch.bfloat16)
    mean, invvar = statistics(x, rms)
    first = run_backward(x, dy, mean, invvar, weight, bias, rms)
    second = run_backward(x, dy, mean, invvar, weight, bias, rms)
    for a, b in zip(first, second):
        if a is not None:
            assert torch.equal(a, b)


def fused_shapes(rms, cols, dtype=torch.bfloat16):
    """BackwardShape values of the backward_fused kernels one backward call launches."""
    x = torch.randn(512, cols, device="cuda", dtype=dtype)
    dy = torch.randn_like(x)
    weight = torch.randn(cols, device="cuda", dtype=dtype)
    mean, invvar = statistics(x, rms)
    run_backward(x, dy, mean, invvar, weight, None, rms)  # load and warm up outside the profile
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        run_backward(x, dy, mean, invvar, weight, None, rms)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return [int(m.group(1)) for n in names if "backward_fused" in n for m in [re.search(r"BackwardShape\W*(\d)", n)]
            if m], names


# Where each variant applies (H200: tworows only where 3 blocks of 2 rows beat the default's blocks).
APPLIES = {
    "": [],
    "tworows": [1024, 4096, 5120],
    "rowbar": [512, 1024, 2048, 4096, 5120, 8192],
    "wide": [8200, 12296, 16384],
}


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("cols", [1024, 4096, 5120, 8192, 16384])
def test_variant_runs(rms, cols):
    """The process's variant runs where it applies, the default kernel elsewhere."""
    if VARIANT not in SHAPE_VALUE:
        pytest.skip(f"unknown APEX_LN_BWD_VARIANT={VARIANT!r} (the default runs)")
    shapes, names = fused_shapes(rms, cols)
    want = SHAPE_VALUE[VARIANT] if cols in APPLIES[VARIANT] else 0
    assert shapes == [want], names
