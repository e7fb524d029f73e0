"""The CUDA forward's register-resident kernels over many rows (many blocks of rows each):
rows narrower than a warp (forward_in_registers), rows that span one warp and several
(forward_vectorized), threads with fewer vectors than the others (ragged widths), and no parameters at all.
Output and statistics against float64, output within an ulp per element."""
import pytest
import torch

from norm_reference import assert_close_rel

pytestmark = pytest.mark.gpu

EPS = 1e-5
# (dtype, parameter/output dtype)
DTYPES = [
    (torch.float32, torch.float32),
    (torch.float16, torch.float16),
    (torch.bfloat16, torch.bfloat16),
    (torch.bfloat16, torch.float32),
]
# 64: rows narrower than a warp (bf16: 8 threads a row, float: 16), forward_in_registers;
# 200: one vector per thread, some lanes without one (bf16: 25 vectors over 32 lanes);
# 1000: a thread with fewer vectors than the others (bf16: 125 vectors of 8 over 32 lanes x 4);
# 1024: one warp per row; 4096, 5120, 16384: several (5120: 160 threads); 32768: 8 vectors per thread.
WIDTHS = [64, 200, 1000, 1024, 4096, 5120, 16384, 32768]
# Elements per case: many blocks of rows at every width.
ELEMENTS = 1 << 24
MANTISSA = {torch.bfloat16: 7, torch.float16: 10}


def forward(x, weight, bias, rms):
    shape = [x.shape[-1]]
    if rms:
        y, invvar = torch.ops.apex.rms_norm_fwd(x, shape, weight, EPS)
        return y, None, invvar
    return torch.ops.apex.layer_norm_fwd(x, shape, weight, bias, EPS)


def reference(x, weight, bias, rms):
    """Float64 output, mean, invvar, and the magnitude the output's rounding follows."""
    x = x.double()
    mean = torch.zeros_like(x[:, :1]) if rms else x.mean(-1, keepdim=True)
    invvar = torch.rsqrt((x - mean).pow(2).mean(-1, keepdim=True) + EPS)
    y = (x - mean) * invvar
    scale = (x.abs() + mean.abs()) * invvar
    if weight is not None:
        y, scale = y * weight.double(), scale * weight.double().abs()
    if bias is not None:
        y, scale = y + bias.double(), scale + bias.double().abs()
    return y, mean.squeeze(-1), invvar.squeeze(-1), scale


@pytest.mark.parametrize("dtype, param_dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("cols", WIDTHS)
@pytest.mark.parametrize("offset", [0.0, 30.0], ids=["centered", "offset"])
def test_forward_many_rows(dtype, param_dtype, rms, affine, cols, offset):
    if param_dtype != dtype and not affine:
        pytest.skip("float32 outputs for 16-bit inputs come from float32 parameters")
    from apex._ops import ops

    ops("fused_layer_norm_cuda")
    g = torch.Generator(device="cuda").manual_seed(cols + int(rms))
    rows = ELEMENTS // cols
    x = (torch.randn(rows, cols, device="cuda", dtype=torch.float64, generator=g) * 2 + offset).to(dtype)
    weight = bias = None
    if affine:
        weight = (torch.rand(cols, device="cuda", dtype=torch.float64, generator=g) * 1.5 + 0.5).to(param_dtype)
        if not rms:
            bias = torch.randn(cols, device="cuda", dtype=torch.float64, generator=g).to(param_dtype)
    y, mean, invvar = forward(x, weight, bias, rms)
    y64, mean64, invvar64, scale = reference(x, weight, bias, rms)

    assert y.dtype == (param_dtype if affine else dtype)
    assert_close_rel(y, y64, y.dtype, "output")
    torch.testing.assert_close(invvar.double().flatten(), invvar64, rtol=2e-5, atol=0)
    if not rms:
        spread = x.double().abs().mean(-1)
        assert ((mean.double().flatten() - mean64).abs() <= 1e-5 * spread).all(), "mean"
    if y.dtype in MANTISSA:
        # One ulp of the output at |ref| (rounding to nearest, and near-ties), plus float32 arithmetic
        # on terms of size `scale`: every element, not only the norm.
        # (float16's subnormals are spaced by its smallest normal * 2^-10.)
        normal = torch.finfo(y.dtype).smallest_normal
        ulp = torch.exp2(torch.floor(torch.log2(y64.abs().clamp_min(normal))) - MANTISSA[y.dtype])
        error = (y.double() - y64).abs()
        bound = ulp + scale * 2.0**-16
        worst = (error / bound).max().item()
        assert worst <= 1.0, f"an element is {worst:.2f}x the bound of 1 ulp + 2^-16 * scale"
