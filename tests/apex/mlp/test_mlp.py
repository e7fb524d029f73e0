"""apex.mlp.MLP against nn.Sequential(Linear, activation, ...) in float64 on CPU and (marker gpu) CUDA:
every activation, with and without biases, over dtypes and odd / aligned / empty shapes; NVIDIA apex's
mlp_cuda face; autocast; tracing; bad input."""
import pytest
import torch
from torch import nn
from torch.library import opcheck

import mlp_cuda
from apex.mlp import MLP, MlpFunction, mlp_function

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# Relative to the reference's largest magnitude; the reference rounds where the MLP stores (RoundTo).
TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 4e-2, torch.float64: 1e-10}
ACTIVATIONS = {"none": None, "relu": nn.ReLU, "sigmoid": nn.Sigmoid}


class RoundTo(nn.Module):
    """Rounds a float64 tensor to `dtype` (and its gradient, on the way back) where the fused MLP stores
    it in dtype: each layer's pre-activation (forward: the GEMM's output before a separate activation
    pass; backward: the gradient there) and output. With every such rounding in the reference (and
    ReLU's decisions at zero taken from the fused path: ReluWithSigns), the fused result differs from
    it only by its final rounding and float32 accumulation, so the tolerances hold at any shape, also
    where an output cancels."""

    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype

    def forward(self, x):
        return x.to(self.dtype).double()


class ReluWithSigns(nn.Module):
    """ReLU on the signs the fused MLP decided: `positive` is where its stored layer output is > 0 (what its
    backward reads, as torch.relu's does). A pre-activation within the fused path's float32 accumulation
    error of zero may land on the other side of it than the float64 reference's; its forward difference is
    tiny, but its gradient differs by a whole incoming gradient element, which no tolerance on the rest
    absorbs (at upstream's sizes, fp16, a handful of such elements fail the input gradient). So the
    reference takes the fused decisions, having checked that each differing one lies within the layer's
    forward tolerance of zero (`tolerance` times its largest pre-activation, as assert_near measures)."""

    def __init__(self, positive, tolerance):
        super().__init__()
        self.positive, self.tolerance = positive, tolerance

    def forward(self, z):
        differing = z.detach()[self.positive != (z > 0)]
        if differing.numel():
            atol = self.tolerance * max(z.detach().abs().max().item(), 1e-3)
            assert differing.abs().max() <= atol, f"a fused ReLU decision {differing.abs().max()} away from zero"
        return z.masked_fill(~self.positive, 0.0)


def fused_relu_signs(mlp: MLP, x: torch.Tensor) -> list[torch.Tensor]:
    """Per layer, where the fused MLP's stored output of that layer is positive."""
    with torch.no_grad():
        output, *hidden = mlp_cuda.forward(mlp.bias, mlp.activation, [x, *mlp.weights, *mlp.biases])
    return [stored > 0 for stored in hidden + [output]]


def reference_of(mlp: MLP, activation: str, round_to=None, relu_signs=None) -> nn.Sequential:
    """The float64 nn.Sequential with mlp's parameters (each layer's output rounded to `round_to`; ReLU on
    `relu_signs`, the fused decisions, when given, see ReluWithSigns)."""
    layers = []
    for i in range(mlp.num_layers):
        linear = nn.Linear(mlp.mlp_sizes[i], mlp.mlp_sizes[i + 1], bias=bool(mlp.bias)).double()
        with torch.no_grad():
            linear.weight.copy_(mlp.weights[i])
            if mlp.bias:
                linear.bias.copy_(mlp.biases[i])
        layers.append(linear)
        if ACTIVATIONS[activation] is not None:
            if round_to is not None:
                layers.append(RoundTo(round_to))
            if activation == "relu" and relu_signs is not None:
                layers.append(ReluWithSigns(relu_signs[i], TOL[mlp.weights[i].dtype]))
            else:
                layers.append(ACTIVATIONS[activation]())
        if round_to is not None:
            layers.append(RoundTo(round_to))
    return nn.Sequential(*layers).to(mlp.weights[0].device)


def assert_near(actual, expected, dtype):
    assert actual.dtype == dtype and actual.shape == expected.shape
    scale = expected.abs().max().item() if expected.numel() else 1.0
    torch.testing.assert_close(actual.double(), expected, rtol=TOL[dtype], atol=TOL[dtype] * max(scale, 1e-3))


def check_mlp(sizes, lead, activation, bias, dtype, device, input_requires_grad=True):
    torch.manual_seed(0)
    mlp = MLP(sizes, bias=bias, activation=activation).to(device).to(dtype)
    x = torch.empty(*lead, sizes[0], dtype=torch.float64).uniform_(-1, 1).to(dtype).to(device)
    check_against_reference(mlp, x, input_requires_grad)


