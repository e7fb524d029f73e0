"""apex.fused_dense against float64 PyTorch references on CPU and (marker gpu) CUDA: FusedDense and
FusedDenseGeluDense forward and backward over dtypes, odd / aligned / empty shapes, N-D and strided
inputs, exact and tanh GELU; NVIDIA apex's fused_dense_cuda face; autocast; tracing; bad input."""
import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import fused_dense_cuda
from dense_reference import linear_gelu_linear, rounded
from apex.fused_dense import (DenseNoBiasFunc, FusedDense, FusedDenseFunc, FusedDenseGeluDense,
                              FusedDenseGeluDenseFunc, dense_no_bias_function, fused_dense_function,
                              fused_dense_gelu_dense_function)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# Relative to the reference's largest magnitude. The references round every intermediate the fused op
# stores in dtype (dense_reference.py), so an output differs from its reference by its own final
# rounding plus float32 accumulation: 8 units of roundoff for 16-bit dtypes (fp16 2^-11, bf16 2^-8),
# float32 accumulation over up to 1024 products for float32 (TF32 stays off, torch's default).
TOL = {torch.float32: 1e-4, torch.float16: 8 * 2.0 ** -11, torch.bfloat16: 8 * 2.0 ** -8, torch.float64: 1e-10}


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)  # the same data on every run


def assert_near(actual, expected, dtype):
    """actual within TOL[dtype] of expected (float64), relative to expected's largest magnitude."""
    assert actual.dtype == dtype and actual.shape == expected.shape
    scale = expected.abs().max().item() if expected.numel() else 1.0
    tol = TOL[dtype]
    torch.testing.assert_close(actual.double(), expected, rtol=tol, atol=tol * max(scale, 1e-3))


def leaves(*tensors):
    return [None if t is None else t.detach().requires_grad_() for t in tensors]


def reference_grads(fn, tensors, grad_output):
    """fn's output and gradients in float64 for the (possibly None) tensors."""
    wide = leaves(*[None if t is None else t.double() for t in tensors])
    out = fn(*wide)
    out.backward(grad_output.double())
    return out.detach(), [None if t is None else t.grad for t in wide]


def make(shape, dtype, device, scale=1.0):
    return (scale * torch.randn(shape, dtype=torch.float64)).to(dtype).to(device)


def linear_params(in_features, out_features, dtype, device, bias=True):
    weight = make((out_features, in_features), dtype, device, in_features ** -0.5)
    return weight, make((out_features,), dtype, device) if bias else None


def check_against(fn, ref_fn, tensors, dtype):
    """Forward and every gradient of fn (apex) against ref_fn (float64 torch) on the same tensors."""
    mine = leaves(*tensors)
    out = fn(*mine)
    grad_output = make(out.shape, dtype, out.device)
    expected, expected_grads = reference_grads(ref_fn, tensors, grad_output)
    assert_near(out, expected, dtype)
    out.backward(grad_output)
    for t, expected_grad in zip(mine, expected_grads):
        if t is not None:
            assert_near(t.grad, expected_grad, dtype)


