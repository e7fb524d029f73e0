"""FusedAdam against torch.optim.Adam/AdamW, capturable mode and the GradScaler protocol."""
import pytest
import torch
from optimizer_testing import (
    DEVICES,
    DTYPES,
    REDUCED_DTYPES,
    RoundedShadow,
    assert_params_close,
    clone_params,
    compare_with_reference,
    grads_at,
    make_params,
    save_and_load,
    set_grads,
    train,
    train_beside,
)

from apex.optimizers import FusedAdam

HYPER = dict(lr=1e-3, betas=(0.8, 0.99), eps=1e-7, weight_decay=0.05)


def torch_adam(adam_w_mode: bool):
    torch_class = torch.optim.AdamW if adam_w_mode else torch.optim.Adam
    return lambda params: torch_class(params, foreach=False, **HYPER)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("adam_w_mode", [True, False])
def test_matches_torch_adam(device, dtype, adam_w_mode):
    params = make_params(dtype, device)
    reference = RoundedShadow(params, torch_adam(adam_w_mode))
    optimizer = FusedAdam(params, adam_w_mode=adam_w_mode, **HYPER)
    compare_with_reference(optimizer, params, reference, late=True)
    for param in params:
        assert optimizer.state[param]["exp_avg"].dtype == torch.float32
    late = optimizer.state[params[2]]["step"]
    assert late.dtype == torch.float32 and late.item() == 20 - 3


@pytest.mark.parametrize("device", DEVICES)
def test_param_groups_keep_their_hyperparameters(device):
    params = make_params(torch.float32, device)
    groups = lambda ps: [{"params": ps[:2], "lr": 1e-2, "weight_decay": 0.0}, {"params": ps[2:]}]  # noqa: E731
    reference = RoundedShadow(params, lambda ps: torch.optim.AdamW(groups(ps), foreach=False, **HYPER))
    compare_with_reference(FusedAdam(groups(params), **HYPER), params, reference)


@pytest.mark.parametrize("device", DEVICES)
def test_capturable_matches_eager(device):
    params, capturable_params = make_params(torch.float32, device), make_params(torch.float32, device)
    train(FusedAdam(params, **HYPER), params, range(20))
    optimizer = FusedAdam(capturable_params, capturable=True, **HYPER)
    train(optimizer, capturable_params, range(20))
    assert_params_close(capturable_params, params, torch.float32)
    assert optimizer.state[capturable_params[0]]["step"].device == capturable_params[0].device
    assert optimizer.param_groups[0]["lr"].device == capturable_params[0].device


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", REDUCED_DTYPES)
def test_master_weights_follow_float32_adamw(device, dtype):
    params = make_params(dtype, device)
    optimizer = FusedAdam(params, capturable=True, master_weights=True, **HYPER)
    # The masters carry the float32 trajectory; the model params are the masters rounded.
    reference = RoundedShadow(params, torch_adam(True), store_dtype=torch.float32)
    train_beside(optimizer, params, reference)
    masters = [optimizer.state[p]["master_param"] for p in params]
    assert_params_close(masters, reference.params, torch.float32)
    for param, master in zip(params, masters):
        assert torch.equal(param.detach(), master.to(dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_grad_scaler_protocol(device):
    """GradScaler sets grad_scale/found_inf on a capturable FusedAdam instead of unscaling."""
    params, scaled_params = make_params(torch.float32, device), make_params(torch.float32, device)
    train(FusedAdam(params, capturable=True, **HYPER), params, range(5))
    optimizer = FusedAdam(scaled_params, capturable=True, **HYPER)
    assert optimizer._step_supports_amp_scaling
    scale = 1024.0
    for step in range(5):
        set_grads(scaled_params, [g * scale for g in grads_at(step, scaled_params)])
        optimizer.grad_scale = torch.tensor([scale], device=device)
        optimizer.found_inf = torch.tensor([0.0], device=device)
        optimizer.step()
    assert_params_close(scaled_params, params, torch.float32)

    before = clone_params(scaled_params)
    exp_avg_before = optimizer.state[scaled_params[0]]["exp_avg"].clone()
    optimizer.found_inf = torch.tensor([1.0], device=device)
    set_grads(scaled_params, [torch.full_like(p, float("inf")) for p in scaled_params])
    optimizer.step()
    for param, old in zip(scaled_params, before):
        assert torch.equal(param, old)
    assert torch.equal(optimizer.state[scaled_params[0]]["exp_avg"], exp_avg_before)
    assert optimizer.state[scaled_params[0]]["step"].item() == 5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("direction", ["fused_to_torch", "torch_to_fused"])
def test_state_dict_loads_into_torch_adamw_and_back(device, direction):
    params = make_params(torch.float32, device)
    first = FusedAdam(params, **HYPER) if direction == "fused_to_torch" else torch_adam(True)(params)
    train(first, params, range(5), late=True)
    state = save_and_load(first.state_dict())
    assert set(state["state"][0]) >= {"step", "exp_avg", "exp_avg_sq"}

    continued = clone_params(params)
    second = torch_adam(True)(continued) if direction == "fused_to_torch" else FusedAdam(continued, **HYPER)
    second.load_state_dict(state)
    train(first, params, range(5, 15), late=True)
    train(second, continued, range(5, 15), late=True)
    assert_params_close(continued, params, torch.float32)


def test_zero_grad_follows_set_grad_none():
    params = make_params(torch.float32, "cpu")
    set_grads(params, grads_at(0, params))
    FusedAdam(params, set_grad_none=False).zero_grad()
    assert all(p.grad is not None and not p.grad.any() for p in params)
    FusedAdam(params).zero_grad()
    assert all(p.grad is None for p in params)
