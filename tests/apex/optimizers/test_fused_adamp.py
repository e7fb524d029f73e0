"""FusedAdamP against AdamP as its authors' code defines it, with grads that make the params look
scale-invariant per channel and per layer (so both projections run) and grads that do not."""
import pytest
import torch
from optimizer_testing import DEVICES, DTYPES, RoundedShadow, TOLERANCE, make_params, set_grads
from reference_optimizers import AdamPReference

from apex.optimizers import FusedAdamP

# A linear weight (channel projection), a conv weight (layer projection), one that is not
# scale-invariant, a long row split over several 512-element pieces, a bias and a scalar.
SHAPES = [(16, 33), (8, 3, 3, 3), (5, 40), (3, 1300), (7,), ()]


def orthogonal(grad, param, rows):
    """grad with its component along param removed per row (rows=True) or over the tensor."""
    g, p = (t.reshape(t.shape[0], -1) if rows else t.reshape(1, -1) for t in (grad, param))
    g = g - (g * p).sum(dim=1, keepdim=True) / (p * p).sum(dim=1, keepdim=True) * p
    return g.reshape(grad.shape)


def adamp_grads(step, params):
    """Grads of step `step` for params shaped SHAPES: channel-, layer-orthogonal, then plain."""
    generator = torch.Generator().manual_seed(2000 + step)
    grads = [torch.randn(p.shape, generator=generator) for p in params]
    floats = [p.detach().float().cpu() for p in params]
    grads[0] = orthogonal(grads[0], floats[0], rows=True)
    # Orthogonal over the tensor but not per channel: its rows get a shared offset along p.
    layer = orthogonal(grads[1], floats[1], rows=False)
    grads[1] = layer + 0.5 * torch.sign(floats[1]) * floats[1].abs().mean() * torch.linspace(-1, 1, layer.shape[0]).view(-1, 1, 1, 1)
    grads[1] = orthogonal(grads[1], floats[1], rows=False)
    grads[3] = orthogonal(grads[3], floats[3], rows=True)
    return [g.to(device=p.device, dtype=p.dtype) for g, p in zip(grads, params)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nesterov", [False, True])
def test_matches_reference(device, dtype, nesterov):
    hyper = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, delta=0.1, wd_ratio=0.1, nesterov=nesterov)
    params = make_params(dtype, device, shapes=SHAPES)
    reference = RoundedShadow(params, lambda ps: AdamPReference(ps, **hyper))
    optimizer = FusedAdamP(params, **hyper)
    for step in range(20):
        grads = adamp_grads(step, reference.params)  # orthogonal to the reference's (float32) params
        set_grads(params, [g.to(p.dtype).clone() for g, p in zip(grads, params)])
        optimizer.step()
        reference.step(grads)
    rtol, atol = TOLERANCE[dtype]
    for index, (a, e) in enumerate(zip(params, reference.params)):
        torch.testing.assert_close(a.detach().float().cpu(), e.float().cpu(), rtol=rtol, atol=atol,
                                   msg=lambda m: f"param {index}: {m}")


@pytest.mark.parametrize("device", DEVICES)
def test_projection_happens(device):
    """The orthogonal grads keep their params' norms (projected steps), the plain ones do not."""
    params = make_params(torch.float32, device, shapes=SHAPES)
    optimizer = FusedAdamP(params, lr=1e-3, weight_decay=0.0)
    norms = [p.detach().norm() for p in params]
    set_grads(params, adamp_grads(0, params))
    optimizer.step()
    # A projected first step is orthogonal to the param: the norm grows only at second order.
    growth = [abs(float(params[i].detach().norm() / norms[i]) - 1) for i in (0, 2)]
    assert growth[0] < 1e-2
    assert growth[1] > growth[0]


def test_refuses_bad_arguments():
    params = make_params(torch.float32, "cpu", shapes=[(3,)])
    with pytest.raises(ValueError, match="Invalid delta value"):
        FusedAdamP(params, delta=-1.0)
    with pytest.raises(ValueError, match="Invalid wd_ratio value"):
        FusedAdamP(params, wd_ratio=-1.0)
