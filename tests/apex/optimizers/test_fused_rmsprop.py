"""FusedRMSprop against torch.optim.RMSprop, FusedRMSpropTF against TensorFlow's RMSprop (timm's)."""
import pytest
import torch
from optimizer_testing import DEVICES, DTYPES, RoundedShadow, clone_params, compare_with_reference, make_params
from optimizer_testing import save_and_load, train
from reference_optimizers import RMSpropTFReference

from apex.optimizers import FusedRMSprop, FusedRMSpropTF

CASES = {
    "plain": dict(),
    "weight_decay": dict(weight_decay=0.01),
    "momentum": dict(momentum=0.9),
    "centered_momentum": dict(momentum=0.9, centered=True, weight_decay=0.01),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_matches_torch_rmsprop(device, dtype, case):
    hyper = dict(lr=1e-3, alpha=0.95, eps=1e-6, **CASES[case])
    params = make_params(dtype, device)
    reference = RoundedShadow(params, lambda ps: torch.optim.RMSprop(ps, foreach=False, **hyper),
                              rounded_state=["square_avg", "momentum_buffer", "grad_avg"])
    optimizer = FusedRMSprop(params, **hyper)
    compare_with_reference(optimizer, params, reference, late=True)
    assert set(optimizer.state[params[0]]) == set(reference.optimizer.state[reference.params[0]])


TF_CASES = {
    "plain": dict(),
    "momentum_lr_inside": dict(momentum=0.9, weight_decay=0.01),
    "momentum_lr_outside_decoupled": dict(momentum=0.9, lr_in_momentum=False, weight_decay=0.01,
                                          decoupled_decay=True),
    "centered": dict(centered=True, momentum=0.5),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", TF_CASES)
def test_tf_matches_reference(device, dtype, case):
    hyper = dict(lr=1e-3, alpha=0.9, eps=1e-6, **TF_CASES[case])
    params = make_params(dtype, device)
    reference = RoundedShadow(params, lambda ps: RMSpropTFReference(ps, **hyper),
                              rounded_state=["square_avg", "momentum_buffer", "grad_avg"])
    optimizer = FusedRMSpropTF(params, **hyper)
    compare_with_reference(optimizer, params, reference, late=True)
    assert torch.all(optimizer.state[params[0]]["square_avg"] > 0)


@pytest.mark.parametrize("device", DEVICES)
def test_state_dict_loads_into_torch_rmsprop_and_back(device):
    hyper = dict(lr=1e-3, alpha=0.9, momentum=0.5, centered=True)
    params, continued = make_params(torch.float32, device), None
    fused = FusedRMSprop(params, **hyper)
    train(fused, params, range(5))
    continued = clone_params(params)
    torch_optimizer = torch.optim.RMSprop(continued, foreach=False, **hyper)
    torch_optimizer.load_state_dict(save_and_load(fused.state_dict()))
    train(fused, params, range(5, 10))
    train(torch_optimizer, continued, range(5, 10))
    for a, b in zip(params, continued):
        torch.testing.assert_close(a, b, rtol=5e-5, atol=1e-5)
    back = FusedRMSprop(clone_params(continued), **hyper)
    back.load_state_dict(save_and_load(torch_optimizer.state_dict()))
    assert back.state[back.param_groups[0]["params"][0]]["step"].item() == 10


def test_refuses_bad_hyperparameters():
    params = make_params(torch.float32, "cpu", shapes=[(3,)])
    for bad, match in [(dict(alpha=-0.1), "Invalid alpha value"), (dict(lr=float("nan")), "Invalid learning rate"),
                       (dict(momentum=-1.0), "Invalid momentum value"), (dict(eps=-1.0), "Invalid epsilon")]:
        for cls in (FusedRMSprop, FusedRMSpropTF):
            with pytest.raises(ValueError, match=match):
                cls(params, **bad)