def check_against_reference(mlp: MLP, x: torch.Tensor, input_requires_grad=True):
    """mlp's output and gradients (input's, weights', biases') against the float64 reference."""
    dtype = x.dtype
    activation = list(ACTIVATIONS)[mlp.activation]  # in apex's numbering
    reference = reference_of(mlp, activation, round_to=dtype if dtype in (torch.float16, torch.bfloat16) else None,
                             relu_signs=fused_relu_signs(mlp, x) if activation == "relu" else None)
    x_mine = x.clone().requires_grad_(input_requires_grad)
    x_ref = x.double().requires_grad_(input_requires_grad)
    out, expected = mlp(x_mine), reference(x_ref)
    assert_near(out, expected.detach(), dtype)
    grad = torch.randn(out.shape, dtype=torch.float64).to(dtype).to(x.device)
    out.backward(grad)
    expected.backward(grad.double())
    if input_requires_grad:
        assert_near(x_mine.grad, x_ref.grad, dtype)
    linears = [m for m in reference if isinstance(m, nn.Linear)]
    for i, linear in enumerate(linears):
        assert_near(mlp.weights[i].grad, linear.weight.grad, dtype)
        if mlp.bias:
            assert_near(mlp.biases[i].grad, linear.bias.grad, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("sizes,lead", [([13, 32, 7, 1], (9,)),    # odd sizes down to one output
                                        ([16, 24, 8], (2, 5)),     # multiples of 8, N-D input
                                        ([5, 3], (1,)),            # one layer, batch 1
                                        ([4, 6, 2], ())])          # a single 1-D sample
def test_mlp_matches_sequential(device, dtype, activation, bias, sizes, lead):
    check_mlp(sizes, lead, activation, bias, dtype, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_relu_gradient_follows_the_stored_output(device, dtype):
    """Pre-activations 4096 - 4096 + 2^-20, the small term at another position in each row: float32
    accumulation loses it in some row whatever its summation order, storing an output of exactly 0 there,
    whose ReLU gradient is then 0 (torch.relu's rule on the stored output), although the exact value is
    positive. A float64 reference deciding the signs itself differs there by whole gradient elements (what
    failed upstream's sizes in fp16 on an H100); ReluWithSigns takes the fused decisions, checked to be
    within the tolerance of zero."""
    big, small = 2.0 ** 12, 2.0 ** -20
    x = torch.tensor([[big, -big, small, 1.0], [big, small, -big, 1.0], [small, big, -big, 1.0]])
    mlp = MLP([4, 2, 1], bias=False, activation="relu")
    with torch.no_grad():
        mlp.weight_0.copy_(torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]]))  # the sum; a constant 1
        mlp.weight_1.fill_(1.0)
    torch.manual_seed(0)
    check_against_reference(mlp.to(device).to(dtype), x.to(device).to(dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_input_without_grad(device):
    """Only weight gradients (upstream's test_no_grad): the input's GEMM is skipped."""
    check_mlp([12, 20, 3], (6,), "relu", True, torch.float32, device, input_requires_grad=False)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch(device):
    mlp = MLP([6, 8, 3]).to(device)
    x = torch.zeros(0, 6, device=device, requires_grad=True)
    out = mlp(x)
    assert out.shape == (0, 3)
    out.sum().backward()
    assert x.grad.shape == (0, 6)
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in mlp.parameters())


@pytest.mark.parametrize("device", DEVICES)
def test_strided_input(device):
    torch.manual_seed(0)
    mlp = MLP([10, 16, 4]).to(device)
    wide = torch.randn(20, 31, device=device)
    for x in (wide[:, 3:13], wide.t()[:10].t(), wide[::3, :20:2]):
        torch.testing.assert_close(mlp(x), reference_of(mlp, "relu")(x.double()).float(), rtol=1e-4, atol=1e-5)


def test_module_parameters():
    mlp = MLP([4, 8, 2], bias=True, activation="sigmoid")
    assert mlp.num_layers == 2 and mlp.activation == 2 and mlp.bias == 1
    assert set(mlp.state_dict()) == {"weight_0", "weight_1", "bias_0", "bias_1"}
    assert [tuple(w.shape) for w in mlp.weights] == [(8, 4), (2, 8)]
    assert mlp.weights[0] is mlp.weight_0 and mlp.biases[1] is mlp.bias_1
    no_bias = MLP([4, 8, 2], bias=False, activation="none")
    assert no_bias.biases == [] and "Bias=0" in repr(no_bias)
    with pytest.raises(TypeError, match="activation"):
        MLP([4, 2], activation="tanh")
    half = MLP([4, 8, 2]).half()  # the lists follow a dtype conversion
    assert all(w.dtype == torch.float16 for w in half.weights + half.biases)


@pytest.mark.parametrize("device", DEVICES)
def test_historical_face(device):
    """mlp_cuda.forward / backward as upstream's MlpFunction calls them."""
    torch.manual_seed(0)
    mlp = MLP([8, 16, 4]).to(device)
    x = torch.randn(5, 8, device=device)
    args = (x, *mlp.weights, *mlp.biases)
    outputs = mlp_cuda.forward(1, 1, args)
    reference = reference_of(mlp, "relu")
    torch.testing.assert_close(outputs[0], reference(x.double()).float(), rtol=1e-4, atol=1e-5)
    grad = torch.randn(5, 4, device=device)
    grads = mlp_cuda.backward(1, 1, grad, outputs, args)
    x_ref = x.double().requires_grad_()
    reference(x_ref).backward(grad.double())
    expected = [x_ref.grad] + [m.weight.grad for m in reference[::2]] + [m.bias.grad for m in reference[::2]]
    assert len(grads) == len(expected)
    for mine, want in zip(grads, expected):
        torch.testing.assert_close(mine.double(), want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(MlpFunction.apply(1, 1, *args), outputs[0])
    torch.testing.assert_close(mlp_function(1, 1, *args), outputs[0])
    assert {"forward", "backward"} <= set(dir(mlp_cuda))


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_casts_like_apex(device):
    dtype = torch.bfloat16 if device == "cpu" else torch.float16
    mlp = MLP([8, 16, 4]).to(device)
    x = torch.randn(3, 8, device=device)
    with torch.autocast(device, dtype=dtype):
        out = mlp(x)
    assert out.dtype == dtype
    out.float().sum().backward()
    assert mlp.weight_0.grad.dtype == torch.float32


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_raises_before_launch(device):
    mlp = MLP([6, 4, 2]).to(device)
    x = torch.randn(3, 6, device=device)
    with pytest.raises(RuntimeError, match="activation must be 0"):
        mlp_function(1, 3, x, *mlp.weights, *mlp.biases)
    with pytest.raises(RuntimeError, match="inputs must be"):
        mlp_function(1, 1, x, *mlp.weights, mlp.bias_0)
    with pytest.raises(RuntimeError, match="weight_0 must have 5 columns"):
        mlp(torch.randn(3, 5, device=device))
    with pytest.raises(RuntimeError, match="weight_1 must have the input's dtype"):
        mlp_function(1, 1, x, mlp.weight_0, mlp.weight_1.double(), *mlp.biases)
    with pytest.raises(RuntimeError, match="must be float32"):
        mlp_function(0, 1, x.long(), *[w.long() for w in mlp.weights])
    with pytest.raises(RuntimeError, match="fprop_outputs must be"):
        mlp_cuda.backward(1, 1, torch.randn(3, 2, device=device), [torch.randn(3, 2, device=device)],
                          (x, *mlp.weights, *mlp.biases))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True])
