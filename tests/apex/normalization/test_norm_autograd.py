"""The norms' autograd: one C++ formula per forward op (no Python per call), for eager and traced calls."""
import pytest
import torch
from torch.utils.checkpoint import checkpoint

from apex.normalization import (
    FusedLayerNorm,
    fused_layer_norm_affine,
    fused_rms_norm_affine,
    mixed_dtype_fused_layer_norm_affine,
    mixed_dtype_fused_rms_norm_affine,
)

from norm_reference import DEVICES


def forward_and_grads(fn, x, params, dy):
    x = x.detach().requires_grad_()
    params = [p.detach().requires_grad_() for p in params]
    y = fn(x, *params)
    grads = torch.autograd.grad(y, [x, *params], dy)
    return y, grads


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("memory_efficient", [False, True], ids=["keep_input", "memory_efficient"])
@pytest.mark.parametrize("param_dtype", [torch.bfloat16, torch.float32], ids=["same_dtype", "float32_params"])
def test_functional_is_the_op(device, rms, memory_efficient, param_dtype):
    """The functional API adds nothing to the op: same outputs and grads, bit for bit, through one C++ node."""
    torch.manual_seed(0)
    shape = [4, 8]
    x = torch.randn(3, 4, 8, device=device, dtype=torch.bfloat16)
    params = [torch.randn(shape, device=device, dtype=param_dtype) for _ in range(1 if rms else 2)]
    dy = torch.randn(3, 4, 8, device=device, dtype=param_dtype)  # the mixed forms output the parameters' dtype
    if rms:
        api = lambda x, w: mixed_dtype_fused_rms_norm_affine(x, w, shape, 1e-5, memory_efficient)  # noqa: E731
        op = lambda x, w: torch.ops.apex.rms_norm_fwd(x, shape, w, 1e-5, memory_efficient)[0]  # noqa: E731
    else:
        api = lambda x, w, b: mixed_dtype_fused_layer_norm_affine(x, w, b, shape, 1e-5, memory_efficient)  # noqa
        op = lambda x, w, b: torch.ops.apex.layer_norm_fwd(x, shape, w, b, 1e-5, memory_efficient)[0]  # noqa
    y, grads = forward_and_grads(api, x, params, dy)
    assert type(y.grad_fn).__name__ == "CppFunction"  # the C++ formula, no Python autograd.Function
    y_ref, grads_ref = forward_and_grads(op, x, params, dy)
    assert y.dtype == y_ref.dtype == param_dtype
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
    for got, want in zip(grads, grads_ref):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_without_grad_mode_no_graph(rms, mode):
    x, w, b = torch.randn(5, 16, requires_grad=True), torch.randn(16, requires_grad=True), torch.randn(16)
    norm = (lambda: fused_rms_norm_affine(x, w, (16,), 1e-5, True)) if rms else \
        (lambda: fused_layer_norm_affine(x, w, b, (16,), 1e-5, True))
    with mode():
        y = norm()
    assert y.grad_fn is None and not y.requires_grad
    torch.testing.assert_close(y, norm().detach(), rtol=0, atol=0)


def test_only_the_statistics_used():
    """A graph that uses mean / invvar only: they are not differentiable, so nothing flows back."""
    x = torch.randn(4, 8, requires_grad=True)
    out, mean, invvar = torch.ops.apex.layer_norm_fwd(x, [8], None, None, 1e-5)
    assert out.requires_grad and not mean.requires_grad and not invvar.requires_grad


def test_double_backward_is_refused():
    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, requires_grad=True)
    y = fused_rms_norm_affine(x, w, (8,))
    (gx,) = torch.autograd.grad(y.square().sum(), [x], create_graph=True)
    with pytest.raises(RuntimeError, match="rms_norm_bwd"):
        gx.sum().backward()


def test_under_vmap():
    """vmap runs the op through torch's per-sample fallback."""
    x, w, b = torch.randn(2, 3, 16), torch.randn(16), torch.randn(16)
    y = torch.func.vmap(lambda x: fused_layer_norm_affine(x, w, b, (16,), 1e-5))(x)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (16,), w, b, 1e-5))


@pytest.mark.parametrize("memory_efficient", [False, True], ids=["keep_input", "memory_efficient"])
def test_activation_checkpointing(memory_efficient):
    """Non-reentrant checkpointing recomputes the forward in backward; gradients must not change."""
    torch.manual_seed(0)
    x, w, b = torch.randn(6, 32), torch.randn(32), torch.randn(32)
    dy = torch.randn(6, 32)
    norm = lambda x, w, b: fused_layer_norm_affine(x, w, b, (32,), 1e-5, memory_efficient).sin()  # noqa: E731
    _, plain = forward_and_grads(norm, x, [w, b], dy)
    _, checkpointed = forward_and_grads(lambda *a: checkpoint(norm, *a, use_reentrant=False), x, [w, b], dy)
    for got, want in zip(checkpointed, plain):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_module_under_autocast_backward(device):
    """Under autocast the weight is cast to the autocast dtype; its grad comes back in float32."""
    module = FusedLayerNorm(32).to(device)
    x = torch.randn(4, 32, device=device, requires_grad=True)
    with torch.autocast(device_type=device, dtype=torch.bfloat16):
        y = module(x)
    y.float().sum().backward()
    assert y.dtype == torch.bfloat16 and module.weight.grad.dtype == torch.float32 and x.grad.dtype == torch.float32


@pytest.mark.parametrize("memory_efficient", [False, True], ids=["keep_input", "memory_efficient"])
def test_graph_frees_what_it_saved(memory_efficient):
    """The C++ node lets its saved tensors go with the graph, also a saved output (which refers back to it)."""
    import gc
    import weakref

    class Box:
        def __init__(self, t):
            self.t = t

    boxes = []

    def pack(t):
        box = Box(t.detach())  # not t: a saved output refers to the node, which holds the box (a cycle)
        boxes.append(weakref.ref(box))
        return box

    module = FusedLayerNorm(8, memory_efficient=memory_efficient)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda box: box.t):
        y = module(torch.randn(3, 8, requires_grad=True))
        kept = module(torch.randn(3, 8, requires_grad=True))
    kept.sum().backward()  # a used graph frees its saved tensors too
    assert boxes
    del y, kept
    gc.collect()
    assert all(ref() is None for ref in boxes)
