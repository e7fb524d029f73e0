"""apex.contrib.index_mul_2d against in1[idx1] * in2 in float64 on CPU and (marker gpu) CUDA: values,
first and second derivatives, odd sizes, repeated and negative indices, the historical module,
tracing, and bad input."""
import pytest
import torch
from torch.library import opcheck

import fused_index_mul_2d
from apex.contrib.index_mul_2d import index_mul_2d

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# One rounding of a product; in1's gradient sums many rows in float32 then rounds once.
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 1e-3), torch.bfloat16: (1.6e-2, 1e-2),
       torch.float64: (1e-12, 1e-12)}
SHAPES = [(1, 1, 1), (5, 17, 3), (40, 300, 64), (7, 129, 13), (1000, 4099, 8)]  # (sources, rows, features)


def make(sources, rows, features, dtype, device, negative=False):
    in1 = torch.randn(sources, features, dtype=torch.float64).to(dtype).to(device)
    in2 = torch.randn(rows, features, dtype=torch.float64).to(dtype).to(device)
    idx = torch.randint(0, sources, (rows,))
    if negative:
        idx = idx - sources * torch.randint(0, 2, (rows,))
    return in1, in2, idx.to(device)


def reference(in1, in2, idx, grad_out):
    """Output and first derivatives in float64 by autograd, plus a second-order term."""
    a, b = in1.double().requires_grad_(), in2.double().requires_grad_()
    out = a[idx] * b
    ga, gb = torch.autograd.grad(out, (a, b), grad_out.double(), create_graph=True)
    second = torch.autograd.grad((ga ** 2).sum() + (gb ** 2).sum(), (a, b))
    return out.detach(), ga.detach(), gb.detach(), second