def test_compiles_with_fullgraph(device, dynamic):
    torch._dynamo.reset()
    torch.manual_seed(0)
    mlp = MLP([8, 16, 4], activation="sigmoid").to(device)
    compiled = torch.compile(lambda x: mlp(x).square().sum(), fullgraph=True, dynamic=dynamic)
    for rows in (5, 9):
        x = torch.randn(rows, 8, device=device, requires_grad=True)
        compiled(x).backward()
        x_ref = x.detach().requires_grad_()
        mlp(x_ref).square().sum().backward()
        torch.testing.assert_close(x.grad, x_ref.grad)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    mlp = MLP([8, 16, 4]).to(device)
    x = torch.randn(5, 8, device=device, requires_grad=True)
    inputs = [x, *mlp.weights, *mlp.biases]
    opcheck(torch.ops.apex.mlp_forward, (1, 1, inputs))
    opcheck(torch.ops.apex.mlp_forward, (0, 2, [x, *mlp.weights]))
    with torch.no_grad():
        outputs = torch.ops.apex.mlp_forward(1, 1, inputs)
    opcheck(torch.ops.apex.mlp_backward,
            (1, 1, torch.randn(5, 4, device=device), outputs, [t.detach() for t in inputs], False))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_cuda_upstream_sizes(dtype, activation):
    """NVIDIA/ROCm apex's tests/L0/run_mlp sizes: [480, 1024, 1024, 512, 256, 1], batch 1024."""
    check_mlp([480, 1024, 1024, 512, 256, 1], (1024,), activation, True, dtype, "cuda")
