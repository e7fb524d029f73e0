"""NVIDIA apex's `fused_layer_norm_cuda` functions (names, argument order, return lists)."""
import pytest
import torch

import fused_layer_norm_cuda

from norm_reference import DEVICES, assert_close_rel, reference_norm

EPS = 1e-5


def reference_grads(x, w, b, dy, rms):
    x64 = x.double().requires_grad_()
    params = [p.double().requires_grad_() for p in (w, b) if p is not None]
    y = reference_norm(x64, [x.shape[-1]], params[0] if w is not None else None,
                       params[1] if b is not None else None, EPS, rms)
    y.backward(dy.double())
    return y, x64.grad, [p.grad for p in params]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("memory_efficient", [False, True], ids=["keep_input", "memory_efficient"])
def test_layer_norm_functions(device, memory_efficient):
    x, w, b, dy = (torch.randn(s, device=device) for s in ((6, 40), (40,), (40,), (6, 40)))
    y64, gx64, (gw64, gb64) = reference_grads(x, w, b, dy, rms=False)

    out, mean, invvar = fused_layer_norm_cuda.forward_affine(x, [40], w, b, EPS)
    assert mean.shape == invvar.shape == (6,) and mean.dtype == torch.float32
    assert_close_rel(out, y64, torch.float32, "forward_affine")
    kept = out if memory_efficient else x
    gx, gw, gb = fused_layer_norm_cuda.backward_affine(dy, mean, invvar, kept, [40], w, b, EPS, memory_efficient)
    for got, ref, what in ((gx, gx64, "grad_input"), (gw, gw64, "grad_gamma"), (gb, gb64, "grad_beta")):
        assert_close_rel(got, ref, torch.float32, what)

    y64, gx64, _ = reference_grads(x, None, None, dy, rms=False)
    out, mean, invvar = fused_layer_norm_cuda.forward(x, [40], EPS)
    assert_close_rel(out, y64, torch.float32, "forward")
    gx = fused_layer_norm_cuda.backward(dy, mean, invvar, out if memory_efficient else x, [40], EPS,
                                        memory_efficient)
    assert_close_rel(gx, gx64, torch.float32, "backward")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("memory_efficient", [False, True], ids=["keep_input", "memory_efficient"])
def test_rms_norm_functions(device, memory_efficient):
    x, w, dy = (torch.randn(s, device=device) for s in ((6, 40), (40,), (6, 40)))
    y64, gx64, (gw64,) = reference_grads(x, w, None, dy, rms=True)

    out, invvar = fused_layer_norm_cuda.rms_forward_affine(x, [40], w, EPS)
    assert_close_rel(out, y64, torch.float32, "rms_forward_affine")
    gx, gw = fused_layer_norm_cuda.rms_backward_affine(dy, invvar, out if memory_efficient else x, [40], w, EPS,
                                                       memory_efficient)
    assert_close_rel(gx, gx64, torch.float32, "grad_input")
    assert_close_rel(gw, gw64, torch.float32, "grad_gamma")

    y64, gx64, _ = reference_grads(x, None, None, dy, rms=True)
    out, invvar = fused_layer_norm_cuda.rms_forward(x, [40], EPS)
    assert_close_rel(out, y64, torch.float32, "rms_forward")
    gx = fused_layer_norm_cuda.rms_backward(dy, invvar, out if memory_efficient else x, [40], EPS, memory_efficient)
    assert_close_rel(gx, gx64, torch.float32, "rms_backward")


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_dtypes_functions(device):
    x = torch.randn(3, 16, device=device, dtype=torch.bfloat16)
    w, b = torch.randn(16, device=device), torch.randn(16, device=device)
    out, mean, invvar = fused_layer_norm_cuda.forward_affine_mixed_dtypes(x, [16], w, b, EPS)
    assert out.dtype == torch.float32
    assert_close_rel(out, reference_norm(x, [16], w, b, EPS, rms=False), torch.bfloat16, "layer mixed")
    out, invvar = fused_layer_norm_cuda.rms_forward_affine_mixed_dtypes(x, [16], w, EPS)
    assert out.dtype == torch.float32
    assert_close_rel(out, reference_norm(x, [16], w, None, EPS, rms=True), torch.bfloat16, "rms mixed")


@pytest.mark.parametrize("device", DEVICES)
def test_memory_efficient_backward_without_mean(device):
    """NVIDIA apex's memory-efficient autograd Function keeps no mean and passes None for it."""
    x, w, b, dy = (torch.randn(s, device=device) for s in ((6, 40), (40,), (40,), (6, 40)))
    _, gx64, (gw64, gb64) = reference_grads(x, w, b, dy, rms=False)
    out, _, invvar = fused_layer_norm_cuda.forward_affine(x, [40], w, b, EPS)
    gx, gw, gb = fused_layer_norm_cuda.backward_affine(dy, None, invvar, out, [40], w, b, EPS, True)
    for got, ref, what in ((gx, gx64, "grad_input"), (gw, gw64, "grad_gamma"), (gb, gb64, "grad_beta")):
        assert_close_rel(got, ref, torch.float32, what)


def test_face_lists_nvidia_functions():
    names = set(dir(fused_layer_norm_cuda))
    assert {"forward", "forward_affine", "forward_affine_mixed_dtypes", "backward", "backward_affine", "rms_forward",
            "rms_forward_affine", "rms_forward_affine_mixed_dtypes", "rms_backward", "rms_backward_affine"} <= names