def assert_close(actual, expected, dtype, scale=1.0):
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(actual.double(), expected, rtol=rtol, atol=atol * scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sources,rows,features", SHAPES)
def test_matches_torch_to_second_order(device, dtype, sources, rows, features):
    in1, in2, idx = make(sources, rows, features, dtype, device, negative=True)
    grad_out = torch.randn(rows, features, dtype=torch.float64).to(dtype).to(device)
    out_ref, ga_ref, gb_ref, second_ref = reference(in1, in2, idx, grad_out)
    a, b = in1.clone().requires_grad_(), in2.clone().requires_grad_()
    out = index_mul_2d(a, b, idx)
    assert out.dtype == dtype and out.shape == (rows, features)
    assert_close(out, out_ref, dtype)
    ga, gb = torch.autograd.grad(out, (a, b), grad_out, create_graph=True)
    repeats = float(torch.bincount(idx % sources).max()) if rows else 1.0
    assert_close(ga, ga_ref, dtype, scale=repeats ** 0.5)
    assert_close(gb, gb_ref, dtype)
    second = torch.autograd.grad((ga.double() ** 2).sum() + (gb.double() ** 2).sum(), (a, b))
    assert_close(second[0], second_ref[0], dtype, scale=repeats)
    assert_close(second[1], second_ref[1], dtype, scale=repeats)


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    in1, in2, idx = make(4, 0, 6, torch.float32, device)
    assert index_mul_2d(in1, in2, idx).shape == (0, 6)
    in1, in2, idx = make(4, 5, 0, torch.float32, device)
    in1.requires_grad_()
    out = index_mul_2d(in1, in2, idx)
    assert out.shape == (5, 0)
    out.sum().backward()
    assert in1.grad.shape == (4, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_and_misaligned(device):
    in1, in2, idx = make(30, 50, 33, torch.float32, device)
    for a, b in ((in1[:, 1:], in2[:, 1:]), (in1.t().contiguous().t(), in2[::1]), (in1, in2[:, :32][:, 1:].clone())):
        if b.shape[1] != a.shape[1]:
            a = a[:, : b.shape[1]]
        a, b = a.detach().requires_grad_(), b.detach().requires_grad_()
        out = index_mul_2d(a, b, idx[: b.shape[0]])
        out.sum().backward()
        torch.testing.assert_close(out, a.detach()[idx] * b.detach())
        torch.testing.assert_close(b.grad, a.detach()[idx])


@pytest.mark.parametrize("device", DEVICES)
def test_out_of_range_index_gives_nan_row(device):
    in1, in2, idx = make(4, 3, 5, torch.float32, device)
    idx = torch.tensor([1, 4, -5], device=device)
    a = in1.clone().requires_grad_()
    out = index_mul_2d(a, in2, idx)
    out.sum().backward()
    assert out[0].isfinite().all() and out[1:].isnan().all()
    torch.testing.assert_close(a.grad[1], in2[0])
    assert (a.grad[[0, 2, 3]] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_historical_module(device, dtype):
    in1, in2, idx = make(6, 20, 8, dtype, device)
    grad_out = torch.randn_like(in2)
    forward = fused_index_mul_2d.float_forward if dtype == torch.float32 else fused_index_mul_2d.half_forward
    backward = fused_index_mul_2d.float_backward if dtype == torch.float32 else fused_index_mul_2d.half_backward
    out = torch.empty_like(in2)
    forward(out, in1, in2, idx)
    torch.testing.assert_close(out, in1[idx] * in2)
    grad_in1, grad_in2 = torch.zeros_like(in1), torch.empty_like(in2)
    backward(grad_in1, grad_in2, grad_out, in1, in2, idx)
    expected_in1 = torch.zeros_like(in1, dtype=torch.float64).index_add_(0, idx, (grad_out * in2).double())
    assert_close(grad_in1, expected_in1, dtype, scale=4)
    torch.testing.assert_close(grad_in2, grad_out * in1[idx])
    gg1, gg2 = torch.randn_like(in1), torch.randn_like(in2)
    ggo, g1, g2 = torch.empty_like(in2), torch.zeros_like(in1), torch.empty_like(in2)
    fused_index_mul_2d.float_backward_backward(ggo, g1, g2, grad_out, gg1, gg2, in1, in2, idx)
    assert_close(ggo, (gg1[idx] * in2 + in1[idx] * gg2).double(), dtype, scale=2)
    assert_close(g2, (gg1[idx] * grad_out).double(), dtype)
    assert_close(g1, torch.zeros_like(in1, dtype=torch.float64).index_add_(0, idx, (gg2 * grad_out).double()),
                 dtype, scale=4)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_raises_before_launch(device):
    in1, in2, idx = make(4, 6, 3, torch.float32, device)
    cases = [
        ((in1.long(), in2.long(), idx), "in1 must be float32"),
        ((in1, in2.double(), idx), "in2 must have in1's dtype"),
        ((in1[0], in2, idx), "must be 2-D"),
        ((in1[:, :2], in2, idx), "as many features"),
        ((in1, in2, idx.int()), "idx1 must be int64"),
        ((in1, in2, idx[:5]), r"idx1 must have shape \[6\]"),
        ((in1, in2.cpu() if device == "cuda" else in2.to("meta"), idx), "in2 is on"),
    ]
    for args, message in cases:
        with pytest.raises(RuntimeError, match=message):
            index_mul_2d(*args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True])
def test_compiles_with_fullgraph(device, dynamic):
    torch._dynamo.reset()

    def loss_fn(a, b, i):
        return (index_mul_2d(a, b, i).sin() * 2).sum()

    compiled = torch.compile(loss_fn, fullgraph=True, dynamic=dynamic)
    for rows in (9, 14):
        in1, in2, idx = make(5, rows, 7, torch.float32, device)
        a1, b1 = in1.clone().requires_grad_(), in2.clone().requires_grad_()
        a2, b2 = in1.clone().requires_grad_(), in2.clone().requires_grad_()
        compiled(a1, b1, idx).backward()
        loss_fn(a2, b2, idx).backward()
        torch.testing.assert_close(a1.grad, a2.grad)
        torch.testing.assert_close(b1.grad, b2.grad)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    in1, in2, idx = make(5, 9, 7, torch.float32, device)
    grad_out = torch.randn_like(in2)
    opcheck(torch.ops.apex.index_mul_2d, (in1.requires_grad_(), in2.requires_grad_(), idx))
    opcheck(torch.ops.apex.index_mul_2d_backward, (grad_out, in1.detach(), in2.detach(), idx))
    opcheck(torch.ops.apex.index_mul_2d_backward_backward,
            (torch.randn_like(in1), None, grad_out, in1.detach(), in2.detach(), idx))
