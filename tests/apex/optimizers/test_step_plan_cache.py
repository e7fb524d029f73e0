"""The fused optimizers keep their launch lists and step counters between steps: whatever a
training script changes between steps (params, grads appearing, cleared state, a new group,
a loaded state dict) must be noticed, and steps must count as torch.optim counts them."""
import pytest
import torch
from optimizer_testing import DEVICES, RoundedShadow, compare_with_reference, grads_at, make_params
from optimizer_testing import save_and_load, set_grads, train

from apex.optimizers import FusedAdam, FusedSGD

HYPER = dict(lr=1e-3, betas=(0.8, 0.99), eps=1e-7, weight_decay=0.05)


def torch_adamw(params):
    return torch.optim.AdamW(params, foreach=False, **HYPER)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("capturable", [False, True])
def test_step_counts_stay_per_param(device, capturable):
    params = make_params(torch.float32, device)
    optimizer = FusedAdam(params, capturable=capturable, **HYPER)
    train(optimizer, params, range(5), late=True)  # param 2 gets its first grad at step 3
    for index, param in enumerate(params):
        step = optimizer.state[param]["step"]
        assert step.dim() == 0 and step.dtype == torch.float32
        assert step.item() == (2 if index == 2 else 5)


@pytest.mark.parametrize("device", DEVICES)
def test_cleared_state_starts_over(device):
    params = make_params(torch.float32, device)
    optimizer = FusedAdam(params, **HYPER)
    train(optimizer, params, range(3))
    optimizer.state.clear()
    fresh = [p.detach().clone().requires_grad_() for p in params]
    reference = torch_adamw(fresh)
    for step in range(3, 6):
        grads = grads_at(step, params)
        set_grads(params, grads)
        set_grads(fresh, [g.clone() for g in grads])
        optimizer.step()
        reference.step()
    assert optimizer.state[params[0]]["step"].item() == 3
    for param, expected in zip(params, fresh):
        torch.testing.assert_close(param, expected, rtol=5e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_params_and_groups_added_between_steps(device):
    params = make_params(torch.float32, device)
    first, second, third = params[:2], params[2:4], params[4:]
    optimizer = FusedAdam(first, **HYPER)
    reference = RoundedShadow(params, lambda ps: torch_adamw(ps[:2]))
    for step in range(6):
        if step == 2:  # a param appended to the existing group
            optimizer.param_groups[0]["params"].extend(second)
            reference.optimizer.param_groups[0]["params"].extend(reference.params[2:4])
        if step == 4:  # a new group
            optimizer.add_param_group({"params": third})
            reference.optimizer.add_param_group({"params": reference.params[4:]})
        grads = grads_at(step, params)
        set_grads(params, [g.clone() for g in grads])
        optimizer.step()
        reference.step(grads)
    for param, expected in zip(params, reference.params):
        torch.testing.assert_close(param, expected, rtol=5e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_grads_dropped_and_restored(device):
    params = make_params(torch.float32, device)
    optimizer = FusedSGD(params, lr=0.05, momentum=0.9)
    reference = RoundedShadow(params, lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, foreach=False))

    def run(steps):
        for step in steps:
            grads = grads_at(step, params)
            if step % 2:  # param 1 has no grad on odd steps (a branch the forward pass skipped)
                grads[1] = None
            set_grads(params, [None if g is None else g.clone() for g in grads])
            optimizer.step()
            reference.step(grads)

    run(range(8))
    for param, expected in zip(params, reference.params):
        torch.testing.assert_close(param, expected, rtol=5e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_loaded_state_dict_replaces_the_cached_state(device):
    params = make_params(torch.float32, device)
    optimizer = FusedAdam(params, **HYPER)
    train(optimizer, params, range(4))
    snapshot = save_and_load(optimizer.state_dict())
    train(optimizer, params, range(4, 6))
    optimizer.load_state_dict(save_and_load(snapshot))
    assert optimizer.state[params[0]]["step"].item() == 4
    reference = RoundedShadow(params, torch_adamw)
    reference.optimizer.load_state_dict(save_and_load(snapshot))
    compare_with_reference(optimizer, params, reference, steps=3)
    assert optimizer.state[params[0]]["step"].item() == 7
