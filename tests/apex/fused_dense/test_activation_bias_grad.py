"""fused_dense_activation_bias_grad, the backward's one pass at a layer's pre-activation (what mlp_backward and
FusedDenseGeluDense's backward run after their data-gradient GEMMs): grad_input = grad * activation'(saved) and
grad_bias = grad_input summed over rows, against float64 PyTorch references on CPU and (marker gpu) CUDA, for
every activation, dtype and odd / aligned / empty shape; output_mask; strided inputs; eager's semantics;
determinism; bad input; opcheck."""
import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

from apex._ops import ops

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
ACTIVATIONS = ["none", "relu", "sigmoid", "gelu", "gelu_tanh"]
SHAPES = [  # (rows, cols): tiles of 128 rows, column strips of 16-byte packs (CUDA) / blocks of 1024 (CPU)
    (1, 1),
    (3, 7),        # odd: the scalar CUDA path for every dtype
    (1, 4100),     # 4100 % 8 = 4: scalar for 16-bit data, 16-byte packs for float32
    (1000, 1),     # many tiles, one column
    (1000, 4100),  # several tiles and strips, both ragged
    (129, 136),    # one full tile and a row; 16-byte packs for every dtype, a partial strip
]
# Unit roundoff of each dtype: grad_input is one rounding of a float32 (float64) product, grad_bias one of its sum.
ROUNDOFF = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float64: 2.0 ** -53}
# The derivative in float32 (erf, exp, tanh: a few float32 ulps), relative to the largest element, for
# grad_input elements whose derivative cancels to near zero (GELU's minimum near -0.75).
MATH = {torch.float32: 1e-6, torch.float16: 1e-6, torch.bfloat16: 1e-6, torch.float64: 1e-14}
# The column sums' accumulation (float32 for 16-bit and float32 data), relative to the sum of the terms'
# magnitudes. The longest chain of additions a column sees here is under 150 (CPU: the 128 rows of a tile,
# then the tiles, at most 8 at these sizes; CUDA's chains are shorter), whose worst-case bound is
# 150 x 2^-24 = 9e-6.
ACCUMULATION = {torch.float32: 1e-5, torch.float16: 1e-5, torch.bfloat16: 1e-5, torch.float64: 1e-13}


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


def activation_bias_grad(*args, **kwargs):
    return ops("fused_dense").fused_dense_activation_bias_grad(*args, **kwargs)


