"""The dependent launches (cuda::launch_dependent in csrc/layer_norm): the forward, the
register-resident backwards and sum_partial_rows start while the kernel before them retires, and wait
for it before touching memory. Kernels that read what the kernel just before them wrote (forward of a
forward's output, backward_fused -> sum_partial_rows -> the previous norm's backward), eager and
replayed from a CUDA graph with new inputs copied in; a read before the wait would see stale data.
"""
import pytest
import torch
import torch.nn.functional as F

from apex.normalization import FusedLayerNorm, FusedRMSNorm
from norm_reference import assert_close_rel

pytestmark = pytest.mark.gpu

EPS = 1e-5


def chain(norms, x):
    """Two norms back to back."""
    return norms[1](norms[0](x))


def reference_chain(norms, x, rms):
    """The same chain in float64 (plain PyTorch)."""
    y = x.double()
    for norm in norms:
        weight = norm.weight.double()
        if rms:
            y = F.rms_norm(y, (y.shape[-1],), weight, EPS)
        else:
            y = F.layer_norm(y, (y.shape[-1],), weight, norm.bias.double(), EPS)
    return y


def grads(norms, x, dy, rms, reference=False):
    x = x.detach().requires_grad_()
    params = [p for n in norms for p in n.parameters()]
    out = reference_chain(norms, x, rms) if reference else chain(norms, x)
    return (out, *torch.autograd.grad(out, [x, *params], dy.to(out.dtype)))


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("cols", [1024, 4096, 16384])
def test_dependent_chain(rms, cols):
    """fwd -> fwd -> bwd -> bwd, eager and from a graph replayed on new inputs, against float64."""
    torch.manual_seed(cols)
    module = FusedRMSNorm if rms else FusedLayerNorm
    norms = [module(cols, eps=EPS).to("cuda", torch.bfloat16) for _ in range(2)]
    with torch.no_grad():
        for p in (p for n in norms for p in n.parameters()):
            p.copy_(torch.randn_like(p) * 0.5 + 1)
    rows = 600
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)

    def check(got, x_used, dy_used):
        want = grads(norms, x_used.double(), dy_used.double(), rms, reference=True)
        for name, a, b in zip(["out", "dx", "dw0", "db0", "dw1", "db1"] if not rms else
                              ["out", "dx", "dw0", "dw1"], got, want):
            assert_close_rel(a, b, torch.bfloat16, name, scale=max(b.norm().item(), 1.0) * 4)

    check(grads(norms, x, dy, rms), x, dy)

    static_x, static_dy = x.clone(), dy.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        grads(norms, static_x, static_dy, rms)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = grads(norms, static_x, static_dy, rms)
    for _ in range(3):
        new_x, new_dy = torch.randn_like(x) * 3 + 1, torch.randn_like(dy)
        static_x.copy_(new_x)
        static_dy.copy_(new_dy)
        graph.replay()
        torch.cuda.synchronize()
        check([t.clone() for t in static_out], new_x, new_dy)
