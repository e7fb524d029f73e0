"""optimizer.add_param_group after amp.initialize: the new params are managed like the first ones
(fp32 masters for fp16/bf16 params under O2/O5, unscaled grads), so training matches a plain
fp32-math run whichever way grads are zeroed."""
import pytest
import torch
import torch.nn as nn

from amp_testing import CUDA
from apex import amp
from apex.amp._amp_state import _amp_state

LEVELS = ["O0", "O1", "O2", "O3", "O4", "O5"]
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]


class TwoTypes(nn.Module):
    """An fp32 param and a low-precision one, multiplied in fp32."""

    def __init__(self, offset, low, device):
        super().__init__()
        self.weight = nn.Parameter(offset + torch.arange(2., device=device))
        self.low_weight = nn.Parameter((1. + offset + torch.arange(2., device=device)).to(low))

    def forward(self, x):
        return (x * self.weight * self.low_weight.float()).sum()


def zero(models, optimizer, how):
    if how == "optimizer":
        optimizer.zero_grad()
    else:
        for model in models:
            if how == "model":
                model.zero_grad()
            else:
                for param in model.parameters():
                    param.grad = None


def run(opt_level, how_to_zero, device, use_amp, combine_grad=False, backwards=1):
    low = torch.bfloat16 if opt_level in ("O4", "O5") else torch.float16
    models = [TwoTypes(1, low, device), TwoTypes(2, low, device)]
    optimizer = torch.optim.SGD([{"params": models[0].parameters(), "lr": 0.25}], momentum=0.125)
    x = torch.ones(2, device=device)
    if use_amp:
        _amp_state.allow_incoming_model_not_fp32 = True
        models, optimizer = amp.initialize(models, optimizer, opt_level=opt_level, cast_model_type=False,
                                           combine_grad=combine_grad, verbosity=0)
        _amp_state.loss_scalers[0]._loss_scale = 4.0

    def backward(loss):  # `backwards` times: grads accumulate across scale_loss blocks
        for i in range(backwards):
            retain_graph = i < backwards - 1
            if use_amp:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward(retain_graph=retain_graph)
            else:
                loss.backward(retain_graph=retain_graph)

    zero(models, optimizer, how_to_zero)
    backward(models[0](x))
    optimizer.step()
    optimizer.add_param_group({"params": models[1].parameters(), "lr": 0.5})
    for _ in range(2):  # the second step checks the new params' momentum
        zero(models, optimizer, how_to_zero)
        backward(models[0](x) + models[1](x))
        optimizer.step()
    return models, optimizer, low


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backwards", [1, 2])
@pytest.mark.parametrize("how_to_zero", ["none", "model", "optimizer"])
@pytest.mark.parametrize("opt_level", LEVELS)
def test_added_groups_train_like_the_first(opt_level, how_to_zero, backwards, device):
    expected, _, low = run(opt_level, how_to_zero, device, use_amp=False, backwards=backwards)
    models, optimizer, _ = run(opt_level, how_to_zero, device, use_amp=True, backwards=backwards)
    tolerance = dict(rtol=1e-2, atol=1e-2) if low == torch.bfloat16 else dict(rtol=1e-3, atol=1e-3)
    for reference, model in zip(expected, models):
        for want, got in zip(reference.parameters(), model.parameters()):
            assert got.dtype == want.dtype
            torch.testing.assert_close(got.float(), want.float(), **tolerance)
    masters = list(amp.master_params(optimizer))
    assert len(masters) == 4
    if opt_level in ("O2", "O5"):  # the added group's low-precision param got a master too
        assert all(master.dtype == torch.float32 for master in masters)
        model_params = [p for model in models for p in model.parameters()]
        assert all(torch.equal(p, m.to(p.dtype)) for p, m in zip(model_params, masters))


def test_added_groups_with_combined_grads():
    expected, _, _ = run("O2", "optimizer", "cpu", use_amp=False)
    models, optimizer, _ = run("O2", "optimizer", "cpu", use_amp=True, combine_grad=True)
    for reference, model in zip(expected, models):
        for want, got in zip(reference.parameters(), model.parameters()):
            torch.testing.assert_close(got.float(), want.float(), rtol=1e-3, atol=1e-3)
