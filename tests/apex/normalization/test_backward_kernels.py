"""The CUDA backward kernels (layer_norm_backward.cuh) through the backward ops directly, against a float64
formula: each combination of wanted parameter grads, widths at the edges of the register layouts, row
counts that leave row slots and grid iterations partly empty, and inputs with a large mean.

Vectorizable rows take backward_fused; the memory-efficient backward takes backward_in_registers, whose
results test_fused_layer_norm.py covers (the last tests here check which kernel runs)."""
import pytest
import torch

from apex._ops import ops

from norm_reference import assert_close_rel, random_parameter

pytestmark = pytest.mark.gpu
EPS = 1e-5

# (rows, cols): 1 vector per row (a thread per row); vectors past the row end (1000 = 125 bf16 vectors
# on 64 threads); 4 rows per block with fewer rows than slots (3) and many grid iterations (1037); a row
# of 10 warps; 2 bf16 vectors per thread at 512 threads (8192); 4 vectors per thread without (12296: 2
# blocks per SM) and with the next row prefetched (16384, one block per SM).
SHAPES = [(1, 8), (3, 1000), (1037, 1024), (129, 5120), (65, 8192), (70, 12296), (61, 16384)]
# (data dtype, parameter / grad_output dtype): same dtypes, and 16-bit data with float32 parameters.
DTYPES = [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16), (torch.float32, torch.float32),
          (torch.bfloat16, torch.float32)]
# Which parameters exist (and so which grads the kernel computes).
PARAMS = ["weight_bias", "weight", "bias", "none"]


def statistics(x, rms):
    """mean, invvar as the forward saves them (float32), from float64."""
    x64 = x.double()
    mean = torch.zeros(x.shape[0], dtype=torch.float64, device=x.device) if rms else x64.mean(-1)
    var = (x64 - mean[:, None]).pow(2).mean(-1)
    return mean.float(), torch.rsqrt(var + EPS).float()


def reference(x, dy, mean, invvar, weight, rms):
    """grad_input, grad_weight, grad_bias in float64 from the saved float32 statistics."""
    x, dy = x.double(), dy.double()
    xhat = (x - mean.double()[:, None]) * invvar.double()[:, None]
    gdy = dy * (weight.double() if weight is not None else 1.0)
    inner = gdy - xhat * (gdy * xhat).mean(-1, keepdim=True)
    if not rms:
        inner = inner - gdy.mean(-1, keepdim=True)
    return inner * invvar.double()[:, None], (dy * xhat).sum(0), dy.sum(0), xhat


def run_backward(x, dy, mean, invvar, weight, bias, rms, memory_efficient=False):
    """x is the forward's output y when memory_efficient."""
    ops("fused_layer_norm_cuda")
    shape = [x.shape[-1]]
    if rms:
        grad_input, grad_weight = torch.ops.apex.rms_norm_bwd(dy, invvar, x, shape, weight, EPS, memory_efficient)
        return grad_input, grad_weight, None
    return torch.ops.apex.layer_norm_bwd(dy, mean, invvar, x, shape, weight, bias, EPS, memory_efficient)