SHAPES = [  # (leading sizes, in_features, out_features)
    ((1,), 1, 1),          # batch 1, one feature
    ((5,), 7, 3),          # odd everywhere
    ((3, 4), 16, 24),      # N-D input, multiples of 8 (cuBLASLt's fused epilogues on GPUs)
    ((33,), 40, 9),        # aligned input features, odd output features
    ((2, 1, 3), 5, 64),
    ((), 6, 4),            # a single 1-D sample
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead,in_features,out_features", SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_fused_dense_matches_linear(device, dtype, lead, in_features, out_features, bias):
    x = make((*lead, in_features), dtype, device)
    weight, b = linear_params(in_features, out_features, dtype, device, bias)
    check_against(fused_dense_function, F.linear, [x, weight, b], dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead,in_features,hidden,out_features",
                         [((1,), 1, 1, 1), ((4,), 3, 3, 2), ((5, 3), 16, 32, 8), ((7,), 24, 13, 5),
                          ((2, 9), 8, 40, 16)])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("bias", [True, False])
def test_fused_dense_gelu_dense_matches_torch(device, dtype, lead, in_features, hidden, out_features, approximate,
                                              bias):
    x = make((*lead, in_features), dtype, device)
    w1, b1 = linear_params(in_features, hidden, dtype, device, bias)
    w2, b2 = linear_params(hidden, out_features, dtype, device, bias)

    def fused(x, w1, b1, w2, b2):
        return fused_dense_gelu_dense_function(x, w1, b1, w2, b2, approximate)

    def composite(x, w1, b1, w2, b2):
        return linear_gelu_linear(x, w1, b1, w2, b2, dtype, approximate)

    check_against(fused, composite, [x, w1, b1, w2, b2], dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strided_inputs(device, dtype):
    """Transposed, sliced and offset views of input and weights give the contiguous results."""
    wide = make((12, 50), dtype, device)
    weight_t = make((20, 24), dtype, device, 20 ** -0.5)  # weight = weight_t.t(): [24, 20], column-major
    bias = make((48,), dtype, device)[::2]                # a strided bias
    for x in (wide[:, 1:21], wide.t()[3:23].t(), wide[::2, :40:2]):
        check_against(fused_dense_function, F.linear, [x, weight_t.t(), bias], dtype)
    hidden_w = make((7, 24), dtype, device)
    check_against(lambda x, w1, w2: fused_dense_gelu_dense_function(x, w1, None, w2, None),
                  lambda x, w1, w2: linear_gelu_linear(x, w1, None, w2, None, dtype),
                  [wide[:, 1:21], weight_t.t(), hidden_w], dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch(device):
    x = torch.randn(0, 6, device=device, requires_grad=True)
    dense = FusedDense(6, 4).to(device)
    y = dense(x)
    assert y.shape == (0, 4)
    y.sum().backward()
    assert x.grad.shape == (0, 6)
    assert torch.equal(dense.weight.grad, torch.zeros_like(dense.weight))
    assert torch.equal(dense.bias.grad, torch.zeros_like(dense.bias))
    gelu = FusedDenseGeluDense(6, 8, 3).to(device)
    z = gelu(x)
    assert z.shape == (0, 3)
    z.sum().backward()
    assert torch.equal(gelu.weight1.grad, torch.zeros_like(gelu.weight1))
    assert torch.equal(gelu.bias2.grad, torch.zeros_like(gelu.bias2))


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_only_where_needed(device):
    """A frozen input or weight gets no gradient (and its GEMM is skipped)."""
    x = make((4, 6), torch.float32, device)
    weight, bias = linear_params(6, 5, torch.float32, device)
    w, b = leaves(weight, bias)
    fused_dense_function(x, w, b).sum().backward()
    assert x.grad is None and w.grad is not None
    torch.testing.assert_close(b.grad, torch.full_like(b, 4.0))
    w1, w2 = linear_params(6, 8, torch.float32, device)[0], linear_params(8, 3, torch.float32, device)[0]
    xg, w2g = leaves(x, w2)
    fused_dense_gelu_dense_function(xg, w1, None, w2g, None).sum().backward()
    assert xg.grad is not None and w2g.grad is not None


@pytest.mark.parametrize("device", DEVICES)
def test_modules_and_autograd_function_names(device):
    torch.manual_seed(0)
    dense = FusedDense(8, 4).to(device)
    reference = torch.nn.Linear(8, 4).to(device)
    assert dense.weight.abs().max() <= 8 ** -0.5 and dense.bias.abs().max() <= 8 ** -0.5  # nn.Linear's init
    reference.load_state_dict(dense.state_dict())
    x = torch.randn(3, 8, device=device)
    torch.testing.assert_close(dense(x), reference(x))
    torch.testing.assert_close(FusedDenseFunc.apply(x, dense.weight, dense.bias), reference(x))
    torch.testing.assert_close(DenseNoBiasFunc.apply(x, dense.weight), x @ dense.weight.t())
    no_bias = FusedDense(8, 4, bias=False).to(device)
    assert no_bias.bias is None and "bias=False" in repr(no_bias)
    torch.testing.assert_close(no_bias(x), dense_no_bias_function(x, no_bias.weight))
    block = FusedDenseGeluDense(8, 16, 4).to(device)
    expected = F.linear(F.gelu(F.linear(x, block.weight1, block.bias1)), block.weight2, block.bias2)
    torch.testing.assert_close(block(x), expected)
    torch.testing.assert_close(FusedDenseGeluDenseFunc.apply(x, block.weight1, block.bias1, block.weight2,
                                                             block.bias2), expected)
    assert set(block.state_dict()) == {"weight1", "bias1", "weight2", "bias2"}
    with pytest.raises(ValueError, match="approximate"):
        FusedDenseGeluDense(8, 16, 4, approximate="fast")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_historical_face(device, dtype):
    """fused_dense_cuda's four functions, called as NVIDIA apex's autograd Functions call them."""
    x = make((6, 16), dtype, device)
    w1, b1 = linear_params(16, 24, dtype, device)
    w2, b2 = linear_params(24, 8, dtype, device)
    assert {"linear_bias_forward", "linear_bias_backward", "linear_gelu_linear_forward",
            "linear_gelu_linear_backward"} <= set(dir(fused_dense_cuda))
    wide = [t.double() for t in (x, w1, b1, w2, b2)]
    assert_near(fused_dense_cuda.linear_bias_forward(x, w1, b1), F.linear(*wide[:3]), dtype)
    dy = make((6, 24), dtype, device)
    # Upstream's autograd Functions pass parameters that require grad: the ATen GEMMs inside run below
    # autograd all the same (no "out= arguments don't support automatic differentiation" error).
    d_input, d_weight, d_bias = fused_dense_cuda.linear_bias_backward(x, torch.nn.Parameter(w1), dy)
    assert_near(d_input, dy.double() @ wide[1], dtype)
    assert_near(d_weight, dy.double().t() @ wide[0], dtype)
    assert_near(d_bias, dy.double().sum(0), dtype)

    output1, output2, gelu_in = fused_dense_cuda.linear_gelu_linear_forward(x, w1, b1, w2, b2)
    pre = rounded(F.linear(*wide[:3]), dtype)
    assert_near(gelu_in, pre, dtype)
    assert_near(output1, F.gelu(pre), dtype)
    assert_near(output2, linear_gelu_linear(*wide, dtype), dtype)
    d_out2 = make((6, 8), dtype, device)
    grads = fused_dense_cuda.linear_gelu_linear_backward(x, gelu_in, output1, w1, w2, d_out2)
    _, expected = reference_grads(lambda *p: linear_gelu_linear(*p, dtype), [x, w1, b1, w2, b2], d_out2)
    for grad, want in zip(grads, expected):
        assert_near(grad, want, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_casts_like_apex(device):
    """Under autocast, inputs and fp32 parameters run in the autocast dtype (amp O1/O4)."""
    dtype = torch.bfloat16 if device == "cpu" else torch.float16
    dense = FusedDense(8, 4).to(device)
    block = FusedDenseGeluDense(8, 16, 4).to(device)
    x = torch.randn(3, 8, device=device)
    with torch.autocast(device, dtype=dtype):
        y, z = dense(x), block(x)
    assert y.dtype == dtype and z.dtype == dtype
    assert_near(y, F.linear(x.to(dtype).double(), dense.weight.to(dtype).double(), dense.bias.to(dtype).double()),
                dtype)
    y.float().sum().backward()
    assert dense.weight.grad.dtype == torch.float32  # the cast is differentiable back to the fp32 parameter


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_model_like_amp_o2(device, dtype):
    """amp O2/O5 cast the model and its inputs; the modules run in that dtype."""
    block = FusedDenseGeluDense(16, 32, 8).to(device).to(dtype)
    x = make((5, 16), dtype, device)
    check_against(lambda x, *p: fused_dense_gelu_dense_function(x, *p),
                  lambda *p: linear_gelu_linear(*p, dtype),
                  [x, block.weight1.detach(), block.bias1.detach(), block.weight2.detach(), block.bias2.detach()],
                  dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_raises_before_launch(device):
    x = torch.randn(4, 6, device=device)
    w, b = torch.randn(5, 6, device=device), torch.randn(5, device=device)
    with pytest.raises(RuntimeError, match="must be float32"):
        fused_dense_function(x.long(), w.long(), b.long())
    with pytest.raises(RuntimeError, match="weight must have the input's dtype"):
        fused_dense_function(x, w.double(), b)
    with pytest.raises(RuntimeError, match="weight must have 6 columns"):
        fused_dense_function(x, w[:, :5], b)
    with pytest.raises(RuntimeError, match=r"bias must have shape \[5\]"):
        fused_dense_function(x, w, b[:4])
    with pytest.raises(RuntimeError, match="weight is on meta"):
        fused_dense_function(x, w.to("meta"), b)
    with pytest.raises(RuntimeError, match="at least 1-D"):
        fused_dense_function(x[0, 0], w, b)
    with pytest.raises(RuntimeError, match="weight2 must have 5 columns"):
        fused_dense_gelu_dense_function(x, w, b, w, b)
    with pytest.raises(RuntimeError, match="approximate must be 'none' or 'tanh'"):
        fused_dense_gelu_dense_function(x, w, b, w.t(), None, approximate="sigmoid")
    with pytest.raises(RuntimeError, match="d_output must have shape"):
        fused_dense_cuda.linear_bias_backward(x, w, torch.randn(4, 4, device=device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True])
def test_compiles_with_fullgraph(device, dynamic):
    torch._dynamo.reset()
    dense, block = FusedDense(8, 16).to(device), FusedDenseGeluDense(16, 24, 4, approximate="tanh").to(device)

    def step(x):
        return block(torch.relu(dense(x))).square().sum()

    compiled = torch.compile(step, fullgraph=True, dynamic=dynamic)
    for rows in (5, 9):
        x = torch.randn(rows, 8, device=device, requires_grad=True)
        compiled(x).backward()
        x_ref = x.detach().requires_grad_()
        step(x_ref).backward()
        torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x = torch.randn(5, 8, device=device, requires_grad=True)
    w1, b1 = torch.randn(16, 8, device=device, requires_grad=True), torch.randn(16, device=device, requires_grad=True)
    w2 = torch.randn(4, 16, device=device, requires_grad=True)
    ops = torch.ops.apex
    opcheck(ops.fused_dense_linear_bias_forward, (x, w1, b1))
    opcheck(ops.fused_dense_linear_bias_forward, (x, w1, None))
    opcheck(ops.fused_dense_linear_bias_backward, (x.detach(), w1.detach(), torch.randn(5, 16, device=device)))
    for approximate in ("none", "tanh"):
        opcheck(ops.fused_dense_linear_gelu_linear_forward, (x, w1, b1, w2, None, approximate))
        out1, _, pre = ops.fused_dense_linear_gelu_linear_forward(x, w1, b1, w2, None, approximate)
        opcheck(ops.fused_dense_linear_gelu_linear_backward,
                (x.detach(), pre, out1, w1.detach(), w2.detach(), torch.randn(5, 4, device=device), approximate,
                 [True, False, True, True, False]))


# ---- GPU-only paths: cuBLASLt's epilogues and the fallbacks beside them ---------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tokens,in_features,hidden,out_features",
                         [(512, 256, 1024, 256),   # every epilogue fused
                          (333, 264, 136, 72),     # odd token count, aligned features
                          (100, 130, 90, 33)])     # nothing aligned: the fallbacks
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_cuda_epilogues_at_larger_shapes(dtype, tokens, in_features, hidden, out_features, approximate):
    x = make((tokens, in_features), dtype, "cuda")
    w1, b1 = linear_params(in_features, hidden, dtype, "cuda")
    w2, b2 = linear_params(hidden, out_features, dtype, "cuda")
    check_against(lambda *a: fused_dense_gelu_dense_function(*a, approximate=approximate),
                  lambda *p: linear_gelu_linear(*p, dtype, approximate),
                  [x, w1, b1, w2, b2], dtype)
    check_against(fused_dense_function, F.linear, [x, w1, b1], dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_misaligned_views(dtype):
    """Views starting one element into their storage: cuBLASLt is told the real alignment."""
    base = make((64 * 72 + 1,), dtype, "cuda")
    x = base[1:].view(64, 72)
    wbase = make((48 * 72 + 1,), dtype, "cuda", 72 ** -0.5)
    weight = wbase[1:].view(48, 72)
    bias = make((49,), dtype, "cuda")[1:]
    check_against(fused_dense_function, F.linear, [x, weight, bias], dtype)


@pytest.mark.gpu
def test_rocm_apex_fused_dense_and_gelu_tests():
    """ROCm apex's tests/L0/run_fused_dense checks, restated: 1536 x 1024 -> 3072 in fp16, and its tiny GELU case."""
    torch.manual_seed(0)
    x = torch.randn(1536, 1024, dtype=torch.float16, device="cuda")
    dense = FusedDense(1024, 3072).half().cuda()
    x_t = x.clone().requires_grad_()
    y = dense(x_t)
    dy = torch.randn_like(y)
    y.backward(dy)
    torch.testing.assert_close(y, torch.matmul(x, dense.weight.t()) + dense.bias, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(dense.weight.grad, torch.matmul(dy.t(), x), atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(x_t.grad, torch.matmul(dy, dense.weight), atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(dense.bias.grad, dy.sum(0), atol=1e-3, rtol=1e-3)
    block = FusedDenseGeluDense(3, 3, 2).half().cuda()
    i = torch.randn(4, 3, dtype=torch.float16, device="cuda")
    expected = F.linear(F.gelu(F.linear(i, block.weight1, block.bias1)), block.weight2, block.bias2)
    torch.testing.assert_close(block(i), expected, atol=1e-3, rtol=1e-3)
