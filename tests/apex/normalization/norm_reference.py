"""Float64 references and tolerances shared by the fused LayerNorm / RMSNorm tests."""
import pytest
import torch

# ||out - ref|| / ||ref|| bounds: a few ulps of each dtype, summed over a row.
REL_TOL = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 2e-3, torch.bfloat16: 1.2e-2}

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


def reference_norm(x, normalized_shape, weight, bias, eps, rms):
    """LayerNorm / RMSNorm in float64 (plain PyTorch ops)."""
    dims = tuple(range(-len(normalized_shape), 0))
    x = x.double()
    if rms:
        y = x * torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + eps)
    else:
        centered = x - x.mean(dims, keepdim=True)
        y = centered * torch.rsqrt(centered.pow(2).mean(dims, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.double()
    if bias is not None:
        y = y + bias.double()
    return y


def assert_close_rel(actual, expected, dtype, what, scale=None):
    """||actual - expected|| <= REL_TOL[dtype] * scale, scale defaulting to ||expected||."""
    assert actual is not None, f"{what}: missing"
    actual, expected = actual.double().cpu(), expected.double().cpu()
    assert torch.isfinite(actual).all(), f"{what}: non-finite values"
    scale = (expected.norm() if scale is None else torch.as_tensor(scale).double().cpu()).clamp_min(1e-30)
    err = ((actual - expected).norm() / scale).item()
    assert err <= REL_TOL[dtype], f"{what}: relative error {err:.2e} > {REL_TOL[dtype]:.0e}"


def grad_input_scale(x, dy, weight, normalized_shape, eps, rms):
    """Size of the largest term of grad_input = invvar * (w*dy - ...): the scale its rounding errors
    follow. ||grad_input|| itself can be far smaller (cancellation, e.g. RMSNorm over one element)."""
    dims = tuple(range(-len(normalized_shape), 0))
    x = x.detach().double().cpu()
    centered = x if rms else x - x.mean(dims, keepdim=True)
    invvar = torch.rsqrt(centered.pow(2).mean(dims, keepdim=True) + eps)
    term = dy.double().cpu() * invvar
    if weight is not None:
        term = term * weight.detach().double().cpu()
    return term.norm()


def random_parameter(shape, device, dtype, generator=None):
    """|w| in [0.5, 2) with random signs: away from 0, so memory_efficient's (y - b) / w is well conditioned."""
    magnitude = torch.rand(shape, generator=generator, dtype=torch.float64) * 1.5 + 0.5
    sign = torch.randint(0, 2, shape, generator=generator).double() * 2 - 1
    return (magnitude * sign).to(device=device, dtype=dtype)
