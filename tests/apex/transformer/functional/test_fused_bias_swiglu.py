"""fused_bias_swiglu ops and apex.transformer.functional.fused_bias_swiglu against a float64 PyTorch
reference, on CPU and (marker gpu) CUDA: with and without bias, the fused bias gradient, odd widths
(the scalar path), the historical module, tracing and bad input."""
import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import fused_bias_swiglu as historical
from apex.transformer.functional import FusedBiasSwiGLU, FusedBiasSwiGLUFunction, fused_bias_swiglu

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# One rounding of a float32 (float64) result: a couple of ulps of the output dtype.
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-12}


def reference(x, bias):
    x = x.double() + (0 if bias is None else bias.double())
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def grads(x, bias, g):
    """(grad_x, grad_bias) of the float64 reference."""
    xd = x.detach().double().requires_grad_()
    bd = None if bias is None else bias.detach().double().requires_grad_()
    out = torch.autograd.grad(reference(xd, bd), [xd] + ([bd] if bd is not None else []), g.double())
    return out[0], (out[1] if bd is not None else None)


def check(actual, expected, dtype, scale=1.0):
    torch.testing.assert_close(actual.double(), expected.double(), rtol=TOL[dtype], atol=TOL[dtype] * scale)


# Half widths: vector path (multiples of 8) and scalar path (odd); leading shapes 2-D and 3-D.
CPU_SHAPES = [(5, 2 * 8), (3, 4, 2 * 5), (17, 2 * 64), (2, 2 * 1000)]
GPU_SHAPES = CPU_SHAPES + [(1000, 2 * 136), (64, 2 * 4096), (300, 2 * 14336 // 4), (4097, 2 * 24)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_forward_backward(device, dtype, with_bias):
    for shape in CPU_SHAPES if device == "cpu" else GPU_SHAPES:
        x = torch.randn(shape, device=device).to(dtype).requires_grad_()
        bias = torch.randn(shape[-1], device=device).to(dtype).requires_grad_() if with_bias else None
        y = fused_bias_swiglu(x, bias)
        assert y.shape == (*shape[:-1], shape[-1] // 2) and y.dtype == dtype
        check(y, reference(x, bias), dtype)
        g = torch.randn_like(y)
        expected_x, expected_bias = grads(x, bias, g)
        inputs = [x] + ([bias] if with_bias else [])
        actual = torch.autograd.grad(y, inputs, g)
        check(actual[0], expected_x, dtype, scale=4)
        if with_bias:  # a sum over rows: its rounding grows with the row count
            check(actual[1], expected_bias, dtype, scale=4 * x[..., 0].numel() ** 0.5)



@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_saturated_and_infinite_gates(device, dtype):
    """Gates where the sigmoid saturates or overflows (the 16-bit CUDA kernels take the hardware's
    ex2/rcp approximations: 2^x overflows to inf below x ~ -88, where the sigmoid must give 0) and
    infinite ones (silu(-inf) is NaN, as -inf / (1 + inf) is in torch)."""
    edges = [-float("inf"), -6e4, -1e4, -100.0, -90.0, -88.0, -87.0, -30.0, -1e-3, 0.0, 1e-3, 30.0, 87.0, 88.0,
             90.0, 100.0, 1e4, float("inf")]  # |silu(gate) * up| < 2e4: finite in float16 too
    gate = torch.tensor(edges * 2, device=device).to(dtype)[:32]  # 32 columns: the vector path for every dtype
    x = torch.cat([gate, torch.linspace(-2, 2, gate.numel(), device=device).to(dtype)]).reshape(1, -1)
    g = torch.linspace(-1, 1, gate.numel(), device=device).to(dtype).reshape(1, -1)
    torch.testing.assert_close(fused_bias_swiglu(x).double(), reference(x, None), rtol=TOL[dtype],
                               atol=TOL[dtype], equal_nan=True)
    xd = x.detach().double().requires_grad_()
    (expected,) = torch.autograd.grad(reference(xd, None), xd, g.double())
    (actual,) = torch.autograd.grad(fused_bias_swiglu(x.requires_grad_()), x, g)
    finite = expected.isfinite()  # not at the infinite gates (NaN there), nor ours
    assert not actual[~finite].isfinite().any()
    scale = expected[finite].abs().max().item()
    torch.testing.assert_close(actual.double()[finite], expected[finite], rtol=TOL[dtype], atol=TOL[dtype] * scale)

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_grad_x_alone(dtype):
    """grad_x alone with a bias, and without one (the historical backward; no rows too): their own
    16-bit one-shot kernels (flat_backward_kernel), apart from the bias-gradient ones."""
    for shape in GPU_SHAPES + [(0, 2 * 8)]:
        x = torch.randn(shape, device="cuda").to(dtype)
        bias = torch.randn(shape[-1], device="cuda").to(dtype)
        g = torch.randn(*shape[:-1], shape[-1] // 2, device="cuda").to(dtype)
        check(historical.backward(g, x, bias), grads(x, bias, g)[0], dtype, scale=4)
        check(historical.backward(g, x, None), grads(x, None, g)[0], dtype, scale=4)


@pytest.mark.gpu
@pytest.mark.parametrize("with_bias", [False, True])
def test_rows_past_one_grid_pass(with_bias):
    """65535 * 8 + 13 rows: more groups of 8 rows than a grid's 65535 (the 16-bit one-shot kernels
    walk the rest), with a partial last group."""
    rows = 65535 * 8 + 13
    x = torch.randn(rows, 2 * 8, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(2 * 8, device="cuda", dtype=torch.bfloat16) if with_bias else None
    check(fused_bias_swiglu(x, bias), reference(x, bias), torch.bfloat16)
    g = torch.randn(rows, 8, device="cuda", dtype=torch.bfloat16)
    expected_x, expected_bias = grads(x, bias, g)
    check(historical.backward(g, x, bias), expected_x, torch.bfloat16, scale=4)
    if with_bias:
        gx, gb = historical.backward_with_bias(g, x, bias)
        check(gx, expected_x, torch.bfloat16, scale=4)
        check(gb, expected_bias, torch.bfloat16, scale=4 * rows**0.5)


@pytest.mark.parametrize("device", DEVICES)
def test_autograd_function_module_and_historical_face(device):
    x = torch.randn(6, 32, device=device, requires_grad=True)
    bias = torch.randn(32, device=device, requires_grad=True)
    g = torch.randn(6, 16, device=device)
    expected = reference(x, bias)
    expected_x, expected_bias = grads(x, bias, g)
    for fn in (FusedBiasSwiGLUFunction.apply, FusedBiasSwiGLU(), fused_bias_swiglu):
        y = fn(x, bias)
        check(y, expected, torch.float32)
        gx, gb = torch.autograd.grad(y, (x, bias), g)
        check(gx, expected_x, torch.float32)
        check(gb, expected_bias, torch.float32, scale=4)
    # bias not needing a gradient, and no bias
    (gx,) = torch.autograd.grad(FusedBiasSwiGLUFunction.apply(x, bias.detach()), (x,), g)
    check(gx, expected_x, torch.float32)
    check(FusedBiasSwiGLU()(x), reference(x, None), torch.float32)
    check(historical.forward(x, bias), expected, torch.float32)
    check(historical.backward(g, x, bias), expected_x, torch.float32)
    gx, gb = historical.backward_with_bias(g, x, bias)
    check(gb, expected_bias, torch.float32, scale=4)
    assert {"forward", "backward", "backward_with_bias"} <= set(dir(historical))


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_and_empty(device):
    x = torch.randn(32, 6, device=device).t()  # [6, 32], not contiguous
    check(fused_bias_swiglu(x), reference(x, None), torch.float32)
    for shape in [(0, 8), (3, 0), (2, 0, 8)]:
        x = torch.randn(shape, device=device, requires_grad=True)
        bias = torch.randn(shape[-1], device=device, requires_grad=True)
        y = fused_bias_swiglu(x, bias)
        assert y.shape == (*shape[:-1], shape[-1] // 2)
        gx, gb = torch.autograd.grad(y, (x, bias), torch.ones_like(y))
        assert gx.shape == x.shape and (gb == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_backward_leaves_its_inputs_alone(device):
    x = torch.randn(4, 16, device=device)
    g = torch.randn(4, 8, device=device)
    kept = (x.clone(), g.clone())
    historical.backward(g, x, None)
    assert torch.equal(x, kept[0]) and torch.equal(g, kept[1])


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_raises_before_launch(device):
    x = torch.randn(4, 16, device=device)
    fused_bias_swiglu(x)  # loads the library
    with pytest.raises(RuntimeError, match="must be even"):
        fused_bias_swiglu(x[:, :15])
    with pytest.raises(RuntimeError, match="must be float32"):
        fused_bias_swiglu(x.long())
    with pytest.raises(RuntimeError, match="at least one dimension"):
        fused_bias_swiglu(x[0, 0])
    with pytest.raises(RuntimeError, match=r"bias must have shape \[16\]"):
        fused_bias_swiglu(x, torch.randn(8, device=device))
    with pytest.raises(RuntimeError, match="bias must have input's dtype"):
        fused_bias_swiglu(x, torch.randn(16, device=device).half())
    with pytest.raises(RuntimeError, match="bias is on meta"):
        fused_bias_swiglu(x, torch.randn(16, device="meta"))
    with pytest.raises(RuntimeError, match="grad_output must have shape"):
        historical.backward(torch.randn(4, 16, device=device), x, None)
    with pytest.raises(RuntimeError, match="grad_output must have input's dtype"):
        historical.backward(torch.randn(4, 8, device=device).half(), x, None)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x = torch.randn(5, 3, 16, device=device, requires_grad=True)
    bias = torch.randn(16, device=device, requires_grad=True)
    g = torch.randn(5, 3, 8, device=device)
    opcheck(torch.ops.apex.fused_bias_swiglu_forward, (x, bias))
    opcheck(torch.ops.apex.fused_bias_swiglu_forward, (x, None))
    opcheck(torch.ops.apex.fused_bias_swiglu_backward, (g, x.detach(), bias.detach()))
    opcheck(torch.ops.apex.fused_bias_swiglu_backward_with_bias, (g, x.detach(), bias.detach()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True])
def test_compiles_with_fullgraph(device, dynamic):
    torch._dynamo.reset()

    def loss(x, bias, w):
        return (fused_bias_swiglu(x, bias) * w).sum()

    compiled = torch.compile(loss, fullgraph=True, dynamic=dynamic)
    for rows in (4, 7):
        x = torch.randn(rows, 24, device=device, requires_grad=True)
        bias = torch.randn(24, device=device, requires_grad=True)
        w = torch.randn(rows, 12, device=device)
        actual = torch.autograd.grad(compiled(x, bias, w), (x, bias))
        expected = torch.autograd.grad(loss(x, bias, w), (x, bias))
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a, e)


@pytest.mark.gpu
def test_int64_offsets_past_two_billion_elements():
    """x [131073, 16384] bf16 has 2^31 + 16384 elements: the last rows sit past int32 offsets."""
    rows, width = 131073, 16384
    x = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(width, device="cuda", dtype=torch.bfloat16)
    y = fused_bias_swiglu(x, bias)
    check(y[-2:], reference(x[-2:], bias), torch.bfloat16)
    g = torch.randn_like(y)
    gx, _ = historical.backward_with_bias(g, x, bias)
    check(gx[-2:], grads(x[-2:], bias, g[-2:])[0], torch.bfloat16, scale=4)
    del gx
    gx = historical.backward(g, x, None)  # grad_x alone: other kernels (flat_backward_kernel under the A/B)
    check(gx[-2:], grads(x[-2:], None, g[-2:])[0], torch.bfloat16, scale=4)
