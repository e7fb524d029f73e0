"""torch.compile(fullgraph=True) traces through the fused norms (fake kernels + registered autograd)."""
import pytest
import torch

from apex.normalization import FusedLayerNorm, FusedRMSNorm, fused_layer_norm_affine
from apex.normalization._ops import ensure_loaded


def make_model(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), FusedLayerNorm(64), torch.nn.GELU(), torch.nn.Linear(64, 48),
        FusedRMSNorm((48,), memory_efficient=True),
    ).to(device)


def compiled_matches_eager(device, backend):
    model = make_model(device)
    x = torch.randn(8, 32, device=device, requires_grad=True)
    eager_out = model(x)
    eager_out.square().sum().backward()
    eager_grads = [x.grad.clone()] + [p.grad.clone() for p in model.parameters()]

    x.grad = None
    model.zero_grad()
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    out = compiled(x)
    out.square().sum().backward()
    torch.testing.assert_close(out, eager_out)
    for got, want in zip([x.grad] + [p.grad for p in model.parameters()], eager_grads):
        torch.testing.assert_close(got, want)


def test_compile_cpu_aot_eager():
    """Exercises the fake implementations and the autograd formulas through AOTAutograd."""
    compiled_matches_eager("cpu", "aot_eager")


@pytest.mark.slow
def test_compile_cpu_inductor():
    compiled_matches_eager("cpu", "inductor")


@pytest.mark.gpu
def test_compile_cuda_inductor():
    compiled_matches_eager("cuda", "inductor")


@pytest.mark.parametrize("op_args", [
    ("layer_norm_fwd", lambda x, w, b: (x, [16], w, b, 1e-5, False)),
    ("layer_norm_fwd", lambda x, w, b: (x, [16], None, None, 1e-5, True)),
    ("rms_norm_fwd", lambda x, w, b: (x, [16], w, 1e-5, False)),
], ids=["layer_affine", "layer_plain", "rms_affine"])
def test_opcheck(op_args):
    """torch.library.opcheck: schema, fake tensor and autograd registration agree with the kernels."""
    ensure_loaded()
    name, make = op_args
    x = torch.randn(4, 16, requires_grad=True)
    w, b = torch.randn(16, requires_grad=True), torch.randn(16, requires_grad=True)
    torch.library.opcheck(getattr(torch.ops.apex, name).default, make(x, w, b))


def test_functional_under_compile_dynamic_batch():
    """Changing the batch size re-traces (or uses a dynamic shape) without breaking the graph."""
    w, b = torch.randn(16), torch.randn(16)
    fn = torch.compile(lambda x: fused_layer_norm_affine(x, w, b, (16,), 1e-5), fullgraph=True, backend="aot_eager")
    for rows in (3, 5, 7):
        x = torch.randn(rows, 16)
        torch.testing.assert_close(fn(x), torch.nn.functional.layer_norm(x, (16,), w, b, 1e-5))
