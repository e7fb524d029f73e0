"""backward_fused's launch shapes at their boundaries, against the float64 formula of
test_backward_kernels.py, above all the row-barrier blocks (ROW_BARRIERS in
csrc/layer_norm/layer_norm_backward.cuh): 16-bit rows at 2 vectors per thread (512-8192 bf16 columns)
run in blocks of up to 1024 threads whose row slots synchronize on a named barrier each.

- The persistent grid's edges (test_grid_edges, first): one, two and an odd number of blocks, row slots
  past the last row (rows go to slots slot-major), bitwise repeatability.
- 32 row slots of one warp (512 columns: no barrier), 15 slots with a named barrier each (1024), 8
  (2048), 3 slots of 320 threads (5120), 2 of 512 (8192); row counts below, at and above the slots of
  a block, and vectors past the row end (2056).
- Just past the row-barrier range (8200: 3 vectors per thread) and the prefetching kernel (16384),
  and odd columns (the scalar kernels).
- The persistent grid's last round: row counts one past a whole round of blocks on 132 SMs (an H200),
  or a few rows past, at each launch shape, all three dtypes (test_rows_past_a_round).
"""
import re

import pytest
import torch

from test_backward_kernels import assert_backward_repeatable, check_backward, run_backward, statistics

pytestmark = pytest.mark.gpu

# The persistent grid's edges: one block, two, three (an odd grid), 131 and 133 rows of one slot (odd
# grid below and one row past a round of 132 SMs), 16 and 31 rows of 15 slots at 1024 columns (2 and 3
# blocks; slots past the last row in every block, since rows go to slots slot-major), 263 of 2 slots
# (8192: one slot short of a full round), 265 of 4 (4096), 1981 of 15.
GRID_EDGES = [(1, 16384), (2, 16384), (3, 16384), (131, 16384), (133, 16384), (1, 4096), (265, 4096),
              (5, 1024), (16, 1024), (31, 1024), (1981, 1024), (263, 8192)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("rms, params", [(False, "weight_bias"), (False, "bias"), (False, "weight"), (True, "weight")],
                         ids=["layer-weight_bias", "layer-bias", "layer-weight", "rms-weight"])
@pytest.mark.parametrize("shape", GRID_EDGES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_grid_edges(dtype, rms, params, shape):
    x = (torch.randn(shape, dtype=torch.float64) * 2 + 0.5).to("cuda", dtype)
    check_backward(x, dtype, rms, params)


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("shape", [(3, 16384), (133, 16384), (31, 1024), (1981, 1024), (263, 8192)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
def test_grid_edges_repeatable(rms, shape):
    """Bitwise the same grads twice: each row's slot and block, and the order of the partial sums, are fixed."""
    assert_backward_repeatable(*shape, rms)


SHAPES = [
    (1, 512), (9, 512), (33, 512),
    (1, 1024), (5, 1024), (15, 1024), (16, 1024), (1037, 1024),
    (2, 1000), (7, 2048), (17, 2056),
    (1, 4096), (3, 4096), (265, 4096),
    (3, 5120), (41, 5120),
    (1, 8192), (5, 8192),
    (1, 8200), (1, 16384), (133, 16384),
    (3, 1001),  # odd columns: the scalar kernels
]
DTYPES = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("params", ["weight_bias", "weight", "bias", "none"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_launch_shape_backward(dtype, rms, params, shape):
    if rms and params in ("bias", "weight_bias"):
        pytest.skip("RMSNorm has no bias")
    x = (torch.randn(shape, dtype=torch.float64) * 2 + 0.5).to("cuda", dtype)
    check_backward(x, dtype, rms, params)


def fused_row_barriers(rms, cols, dtype):
    """ROW_BARRIERS of each backward_fused kernel one backward call launches (its last template
    argument, as the profiler's kernel names show it)."""
    x = torch.randn(512, cols, device="cuda", dtype=dtype)
    dy = torch.randn_like(x)
    weight = torch.randn(cols, device="cuda", dtype=dtype)
    mean, invvar = statistics(x, rms)
    run_backward(x, dy, mean, invvar, weight, None, rms)  # load and warm up outside the profile
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        run_backward(x, dy, mean, invvar, weight, None, rms)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    found = [re.search(r"backward_fused<([^<>]*)>", n) for n in names if "backward_fused" in n]
    return [m.group(1).split(",")[-1].strip() == "true" for m in found if m], names


# Where the row-barrier kernel runs: 16-bit rows (data and parameters alike) at 2 vectors per thread.
ROW_BARRIER_COLS = [512, 1024, 2048, 4096, 5120, 8192]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("cols", [1024, 4096, 5120, 8192, 16384])
def test_row_barriers_run(dtype, rms, cols):
    """The row-barrier kernel runs where it applies, the plain backward_fused elsewhere."""
    barriers, names = fused_row_barriers(rms, cols, dtype)
    if dtype == torch.float32:  # never row barriers (nor, at some widths, backward_fused at all)
        assert not any(barriers), names
    else:
        assert barriers == [cols in ROW_BARRIER_COLS], names


# (rows, cols) one row past a whole round of the persistent grid on 132 SMs, or a few rows past, at
# each launch shape: 32 slots of one warp (512), 15 slots (1024), 4 (4096), 3 (5120), 2 (8192), 1
# (12296: 4 vectors a thread, 2 blocks per SM; 16384: prefetching, 1 block per SM).
ROUND_SHAPES = [(4225, 512), (1981, 1024), (2000, 1024), (529, 4096), (1000, 4096), (397, 5120), (265, 8192),
                (400, 8192), (265, 12296), (133, 16384), (265, 16384)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("shape", ROUND_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_rows_past_a_round(dtype, rms, shape):
    """A last round of rows that only a few blocks of the persistent grid take."""
    x = (torch.randn(shape, dtype=torch.float64) * 2 + 0.5).to("cuda", dtype)
    check_backward(x, dtype, rms, "weight" if rms else "weight_bias")
