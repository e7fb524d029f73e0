"""FusedAdadelta against torch.optim.Adadelta."""
import pytest
import torch
from optimizer_testing import DEVICES, DTYPES, RoundedShadow, clone_params, compare_with_reference, make_params
from optimizer_testing import save_and_load, train

from apex.optimizers import FusedAdadelta


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_matches_torch_adadelta(device, dtype, weight_decay):
    hyper = dict(lr=0.5, rho=0.85, eps=1e-5, weight_decay=weight_decay)
    params = make_params(dtype, device)
    reference = RoundedShadow(params, lambda ps: torch.optim.Adadelta(ps, foreach=False, **hyper),
                              rounded_state=["square_avg", "acc_delta"])
    compare_with_reference(FusedAdadelta(params, **hyper), params, reference, late=True)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_adadelta_state_loads(device):
    hyper = dict(lr=0.5, rho=0.85)
    params = make_params(torch.float32, device)
    first = torch.optim.Adadelta(params, foreach=False, **hyper)
    train(first, params, range(5), late=True)
    continued = clone_params(params)
    second = FusedAdadelta(continued, **hyper)
    second.load_state_dict(save_and_load(first.state_dict()))
    train(first, params, range(5, 12), late=True)
    train(second, continued, range(5, 12), late=True)
    for a, b in zip(params, continued):
        torch.testing.assert_close(a, b, rtol=5e-5, atol=1e-5)


def test_refuses_bad_rho():
    with pytest.raises(ValueError, match="Invalid rho value"):
        FusedAdadelta(make_params(torch.float32, "cpu", shapes=[(3,)]), rho=1.5)
