"""FusedMixedPrecisionLamb: float32 masters of fp16/bf16 params against the LAMB reference,
and the GradScaler protocol (scaled grads, overflow skips the step)."""
import pytest
import torch
from lamb_reference import LambReference
from optimizer_testing import (
    DEVICES,
    REDUCED_DTYPES,
    assert_params_close,
    clone_params,
    compare_with_reference,
    grads_at,
    make_params,
    set_grads,
    train_beside,
)

from apex.optimizers import FusedMixedPrecisionLamb

HYPER = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.01)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", REDUCED_DTYPES)
def test_masters_match_float32_reference(device, dtype):
    params = make_params(dtype, device)
    optimizer = FusedMixedPrecisionLamb(params, reduced_precision_dtype=dtype, **HYPER)
    reference = LambReference(params, param_dtype=torch.float32, **HYPER)
    train_beside(optimizer, params, reference)
    masters = [optimizer.state[p]["master_param"] for p in params]
    # The update passes through the grads' buffer, so one rounding of `dtype` may differ.
    assert_params_close(masters, reference.params, dtype)
    for param, master in zip(params, masters):
        assert torch.equal(param.detach(), master.to(dtype))
        assert optimizer.state[param]["exp_avg"].dtype == torch.float32


@pytest.mark.parametrize("device", DEVICES)
def test_without_reduced_dtype_matches_reference(device):
    params = make_params(torch.float32, device)
    optimizer = FusedMixedPrecisionLamb(params, step=4, **HYPER)
    compare_with_reference(optimizer, params, LambReference(params, step=4, **HYPER))
    assert optimizer.param_groups[0]["lr"].device == params[0].device


@pytest.mark.parametrize("device", DEVICES)
def test_grad_scaler_protocol(device):
    """Scaled grads with grad_scale set give the unscaled result; found_inf skips the step."""
    params = make_params(torch.bfloat16, device)
    scaled_params = clone_params(params)
    plain = FusedMixedPrecisionLamb(params, reduced_precision_dtype=torch.bfloat16, **HYPER)
    scaled = FusedMixedPrecisionLamb(scaled_params, reduced_precision_dtype=torch.bfloat16, **HYPER)
    scale = 256.0
    for step in range(5):
        grads = grads_at(step, params)
        set_grads(scaled_params, [g * scale for g in grads])
        set_grads(params, grads)
        plain.step()
        scaled.grad_scale = torch.tensor([scale], device=device)
        scaled.found_inf = torch.tensor([0.0], device=device)
        scaled.step()
    masters = [plain.state[p]["master_param"] for p in params]
    scaled_masters = [scaled.state[p]["master_param"] for p in scaled_params]
    assert_params_close(scaled_masters, masters, torch.float32)

    before = [m.clone() for m in scaled_masters]
    scaled.found_inf = torch.tensor([1.0], device=device)
    set_grads(scaled_params, [torch.full_like(p, float("nan")) for p in scaled_params])
    scaled.step()
    for master, old in zip(scaled_masters, before):
        assert torch.equal(master, old)
    assert scaled.state[scaled_params[0]]["step"].item() == 5
