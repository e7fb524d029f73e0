"""torch.compile(fullgraph=True) and torch.export trace through the fused norms (C++ Meta kernels and
C++ autograd formulas), and torch.library.opcheck agrees with the kernels."""
import pytest
import torch

from apex._ops import ops
from apex.normalization import FusedLayerNorm, FusedRMSNorm, fused_layer_norm_affine, fused_rms_norm_affine

from norm_reference import DEVICES


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
    """Exercises the Meta kernels and the C++ autograd formulas through AOTAutograd."""
    compiled_matches_eager("cpu", "aot_eager")


@pytest.mark.slow
def test_compile_cpu_inductor():
    compiled_matches_eager("cpu", "inductor")


@pytest.mark.gpu
def test_compile_cuda_inductor():
    compiled_matches_eager("cuda", "inductor")


def forward_and_backward_args(device):
    x = torch.randn(4, 16, device=device, requires_grad=True)
    w, b = torch.randn(16, device=device, requires_grad=True), torch.randn(16, device=device, requires_grad=True)
    dy, stats = torch.randn(4, 16, device=device), torch.rand(4, device=device) + 0.5
    return {
        "layer_affine": ("layer_norm_fwd", (x, [16], w, b, 1e-5, False)),
        "layer_plain_memory_efficient": ("layer_norm_fwd", (x, [16], None, None, 1e-5, True)),
        "rms_affine": ("rms_norm_fwd", (x, [16], w, 1e-5, False)),
        "rms_memory_efficient": ("rms_norm_fwd", (x, [16], w, 1e-5, True)),
        "layer_bwd": ("layer_norm_bwd", (dy, stats, stats, x.detach(), [16], w.detach(), b.detach(), 1e-5, False)),
        "layer_bwd_memory_efficient": ("layer_norm_bwd", (dy, None, stats, x.detach(), [16], w.detach(),
                                                          b.detach(), 1e-5, True)),
        "rms_bwd": ("rms_norm_bwd", (dy, stats, x.detach(), [16], w.detach(), 1e-5, False)),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(forward_and_backward_args("cpu")))
def test_opcheck(device, case):
    """torch.library.opcheck: schema, Meta kernel (fake tensors) and autograd registration agree with the kernels."""
    ops("fused_layer_norm_cuda")
    name, args = forward_and_backward_args(device)[case]
    torch.library.opcheck(getattr(torch.ops.apex, name).default, args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_compile_dynamic_shapes(device, rms):
    """dynamic=True: the Meta kernels see symbolic rows (and hidden sizes); one graph serves every shape."""
    torch._dynamo.reset()
    torch.manual_seed(0)

    def norm(x, w, b):
        y = fused_rms_norm_affine(x, w, x.shape[-1:], 1e-5) if rms else fused_layer_norm_affine(x, w, b, x.shape[-1:])
        return y.sin().sum()

    compiled = torch.compile(norm, fullgraph=True, dynamic=True, backend="aot_eager")
    for rows, cols in ((3, 16), (5, 16), (7, 24)):
        x = torch.randn(rows, cols, device=device, requires_grad=True)
        w, b = (torch.randn(cols, device=device, requires_grad=True) for _ in range(2))
        grads = torch.autograd.grad(compiled(x, w, b), [x, w] if rms else [x, w, b])
        want = torch.autograd.grad(norm(x, w, b), [x, w] if rms else [x, w, b])
        for got, ref in zip(grads, want):
            torch.testing.assert_close(got, ref)


def test_functional_under_compile_dynamic_batch():
    """Changing the batch size re-traces (or uses a dynamic shape) without breaking the graph."""
    w, b = torch.randn(16), torch.randn(16)
    fn = torch.compile(lambda x: fused_layer_norm_affine(x, w, b, (16,), 1e-5), fullgraph=True, backend="aot_eager")
    for rows in (3, 5, 7):
        x = torch.randn(rows, 16)
        torch.testing.assert_close(fn(x), torch.nn.functional.layer_norm(x, (16,), w, b, 1e-5))


@pytest.mark.parametrize("cls", [FusedLayerNorm, FusedRMSNorm])
def test_export_keeps_the_op(cls):
    """torch.export records the apex op itself (its Meta kernel gives the shapes)."""
    module = cls(16)
    x = torch.randn(3, 16)
    program = torch.export.export(module, (x,))
    assert "torch.ops.apex" in program.graph_module.code
    torch.testing.assert_close(program.module()(x), module(x))