def check_backward(x, param_dtype, rms, params, seed=0):
    generator = torch.Generator().manual_seed(seed)
    rows, cols = x.shape
    weight = random_parameter((cols,), "cuda", param_dtype, generator) if "weight" in params else None
    bias = random_parameter((cols,), "cuda", param_dtype, generator) if "bias" in params and not rms else None
    out_dtype = param_dtype if weight is not None or bias is not None else x.dtype  # the forward output's
    dy = torch.randn(rows, cols, generator=generator, dtype=torch.float64).to("cuda", out_dtype)
    mean, invvar = statistics(x, rms)
    grad_input, grad_weight, grad_bias = run_backward(x, dy, mean, invvar, weight, bias, rms)
    want_input, want_weight, want_bias, xhat = reference(x, dy, mean, invvar, weight, rms)

    assert grad_input.dtype == x.dtype and grad_input.shape == x.shape
    scale = (dy.double() * invvar.double()[:, None] * (weight.double() if weight is not None else 1.0)).norm()
    assert_close_rel(grad_input, want_input, x.dtype, "grad_input", scale=scale)
    # Parameter grads are sums over rows: their rounding follows the sum of |terms|.
    if weight is not None:
        assert grad_weight.dtype == out_dtype
        term = (dy.double() * xhat).abs().sum(0).norm()
        assert_close_rel(grad_weight, want_weight, param_dtype, "grad_weight", scale=max(want_weight.norm(), term))
    if bias is not None:
        assert grad_bias.dtype == out_dtype
        term = dy.double().abs().sum(0).norm()
        assert_close_rel(grad_bias, want_bias, param_dtype, "grad_bias", scale=max(want_bias.norm(), term))


@pytest.mark.parametrize("dtype, param_dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_backward_kernel(dtype, param_dtype, rms, params, shape):
    if rms and params in ("bias", "weight_bias"):
        pytest.skip("RMSNorm has no bias")
    if params == "none" and param_dtype != dtype:
        pytest.skip("without parameters the dtypes are the input's")
    x = (torch.randn(shape, dtype=torch.float64) * 2 + 0.5).to("cuda", dtype)
    check_backward(x, param_dtype, rms, params)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("offset", [30.0, 1000.0])
@pytest.mark.parametrize("cols", [1024, 4096])
def test_backward_large_mean(dtype, offset, cols):
    """Rows whose mean is far from 0 next to their spread: xhat = x * invvar - mean * invvar (16-bit data)
    must stay as accurate as (x - mean) * invvar within the input's own rounding."""
    x = (torch.randn(300, cols, dtype=torch.float64) + offset).to("cuda", dtype)
    check_backward(x, dtype, rms=False, params="weight_bias")


def assert_backward_repeatable(rows, cols, rms):
    """The backward of the same bf16 rows twice gives bitwise the same grads."""
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    weight = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
    bias = None if rms else torch.randn(cols, device="cuda", dtype=torch.bfloat16)
    mean, invvar = statistics(x, rms)
    first = run_backward(x, dy, mean, invvar, weight, bias, rms)
    second = run_backward(x, dy, mean, invvar, weight, bias, rms)
    for a, b in zip(first, second):
        if a is not None:
            assert torch.equal(a, b)


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("rows,cols", [(2048, 4096), (1531, 1024), (1531, 4096), (1531, 5120), (1531, 8192)])
def test_backward_repeatable(rms, rows, cols):
    """The same call twice gives bitwise the same grads (fixed reduction order, no atomics; with row
    barriers too: each row's slot and block are fixed by the grid, 1531 rows leave the last wave part
    full)."""
    assert_backward_repeatable(rows, cols, rms)


def backward_kernel_names(rms, memory_efficient=False):
    """Names of the CUDA kernels one backward call launches (torch.profiler)."""
    x = torch.randn(256, 4096, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    weight = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    mean, invvar = statistics(x, rms)
    if memory_efficient:  # the backward reads the forward's output
        x = ((x.float() - mean[:, None]) * invvar[:, None] * weight.float()).to(x.dtype)
    run_backward(x, dy, mean, invvar, weight, None, rms, memory_efficient)  # load and warm up outside the profile
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        run_backward(x, dy, mean, invvar, weight, None, rms, memory_efficient)
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_default_runs_fused_kernel(rms):
    """Vectorizable rows take backward_fused (so the results above are its)."""
    names = " ".join(backward_kernel_names(rms))
    assert "backward_fused" in names and "backward_in_registers" not in names, names


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_memory_efficient_runs_old_kernel(rms):
    """memory_efficient (xhat from y: a division per element) takes backward_in_registers."""
    names = " ".join(backward_kernel_names(rms, memory_efficient=True))
    assert "backward_in_registers" in names and "backward_fused" not in names, names
