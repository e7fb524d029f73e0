"""Empty inputs, weights left on the meta device, and memory_efficient with zeros in the weight."""
import pytest
import torch
import torch.nn.functional as F

from apex.normalization import FusedLayerNorm, FusedRMSNorm, MixedFusedLayerNorm, MixedFusedRMSNorm

from norm_reference import DEVICES

MODULES = [FusedLayerNorm, FusedRMSNorm, MixedFusedLayerNorm, MixedFusedRMSNorm]


def torch_norm(module, x):
    if isinstance(module, FusedRMSNorm):
        return F.rms_norm(x, module.normalized_shape, module.weight, module.eps)
    return F.layer_norm(x, module.normalized_shape, module.weight, module.bias, module.eps)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cls", MODULES)
@pytest.mark.parametrize("shape", [(0, 8), (2, 0, 8), (0, 0, 8)], ids=str)
def test_empty_batch_gives_empty_output_and_zero_parameter_grads(device, cls, shape):
    """MoE experts that get no tokens: torch returns an empty output and zero grads for the parameters."""
    module = cls(8).to(device)
    x = torch.randn(shape, device=device, requires_grad=True)
    y = module(x)
    assert y.shape == x.shape
    y.sum().backward()
    assert x.grad.shape == x.shape
    for p in module.parameters():
        torch.testing.assert_close(p.grad, torch.zeros_like(p))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_empty_rows(device, rms):
    """normalized_shape with a zero: every row is empty; outputs and grads are empty, as torch gives them."""
    module = (FusedRMSNorm if rms else FusedLayerNorm)((3, 0)).to(device)
    x = torch.randn(4, 3, 0, device=device, requires_grad=True)
    y = module(x)
    y.sum().backward()
    assert y.shape == x.shape and x.grad.shape == x.shape and module.weight.grad.shape == (3, 0)


@pytest.mark.parametrize("cls", MODULES)
def test_weight_on_meta_raises_like_torch(cls):
    """A module built on the meta device and never materialised: torch raises, so does apex (no garbage)."""
    module = cls(8).to("meta")
    with pytest.raises(RuntimeError, match="is on meta but input is on cpu"):
        module(torch.randn(3, 8))
    with pytest.raises(RuntimeError):  # torch's own modules refuse the same call
        torch.nn.LayerNorm(8, device="meta")(torch.randn(3, 8))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cls", MODULES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_memory_efficient_with_zeros_in_the_weight(device, cls, dtype):
    """y = xhat * w + b loses xhat where w == 0; the op then keeps the input, and the grads stay exact."""
    torch.manual_seed(0)
    module = cls(16, memory_efficient=True).to(device)
    with torch.no_grad():
        module.weight.normal_()
        module.weight[[0, 5, 6]] = 0
        if module.bias is not None:
            module.bias.normal_()
    reference = cls(16).to(device)
    reference.load_state_dict(module.state_dict())
    x = torch.randn(7, 16, device=device, dtype=dtype)
    dy = torch.randn(7, 16, device=device)
    grads = []
    for m in (module, reference):
        xi = x.clone().requires_grad_()
        y = m(xi)
        grads.append(torch.autograd.grad(y, [xi, *m.parameters()], dy.to(y.dtype)))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=0, atol=0)  # the same kernels on the same data


@pytest.mark.parametrize("device", DEVICES)
def test_memory_efficient_with_zero_weight_matches_torch(device):
    torch.manual_seed(0)
    module = FusedLayerNorm(16, memory_efficient=True).to(device)
    with torch.no_grad():
        module.weight.copy_(torch.randn(16))
        module.weight[3] = 0
    x = torch.randn(5, 16, device=device, requires_grad=True)
    dy = torch.randn(5, 16, device=device)
    got = torch.autograd.grad(module(x), [x, module.weight, module.bias], dy)
    want = torch.autograd.grad(torch_norm(module, x), [x, module.weight, module.bias], dy)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_memory_efficient_zero_weight_while_capturing_a_cuda_graph():
    """During CUDA graph capture the weight cannot be read back: the input is kept, grads stay exact."""
    module = FusedLayerNorm(64, memory_efficient=True).cuda()
    with torch.no_grad():
        module.weight[7] = 0
    x = torch.randn(32, 64, device="cuda", requires_grad=True)
    dy = torch.randn(32, 64, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        module(x).backward(dy)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    x.grad = None
    module.zero_grad(set_to_none=False)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        module(x).backward(dy)
    graph.replay()
    torch.cuda.synchronize()
    xr = x.detach().clone().requires_grad_()
    want = torch.autograd.grad(torch_norm(module, xr), [xr], dy)[0]
    torch.testing.assert_close(x.grad, want, rtol=1e-4, atol=1e-4)