def activate(x: torch.Tensor, activation: str) -> torch.Tensor:
    return {"none": lambda t: t, "relu": torch.relu, "sigmoid": torch.sigmoid, "gelu": F.gelu,
            "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[activation](x)


def saved_of(x: torch.Tensor, activation: str) -> torch.Tensor:
    """What a forward keeps for the backward: GELU's input, ReLU's and sigmoid's output (x for none)."""
    return x if activation in ("none", "gelu", "gelu_tanh") else activate(x.double(), activation).to(x.dtype)


def reference_grad_input(grad: torch.Tensor, saved: torch.Tensor, activation: str) -> torch.Tensor:
    """grad * activation'(saved) in float64, with the derivative taken from saved as the op defines it."""
    g, s = grad.double(), saved.double()
    if activation == "relu":
        return g * (s > 0)
    if activation == "sigmoid":
        return g * s * (1 - s)
    if activation in ("gelu", "gelu_tanh"):
        x = s.clone().requires_grad_()
        (result,) = torch.autograd.grad(activate(x, activation), x, g)
        return result
    return g


def make_case(rows, cols, dtype, device, activation, lead=()):
    grad = torch.randn(*lead, rows, cols, dtype=torch.float64).to(dtype).to(device)
    x = (2 * torch.randn(*lead, rows, cols, dtype=torch.float64)).to(dtype).to(device)
    return grad, saved_of(x, activation)


def assert_grad_input_near(actual, grad, saved, activation):
    expected = reference_grad_input(grad, saved, activation)
    dtype = grad.dtype
    assert actual.dtype == dtype and actual.shape == grad.shape
    scale = expected.abs().max().item() if expected.numel() else 1.0
    tol = 2 * ROUNDOFF[dtype] + MATH[dtype]
    torch.testing.assert_close(actual.double(), expected, rtol=tol, atol=MATH[dtype] * scale)


def assert_column_sums(grad_bias, terms, dtype, term_rtol=0.0, term_atol=0.0):
    """grad_bias within its accumulation error and final rounding of the column sums (in float64) of terms
    [..., cols], each term known to within term_rtol of its magnitude plus term_atol."""
    assert grad_bias.dtype == dtype and grad_bias.shape == terms.shape[-1:]
    terms = terms.double().reshape(-1, terms.shape[-1])
    exact = terms.sum(0)
    bound = ((ACCUMULATION[dtype] + term_rtol) * terms.abs().sum(0) + terms.shape[0] * term_atol
             + ROUNDOFF[dtype] * exact.abs())
    error = (grad_bias.double() - exact).abs()
    assert bool((error <= bound).all()), f"largest excess {(error - bound).max().item()}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("rows,cols", SHAPES)
def test_matches_reference(device, dtype, activation, rows, cols):
    grad, saved = make_case(rows, cols, dtype, device, activation)
    grad_input, grad_bias = activation_bias_grad(grad, saved, activation)
    assert_grad_input_near(grad_input, grad, saved, activation)
    # The bias gradient is the sum of grad_input as stored (rounded to dtype), as eager's grad_input.sum(0):
    # held to float32 accumulation error, which summing the unrounded products would exceed for 16-bit data.
    assert_column_sums(grad_bias, grad_input, dtype)
    # And eager's answer: the sums of the float64 reference's grad_input rounded to dtype, each of which
    # may round to the neighbour of ours.
    eager_terms = reference_grad_input(grad, saved, activation)
    scale = eager_terms.abs().max().item() if eager_terms.numel() else 1.0
    assert_column_sums(grad_bias, eager_terms.to(dtype), dtype, term_rtol=2 * ROUNDOFF[dtype] + MATH[dtype],
                       term_atol=MATH[dtype] * scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_output_mask(device, dtype, activation):
    """Each output alone: the bias gradient alone is the sum of the grad_input it does not write; grad_input
    alone (the elementwise kernel) is the pass's. Separately compiled loops may contract the derivative's
    float32 arithmetic differently (FMA), so a term may round to its neighbour."""
    grad, saved = make_case(300, 136, dtype, device, activation)
    grad_input, grad_bias = activation_bias_grad(grad, saved, activation)
    no_input, bias_only = activation_bias_grad(grad, saved, activation, [False, True])
    input_only, no_bias = activation_bias_grad(grad, saved, activation, [True, False])
    assert no_input.numel() == 0 and no_bias.numel() == 0
    scale = grad_input.abs().max().item()
    assert_column_sums(bias_only, grad_input, dtype, term_rtol=2 * ROUNDOFF[dtype], term_atol=MATH[dtype] * scale)
    torch.testing.assert_close(input_only, grad_input, rtol=2 * ROUNDOFF[dtype], atol=MATH[dtype] * scale)


@pytest.mark.parametrize("device", DEVICES)
def test_none_needs_no_saved(device):
    grad = make_case(5, 9, torch.float32, device, "none")[0]
    grad_input, grad_bias = activation_bias_grad(grad, None)
    assert torch.equal(grad_input, grad) and grad_input.data_ptr() != grad.data_ptr()
    torch.testing.assert_close(grad_bias, grad.sum(0))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_relu_matches_eager(device, dtype):
    """ReLU's grad_input is exact (grad or 0), so eager's threshold_backward gives the same bits; the bias
    gradient then differs from eager's grad_input.sum(0) only in float32 summation order and rounding."""
    grad, saved = make_case(1000, 264, dtype, device, "relu")
    grad_input, grad_bias = activation_bias_grad(grad, saved, "relu")
    eager_input = torch.ops.aten.threshold_backward(grad, saved, 0)
    assert torch.equal(grad_input, eager_input)
    eager_bias = eager_input.sum(0)
    # Both within their accumulation error and rounding of the exact sums: of each other within twice that.
    bound = 2 * (ACCUMULATION[dtype] * eager_input.double().abs().sum(0) + ROUNDOFF[dtype] * eager_bias.double().abs())
    assert bool(((grad_bias.double() - eager_bias.double()).abs() <= bound).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_empty(device, activation):
    grad, saved = make_case(0, 6, torch.bfloat16, device, activation)
    grad_input, grad_bias = activation_bias_grad(grad, saved, activation)
    assert grad_input.shape == (0, 6) and torch.equal(grad_bias, torch.zeros(6, dtype=torch.bfloat16, device=device))
    grad, saved = make_case(0, 5, torch.float32, device, activation, lead=(3,))  # [3, 0, 5]: no rows either
    assert torch.equal(activation_bias_grad(grad, saved, activation)[1], torch.zeros(5, device=device))
    grad, saved = make_case(4, 0, torch.float32, device, activation)
    grad_input, grad_bias = activation_bias_grad(grad, saved, activation)
    assert grad_input.shape == (4, 0) and grad_bias.shape == (0,)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strided_and_nd_inputs(device, dtype):
    """Transposed, sliced and offset views, and N-D [..., features] inputs, give the contiguous results."""
    grad, saved = make_case(200, 72, dtype, device, "gelu")
    expected = activation_bias_grad(grad, saved, "gelu")
    views = [(grad.t().contiguous().t(), saved), (grad, torch.cat([saved, saved], 1)[:, :72]),
             (torch.cat([grad, grad], 1)[:, 72:], saved.t().contiguous().t())]
    for g, s in views:
        assert not (g.is_contiguous() and s.is_contiguous())
        for actual, want in zip(activation_bias_grad(g, s, "gelu"), expected):
            assert torch.equal(actual, want)
    # One element into its storage: not 16-byte aligned, so CUDA takes its scalar path (the same formula and
    # order of additions, in another instantiation: a term may round to its neighbour).
    offset = torch.empty(200 * 72 + 1, dtype=dtype, device=device)[1:].view(200, 72)
    offset.copy_(grad)
    grad_input, grad_bias = activation_bias_grad(offset, saved, "gelu")
    scale = expected[0].abs().max().item()
    torch.testing.assert_close(grad_input, expected[0], rtol=2 * ROUNDOFF[dtype], atol=MATH[dtype] * scale)
    assert_column_sums(grad_bias, expected[0], dtype, term_rtol=2 * ROUNDOFF[dtype], term_atol=MATH[dtype] * scale)
    grad_input, grad_bias = activation_bias_grad(grad.view(4, 50, 72), saved.view(4, 50, 72), "gelu")
    assert grad_input.shape == (4, 50, 72)
    assert torch.equal(grad_input.view(200, 72), expected[0]) and torch.equal(grad_bias, expected[1])


def test_cpu_result_does_not_depend_on_thread_count():
    grad, saved = make_case(1000, 4100, torch.bfloat16, "cpu", "sigmoid")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = activation_bias_grad(grad, saved, "sigmoid")
        torch.set_num_threads(max(threads, 2))
        parallel = activation_bias_grad(grad, saved, "sigmoid")
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(single[0], parallel[0]) and torch.equal(single[1], parallel[1])


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_raises_before_launch(device):
    grad = torch.randn(4, 6, device=device)
    with pytest.raises(RuntimeError, match="grad must be float32"):
        activation_bias_grad(grad.long(), grad.long(), "relu")
    with pytest.raises(RuntimeError, match="at least 1-D"):
        activation_bias_grad(grad[0, 0], grad[0, 0], "relu")
    with pytest.raises(RuntimeError, match="activation must be 'none', 'relu', 'sigmoid', 'gelu' or 'gelu_tanh'"):
        activation_bias_grad(grad, grad, "tanh")
    with pytest.raises(RuntimeError, match="activation 'gelu' needs saved"):
        activation_bias_grad(grad, None, "gelu")
    with pytest.raises(RuntimeError, match=r"saved must have grad's shape \[4, 6\]"):
        activation_bias_grad(grad, grad[:, :5], "relu")
    with pytest.raises(RuntimeError, match="saved must have grad's dtype"):
        activation_bias_grad(grad, grad.double(), "relu")
    with pytest.raises(RuntimeError, match="saved is on meta"):
        activation_bias_grad(grad, grad.to("meta"), "relu")


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    grad, saved = make_case(33, 24, torch.float32, device, "gelu")
    op = ops("fused_dense").fused_dense_activation_bias_grad
    for activation in ACTIVATIONS:
        opcheck(op, (grad, saved_of(saved, activation), activation))
    opcheck(op, (grad, None, "none", [False, True]))
    opcheck(op, (grad.view(3, 11, 24), saved.view(3, 11, 24), "relu", [True, False]))


@pytest.mark.parametrize("device", DEVICES)
def test_compiles_with_fullgraph_dynamic(device):
    torch._dynamo.reset()

    def step(grad, x):
        grad_input, grad_bias = activation_bias_grad(grad, x, "gelu")
        return grad_input * 2, grad_bias + 1

    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    for rows in (5, 9):
        grad, x = make_case(rows, 24, torch.float32, device, "gelu")
        for actual, expected in zip(compiled(grad, x), step(grad, x)):
            torch.testing.assert_close(actual, expected)


# ---- GPU-only: a grid that loops over its work items, bitwise determinism ---------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("cols", [4104, 4100])  # 16-byte packs; scalar columns for bf16
def test_cuda_large_is_bitwise_deterministic(dtype, activation, cols):
    """16384 rows: more (tile, strip) work items than a GPU holds blocks at once. Two runs give the same
    bits, and the results match the reference."""
    grad, saved = make_case(16384, cols, dtype, "cuda", activation)
    first = activation_bias_grad(grad, saved, activation)
    second = activation_bias_grad(grad, saved, activation)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    assert_grad_input_near(first[0], grad, saved, activation)
    assert_column_sums(first[1], first[0], dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_cuda_matches_cpu(activation):
    grad, saved = make_case(700, 520, torch.bfloat16, "cpu", activation)
    cpu = activation_bias_grad(grad, saved, activation)
    cuda = activation_bias_grad(grad.cuda(), saved.cuda(), activation)
    # CPU and CUDA may round a term to neighbouring values (float32 erf / exp differ in their last bits),
    # and where GELU's derivative cancels to near zero those bits are a large part of the value.
    torch.testing.assert_close(cuda[0].cpu(), cpu[0], rtol=2 * ROUNDOFF[torch.bfloat16],
                               atol=MATH[torch.bfloat16] * cpu[0].abs().max().item())
    assert_column_sums(cuda[1].cpu(), cpu[0], torch.bfloat16, term_rtol=2 * ROUNDOFF[torch.bfloat16],
                       term_atol=MATH[torch.bfloat16] * cpu[0].abs().max().item())
