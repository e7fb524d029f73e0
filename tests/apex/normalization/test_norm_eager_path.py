"""Eager calls take a plain autograd.Function (less host time); it must agree exactly with the custom op's
registered autograd, which torch.compile / export / torch.func still use."""
import pytest
import torch
from torch.utils.checkpoint import checkpoint

from apex.normalization import (
    fused_layer_norm_affine,
    fused_rms_norm_affine,
    mixed_dtype_fused_layer_norm_affine,
    mixed_dtype_fused_rms_norm_affine,
)
from apex.normalization._ops import ensure_loaded

from norm_reference import DEVICES


def forward_and_grads(fn, x, params, dy):
    x = x.detach().requires_grad_()
    params = [p.detach().requires_grad_() for p in params]
    y = fn(x, *params)
    grads = torch.autograd.grad(y, [x, *params], dy)
    return y, grads


def through_registered_autograd(rms, shape, memory_efficient):
    """The same norm through torch.ops.apex.* called directly, i.e. register_autograd's formulas."""
    if rms:
        return lambda x, w: torch.ops.apex.rms_norm_fwd(x, shape, w, 1e-5, memory_efficient)[0]
    return lambda x, w, b: torch.ops.apex.layer_norm_fwd(x, shape, w, b, 1e-5, memory_efficient)[0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("memory_efficient", [False, True], ids=["keep_input", "memory_efficient"])
@pytest.mark.parametrize("param_dtype", [torch.bfloat16, torch.float32], ids=["same_dtype", "float32_params"])
def test_eager_function_matches_registered_autograd(device, rms, memory_efficient, param_dtype):
    ensure_loaded()
    torch.manual_seed(0)
    shape = [4, 8]
    x = torch.randn(3, 4, 8, device=device, dtype=torch.bfloat16)
    params = [torch.randn(shape, device=device, dtype=param_dtype) for _ in range(1 if rms else 2)]
    dy = torch.randn(3, 4, 8, device=device, dtype=param_dtype)  # the mixed forms output the parameters' dtype
    if rms:
        eager = lambda x, w: mixed_dtype_fused_rms_norm_affine(x, w, shape, 1e-5, memory_efficient)  # noqa: E731
    else:
        eager = lambda x, w, b: mixed_dtype_fused_layer_norm_affine(x, w, b, shape, 1e-5, memory_efficient)  # noqa
    y, grads = forward_and_grads(eager, x, params, dy)
    assert "NormFunctionBackward" in type(y.grad_fn).__name__  # the eager Function, not the op's generated one
    y_ref, grads_ref = forward_and_grads(through_registered_autograd(rms, shape, memory_efficient), x, params, dy)
    assert y.dtype == y_ref.dtype == param_dtype
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
    for got, want in zip(grads, grads_ref):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_without_grad_mode_no_graph(rms, mode):
    x, w, b = torch.randn(5, 16, requires_grad=True), torch.randn(16, requires_grad=True), torch.randn(16)
    norm = (lambda: fused_rms_norm_affine(x, w, (16,), 1e-5)) if rms else \
        (lambda: fused_layer_norm_affine(x, w, b, (16,), 1e-5))
    with mode():
        y = norm()
    assert y.grad_fn is None and not y.requires_grad
    torch.testing.assert_close(y, norm().detach(), rtol=0, atol=0)


def test_under_vmap():
    """torch.func transforms take the custom op (a plain autograd.Function cannot run under them)."""
    x, w, b = torch.randn(2, 3, 16), torch.randn(16), torch.randn(16)
    y = torch.func.vmap(lambda x: fused_layer_norm_affine(x, w, b, (16,), 1e-5))(x)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (16,), w, b, 1e-5))


@pytest.mark.parametrize("memory_efficient", [False, True], ids=["keep_input", "memory_efficient"])
def test_activation_checkpointing(memory_efficient):
    """Non-reentrant checkpointing recomputes the eager Function in backward; gradients must not change."""
    torch.manual_seed(0)
    x, w, b = torch.randn(6, 32), torch.randn(32), torch.randn(32)
    dy = torch.randn(6, 32)
    norm = lambda x, w, b: fused_layer_norm_affine(x, w, b, (32,), 1e-5, memory_efficient).sin()  # noqa: E731
    _, plain = forward_and_grads(norm, x, [w, b], dy)
    _, checkpointed = forward_and_grads(lambda *a: checkpoint(norm, *a, use_reentrant=False), x, [w, b], dy)
    for got, want in zip(checkpointed, plain):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
