"""FusedLARS against LARS as its paper and ROCm apex define it."""
import pytest
import torch
from optimizer_testing import DEVICES, DTYPES, RoundedShadow, compare_with_reference, grads_at, make_params
from optimizer_testing import set_grads
from reference_optimizers import LarsReference

from apex.optimizers import FusedLARS

HYPER = dict(lr=0.5, momentum=0.9, weight_decay=1e-4, trust_coefficient=0.02, eps=1e-8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nesterov", [False, True])
def test_matches_reference(device, dtype, nesterov):
    params = make_params(dtype, device)
    reference = RoundedShadow(params, lambda ps: LarsReference(ps, nesterov=nesterov, **HYPER),
                              rounded_state=["momentum_buffer"])
    compare_with_reference(FusedLARS(params, nesterov=nesterov, **HYPER), params, reference, late=True)


@pytest.mark.parametrize("device", DEVICES)
def test_skipped_group_takes_plain_lr(device):
    params = make_params(torch.float32, device, shapes=[(40,)])
    optimizer = FusedLARS([{"params": params, "is_skipped": True}], lr=0.1, momentum=0.0)
    before = params[0].detach().clone()
    set_grads(params, grads_at(0, params))
    optimizer.step()
    torch.testing.assert_close(params[0].detach(), before - 0.1 * params[0].grad)


@pytest.mark.parametrize("device", DEVICES)
def test_step_with_inf_grads_is_skipped(device):
    params = make_params(torch.float32, device, shapes=[(40,)])
    optimizer = FusedLARS(params, **HYPER)
    before = params[0].detach().clone()
    params[0].grad = torch.full_like(params[0], float("inf"))
    optimizer.step()
    assert torch.equal(params[0].detach(), before)
    set_grads(params, grads_at(1, params))  # the next step runs again
    optimizer.step()
    assert not torch.equal(params[0].detach(), before)


@pytest.mark.parametrize("bad, match", [(dict(dampening=0.1), "dampening"),
                                        (dict(wd_after_momentum=True), "wd_after_momentum"),
                                        (dict(nesterov=True, momentum=0.0), "Nesterov"),
                                        (dict(lr=float("nan")), "Invalid learning rate")])
def test_refuses_what_it_does_not_compute(bad, match):
    with pytest.raises(ValueError, match=match):
        FusedLARS(make_params(torch.float32, "cpu", shapes=[(3,)]), **{**HYPER, **bad})
