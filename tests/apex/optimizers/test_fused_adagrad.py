"""FusedAdagrad against torch.optim.Adagrad and a decoupled-weight-decay reference."""
import pytest
import torch
from optimizer_testing import (
    DEVICES,
    DTYPES,
    RoundedShadow,
    assert_params_close,
    clone_params,
    compare_with_reference,
    float32_copies,
    make_params,
    save_and_load,
    train,
)

from apex.optimizers import FusedAdagrad

HYPER = dict(lr=0.05, eps=1e-8, weight_decay=0.01)


def torch_adagrad(params):
    return torch.optim.Adagrad(params, foreach=False, **HYPER)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_torch_adagrad(device, dtype):
    params = make_params(dtype, device)
    reference = RoundedShadow(params, torch_adagrad, rounded_state=["sum"])
    compare_with_reference(FusedAdagrad(params, **HYPER), params, reference, late=True)


class DecoupledAdagrad:
    """Adagrad with the weight decay added to the update, not the grad (adagrad_w_mode)."""

    def __init__(self, params, lr, eps, weight_decay):
        self.params = float32_copies(params)
        self.sums = [torch.zeros_like(p) for p in self.params]
        self.lr, self.eps, self.weight_decay = lr, eps, weight_decay

    def step(self, grads):
        for param, total, grad in zip(self.params, self.sums, grads):
            if grad is not None:
                total += grad.float() ** 2
                param -= self.lr * (grad.float() / (total.sqrt() + self.eps) + self.weight_decay * param)


@pytest.mark.parametrize("device", DEVICES)
def test_adagrad_w_mode(device):
    params = make_params(torch.float32, device)
    optimizer = FusedAdagrad(params, adagrad_w_mode=True, **HYPER)
    compare_with_reference(optimizer, params, DecoupledAdagrad(params, **HYPER), late=True)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_adagrad_state_loads(device):
    params = make_params(torch.float32, device)
    first = torch_adagrad(params)
    train(first, params, range(5), late=True)
    continued = clone_params(params)
    second = FusedAdagrad(continued, **HYPER)
    second.load_state_dict(save_and_load(first.state_dict()))
    train(first, params, range(5, 15), late=True)
    train(second, continued, range(5, 15), late=True)
    assert_params_close(continued, params, torch.float32)
