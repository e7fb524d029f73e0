"""FP16_Optimizer: fp32 masters of an fp16 model trained like an fp32 model, dynamic loss scaling
that skips overflowing steps, multi-loss backward, closures, clipping, checkpoints."""
import copy
import io

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from apex import DeprecatedFeatureWarning
from apex.fp16_utils import FP16_Optimizer

pytestmark = pytest.mark.filterwarnings("ignore::apex.DeprecatedFeatureWarning")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def setup(device, lr=0.1, low=torch.float16, **options):
    """(fp32 reference model + SGD, low-precision model + FP16_Optimizer, data)."""
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2)).to(device)
    model = copy.deepcopy(reference)
    model[0].to(low)  # the last layer stays fp32: a mixed model
    optimizer = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.5), verbose=False, **options)
    x, y = torch.randn(32, 6, device=device), torch.randn(32, 2, device=device)
    return reference, torch.optim.SGD(reference.parameters(), lr=lr, momentum=0.5), model, optimizer, (x, y)


def loss_of(model, batch, low=torch.float16):
    x, y = batch
    h = model[1](model[0](x.to(low)))
    return F.mse_loss(model[2](h.float()), y)


def reference_step(reference, optimizer, batch):
    optimizer.zero_grad()
    loss_of(reference, batch, torch.float32).backward()
    optimizer.step()


def test_deprecated():
    with pytest.warns(DeprecatedFeatureWarning, match="FP16_Optimizer is deprecated"):
        FP16_Optimizer(torch.optim.SGD([nn.Parameter(torch.ones(2))], lr=0.1), verbose=False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("low", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("options", [{}, {"static_loss_scale": 128.0}, {"dynamic_loss_scale": True}])
def test_masters_follow_fp32_training(device, low, options):
    reference, reference_optimizer, model, optimizer, batch = setup(device, low=low, **options)
    assert [len(g) for g in optimizer.fp16_groups] == [2] and len(optimizer.all_fp32_from_fp32_params) == 2
    assert all(p.dtype == torch.float32 for p in optimizer.all_fp32_from_fp16_params)
    for _ in range(5):
        reference_step(reference, reference_optimizer, batch)
        optimizer.zero_grad()
        optimizer.backward(loss_of(model, batch, low))
        optimizer.step()
    tolerance = dict(rtol=1e-2, atol=1e-2) if low == torch.bfloat16 else dict(rtol=2e-3, atol=2e-3)
    # The masters sit in the groups where their fp16 params were: the model's order.
    masters = [p for group in optimizer.param_groups for p in group["params"]]
    for master, want in zip(masters, reference.parameters()):
        torch.testing.assert_close(master.detach(), want.detach(), **tolerance)
    for param, master in zip(optimizer.all_fp16_params, optimizer.all_fp32_from_fp16_params):
        assert param.dtype == low and torch.equal(param, master.to(low))


def test_overflow_skips_the_step_and_halves_the_scale():
    _, _, model, optimizer, batch = setup("cpu", dynamic_loss_scale=True,
                                          dynamic_loss_args={"init_scale": 2.**10, "scale_window": 100})
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.zero_grad()
    optimizer.backward(loss_of(model, batch) * float("inf"))
    assert optimizer.overflow and optimizer.loss_scale == 2.**9
    assert optimizer.clip_master_grads(1.0) == -1 and optimizer.inspect_master_grad_data() is None
    optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    optimizer.zero_grad()
    optimizer.backward(loss_of(model, batch))
    assert not optimizer.overflow
    optimizer.step()
    assert not torch.equal(before[0], next(model.parameters()))


def test_two_losses_accumulate_like_their_sum():
    _, _, model, optimizer, batch = setup("cpu", static_loss_scale=64.0)
    twin = copy.deepcopy(model)
    twin_optimizer = FP16_Optimizer(torch.optim.SGD(twin.parameters(), lr=0.1), verbose=False, static_loss_scale=64.0)
    for update_master_grads in (True, False):
        optimizer.zero_grad()
        optimizer.backward(loss_of(model, batch), update_master_grads=update_master_grads)
        optimizer.backward(2 * loss_of(model, batch), update_master_grads=update_master_grads)
        optimizer.update_master_grads()
        twin_optimizer.zero_grad()
        twin_optimizer.backward(3 * loss_of(twin, batch))
        grads = optimizer.inspect_master_grad_data()
        for group, twin_group in zip(grads, twin_optimizer.inspect_master_grad_data()):
            for grad, twin_grad in zip(group, twin_group):
                torch.testing.assert_close(grad, twin_grad, rtol=1e-3, atol=1e-4)


def test_closure_and_clipping():
    _, _, model, optimizer, batch = setup("cpu", dynamic_loss_scale=True)

    def closure():
        optimizer.zero_grad()
        loss = loss_of(model, batch)
        optimizer.backward(loss)
        return loss

    first = optimizer.step(closure).item()
    for _ in range(10):
        optimizer.step(closure)
    assert loss_of(model, batch).item() < first
    optimizer.zero_grad(set_grads_to_None=True)
    assert all(p.grad is None for p in model.parameters())
    optimizer.backward(loss_of(model, batch))
    masters = [p for group in optimizer.param_groups for p in group["params"]]
    norm = torch.cat([p.grad.view(-1) for p in masters]).norm()
    assert optimizer.clip_master_grads(norm.item() / 2) == pytest.approx(norm.item(), rel=1e-5)
    assert torch.cat([p.grad.view(-1) for p in masters]).norm().item() == pytest.approx(norm.item() / 2, rel=1e-4)


def test_checkpoint_resumes_exactly():
    _, _, model, optimizer, batch = setup("cpu", dynamic_loss_scale=True)
    for _ in range(3):
        optimizer.zero_grad()
        optimizer.backward(loss_of(model, batch))
        optimizer.step()
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    _, _, resumed_model, resumed, _ = setup("cpu", dynamic_loss_scale=True)
    buffer.seek(0)
    saved = torch.load(buffer)  # weights_only: the checkpoint is plain tensors and numbers
    resumed_model.load_state_dict(saved["model"])
    resumed.load_state_dict(saved["optimizer"])
    assert resumed.loss_scale == optimizer.loss_scale
    for run_model, run_optimizer in ((model, optimizer), (resumed_model, resumed)):
        for _ in range(3):
            run_optimizer.zero_grad()
            run_optimizer.backward(loss_of(run_model, batch))
            run_optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), resumed_model.parameters()))


def test_properties_and_refusals():
    _, _, _, optimizer, _ = setup("cpu")
    optimizer.loss_scale = 32.0
    assert optimizer.loss_scaler.loss_scale() == 32.0
    assert optimizer.state is optimizer.optimizer.state and optimizer.param_groups is optimizer.optimizer.param_groups
    with pytest.raises(RuntimeError, match="serialized using state_dict"):
        copy.deepcopy(optimizer)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        FP16_Optimizer(torch.optim.SGD([nn.Parameter(torch.ones(2, dtype=torch.float64))], lr=0.1), verbose=False)
