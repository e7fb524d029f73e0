"""apex.fp16_utils.LossScaler / DynamicLossScaler: the legacy interface, with the scale schedule
of apex's DynamicLossScaler (checked against a plain-Python model of it)."""
import pytest
import torch
import torch.nn as nn

from apex.fp16_utils import DynamicLossScaler, LossScaler

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def reference_schedule(overflows, init_scale, scale_factor, scale_window):
    """apex.fp16_utils.DynamicLossScaler's rule, written out."""
    scale, last_overflow, scales = init_scale, -1, []
    for iteration, overflow in enumerate(overflows):
        if overflow:
            scale = max(scale / scale_factor, 1)
            last_overflow = iteration
        elif (iteration - last_overflow) % scale_window == 0:
            scale *= scale_factor
        scales.append(scale)
    return scales


def test_dynamic_schedule_matches_apex():
    overflows = [False] * 7 + [True] + [False] * 9 + [True] * 40 + [False] * 5
    scaler = DynamicLossScaler(init_scale=2.**10, scale_factor=4., scale_window=3)
    scales = []
    for overflow in overflows:
        scaler.update_scale(overflow)
        scales.append(scaler.loss_scale)
    assert scales == reference_schedule(overflows, 2.**10, 4., 3)
    assert min(scales) == 1  # floored at 1
    assert (scaler.cur_iter, scaler.last_overflow_iter) == (len(overflows), len(overflows) - 6)


def test_defaults_and_cur_scale():
    scaler = DynamicLossScaler()
    assert scaler.loss_scale == 2**32 and (scaler.scale_factor, scaler.scale_window) == (2., 1000)
    scaler.cur_scale = 8.0
    assert scaler.loss_scale == 8.0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_has_overflow_finds_inf_and_nan_and_leaves_grads_alone(device, dtype):
    params = [nn.Parameter(torch.randn(5, device=device, dtype=dtype)) for _ in range(3)]
    params[0].grad = torch.randn(5, device=device, dtype=dtype)
    params[2].grad = torch.randn(5, device=device, dtype=dtype)
    clean = [p.grad.clone() for p in (params[0], params[2])]
    scaler = DynamicLossScaler()
    assert not scaler.has_overflow(params)
    assert torch.equal(params[0].grad, clean[0]) and torch.equal(params[2].grad, clean[1])
    for bad in (float("inf"), float("nan")):
        params[2].grad[3] = bad
        assert scaler.has_overflow(params)
        assert DynamicLossScaler._has_inf_or_nan(params[2].grad)
        params[2].grad.copy_(clean[1])
    assert not DynamicLossScaler._has_inf_or_nan(params[0].grad)


def test_static_scaler_never_overflows_or_changes():
    scaler = LossScaler(128)
    param = nn.Parameter(torch.ones(2))
    param.grad = torch.tensor([float("inf"), 0.0])
    assert not scaler.has_overflow([param]) and not LossScaler._has_inf_or_nan(param.grad)
    scaler.update_scale(True)
    assert scaler.loss_scale == 128 and scaler.cur_scale == 128


def test_backward_and_scale_gradient_hook():
    scaler = LossScaler(16.0)
    x = torch.ones(3, requires_grad=True)
    scaler.backward((2 * x).sum())
    assert torch.equal(x.grad, torch.full((3,), 32.0))
    grads = scaler.scale_gradient(None, (torch.ones(2), None), None)
    assert torch.equal(grads[0], torch.full((2,), 16.0)) and grads[1] is None
