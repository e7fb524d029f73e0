"""FusedSGD against torch.optim.SGD, wd_after_momentum, and apex.amp's fp32 master params."""
from types import SimpleNamespace

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
    grads_at,
    make_params,
    save_and_load,
    set_grads,
    train,
)

from apex.optimizers import FusedSGD

MOMENTUM_CASES = {
    "plain": dict(momentum=0.0),
    "momentum": dict(momentum=0.9, dampening=0.1),
    "nesterov": dict(momentum=0.9, nesterov=True),
}


def torch_sgd(**hyper):
    return lambda params: torch.optim.SGD(params, foreach=False, **hyper)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", MOMENTUM_CASES)
def test_matches_torch_sgd(device, dtype, case):
    hyper = dict(lr=0.05, weight_decay=0.01, **MOMENTUM_CASES[case])
    params = make_params(dtype, device)
    # The momentum buffer has the param's dtype: the kernel stores it rounded.
    reference = RoundedShadow(params, torch_sgd(**hyper), rounded_state=["momentum_buffer"])
    compare_with_reference(FusedSGD(params, **hyper), params, reference, late=True)


class WeightDecayAfterMomentum:
    """SGD whose weight decay is added after the momentum blend (apex's wd_after_momentum)."""

    def __init__(self, params, lr, momentum, weight_decay):
        self.params = float32_copies(params)
        self.buffers = [None] * len(params)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay

    def step(self, grads):
        for index, (param, grad) in enumerate(zip(self.params, grads)):
            if grad is None:
                continue
            grad = grad.float()
            buffer = self.buffers[index]
            buffer = grad.clone() if buffer is None else buffer * self.momentum + grad
            self.buffers[index] = buffer
            param -= self.lr * (buffer + self.weight_decay * param)


@pytest.mark.parametrize("device", DEVICES)
def test_weight_decay_after_momentum(device):
    hyper = dict(lr=0.05, momentum=0.9, weight_decay=0.01)
    params = make_params(torch.float32, device)
    reference = WeightDecayAfterMomentum(params, **hyper)
    compare_with_reference(FusedSGD(params, wd_after_momentum=True, **hyper), params, reference, late=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("materialize_master_grads", [True, False])
def test_amp_master_params(device, materialize_master_grads):
    """Under apex.amp O2 the groups hold fp32 masters; the fp16 model copies are written in
    the same launch and the grads are unscaled by most_recent_scale."""
    hyper = dict(lr=0.05, momentum=0.9, weight_decay=0.01)
    model = make_params(torch.float16, device)
    masters = [p.requires_grad_() for p in float32_copies(model)]
    fp32_params = make_params(torch.float32, device, seed=5, shapes=[(10, 3)])
    optimizer = FusedSGD(masters + fp32_params, materialize_master_grads=materialize_master_grads, **hyper)
    optimizer._amp_stash = SimpleNamespace(
        fp16_groups=[model], fp32_from_fp16_groups=[masters], fp32_from_fp32_groups=[fp32_params]
    )
    reference = RoundedShadow(masters + fp32_params, torch_sgd(**hyper))
    scale = 128.0
    for step in range(20):
        grads = grads_at(step, model + fp32_params)
        scaled = [g * scale for g in grads]  # by the loss scale, left to the kernel to undo
        set_grads(fp32_params, scaled[len(model) :])
        if materialize_master_grads:  # amp copied the fp16 grads into the masters
            set_grads(masters, [g.float() for g in scaled[: len(model)]])
        else:
            set_grads(model, scaled[: len(model)])
        optimizer.most_recent_scale = scale
        optimizer.step()
        reference.step([g.float() for g in grads])
    assert optimizer.most_recent_scale == 1.0
    assert_params_close(masters + fp32_params, reference.params, torch.float32)
    for copy, master in zip(model, masters):
        assert torch.equal(copy.detach(), master.detach().half())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("direction", ["fused_to_torch", "torch_to_fused"])
def test_state_dict_loads_into_torch_sgd_and_back(device, direction):
    hyper = dict(lr=0.05, momentum=0.9, nesterov=True)
    params = make_params(torch.float32, device)
    first = FusedSGD(params, **hyper) if direction == "fused_to_torch" else torch_sgd(**hyper)(params)
    train(first, params, range(5), late=True)
    state = save_and_load(first.state_dict())
    continued = clone_params(params)
    second = torch_sgd(**hyper)(continued) if direction == "fused_to_torch" else FusedSGD(continued, **hyper)
    second.load_state_dict(state)
    train(first, params, range(5, 15), late=True)
    train(second, continued, range(5, 15), late=True)
    assert_params_close(continued, params, torch.float32)
