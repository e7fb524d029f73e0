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
    train_beside,
)

from apex.optimizers import FusedSGD

MOMENTUM_CASES = {
    "plain": dict(momentum=0.0),
    "momentum": dict(momentum=0.9, dampening=0.1),
    "nesterov": dict(momentum=0.9, nesterov=True),
}


def torch_sgd(**hyper):
    return lambda params: torch.optim.SGD(params, foreach=False, **hyper)


class TorchInDtype:
    """torch.optim on copies of the params in their own dtype: torch's fp16/bf16 trajectory, every
    intermediate it keeps rounded (NVIDIA apex's tests compare FusedSGD against this)."""

    def __init__(self, params, make_optimizer):
        self.params = clone_params(params)
        self.optimizer = make_optimizer(self.params)

    def step(self, grads):
        set_grads(self.params, [None if g is None else g.clone() for g in grads])
        self.optimizer.step()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", MOMENTUM_CASES)
def test_matches_torch_sgd(device, dtype, case):
    hyper = dict(lr=0.05, weight_decay=0.01, **MOMENTUM_CASES[case])
    params = make_params(dtype, device)
    if dtype == torch.float32:
        compare_with_reference(FusedSGD(params, **hyper), params, RoundedShadow(params, torch_sgd(**hyper)), late=True)
        return
    # 16-bit: the kernel rounds where torch.optim.SGD rounds, so it follows torch in that dtype; over
    # 20 steps a value on a rounding boundary can still drift a few ulps (seen: up to 3 of 75000).
    reference = TorchInDtype(params, torch_sgd(**hyper))
    train_beside(FusedSGD(params, **hyper), params, reference, late=True)
    tolerance = 2e-3 if dtype == torch.float16 else 3.2e-2
    for param, expected in zip(params, reference.params):
        torch.testing.assert_close(param.detach(), expected.detach(), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("device", DEVICES)
def test_fp16_within_nvidia_apex_tolerance(device):
    """NVIDIA apex's TestFusedSGD.test_half: params in [0, 1), grads in [0, 1), 7 steps, |diff| <= 1e-3."""
    generator = torch.Generator().manual_seed(9876)
    params = [torch.rand(278011, generator=generator).half().to(device).requires_grad_()]
    fused, reference = FusedSGD(params, lr=0.25, momentum=0.125), TorchInDtype(params, torch_sgd(lr=0.25, momentum=0.125))
    for _ in range(7):
        grads = [torch.rand(278011, generator=generator).half().to(device)]
        set_grads(params, [g.clone() for g in grads])
        fused.step()
        reference.step(grads)
        assert (params[0].detach() - reference.params[0].detach()).abs().max().item() <= 1e-3


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
