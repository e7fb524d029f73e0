"""The legacy handle API: `handle = amp.init()`, `handle.scale_loss(loss, optimizer)`,
`handle.wrap_optimizer(optimizer, num_loss)`, and the disabled (no-op) handle."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from amp_testing import CUDA, make_batches, make_net
from apex import amp
from apex.amp._amp_state import _amp_state

DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]


def fp32_grads(model, losses_of):
    """Grads of the sum of `losses_of(model)` on an fp32 copy (amp's casts paused)."""
    reference = copy.deepcopy(model)
    with amp.disable_casts():
        sum(losses_of(reference)).backward()
    return [p.grad for p in reference.parameters()]


def two_losses(batch):
    x, y = batch
    return lambda model: [F.mse_loss(model(x), y), model(x).square().mean()]


def test_task_data_stays_fp32_under_casts():
    """make_batches pauses amp's casts (its matmul would run in fp16, giving an fp16 target that torch 2.11's
    mse_loss backward refuses beside fp32_grads' fp32 output)."""
    amp.init()
    assert all(t.dtype == torch.float32 for batch in make_batches("mlp", count=1) for t in batch)


def test_handle_state():
    handle = amp.init(loss_scale=128.0, enable_caching=False, verbose=False)
    assert _amp_state.handle is handle and handle.is_active() and not handle.has_cache and not handle.verbose
    assert handle._default_scaler.loss_scale() == 128.0


@pytest.mark.parametrize("device", DEVICES)
def test_handle_scale_loss_unscales_and_skips_one_step_on_overflow(device):
    handle = amp.init()
    model = make_net("mlp", device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = make_batches("mlp", device, count=1)[0]
    expected = fp32_grads(model, lambda m: two_losses(batch)(m)[:1])
    loss = two_losses(batch)(model)[0]
    with handle.scale_loss(loss, optimizer) as scaled_loss:
        assert scaled_loss.item() == pytest.approx(loss.item() * 2.**16, rel=1e-3)
        scaled_loss.backward()
    for param, grad in zip(model.parameters(), expected):
        torch.testing.assert_close(param.grad, grad, rtol=2e-2, atol=2e-3)

    before = [p.detach().clone() for p in model.parameters()]
    with handle.scale_loss(two_losses(batch)(model)[0], optimizer) as scaled_loss:
        scaled_loss.backward()
        next(model.parameters()).grad.view(-1)[0] = float("inf")
    optimizer.step()  # skipped
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert handle._default_scaler.loss_scale() == 2.**15 and "step" not in vars(optimizer)
    optimizer.zero_grad()
    with handle.scale_loss(two_losses(batch)(model)[0], optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()  # the real step again
    assert not torch.equal(before[0], next(model.parameters()))


@pytest.mark.parametrize("device", DEVICES)
def test_wrapped_optimizer_scales_each_loss_separately(device):
    handle = amp.init()
    model = make_net("mlp", device)
    batch = make_batches("mlp", device, count=1)[0]
    expected = fp32_grads(model, two_losses(batch))
    optimizer = handle.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), num_loss=2)
    assert optimizer.param_groups[0]["lr"] == 0.1  # everything else is the wrapped optimizer's
    optimizer._loss_scaler[1]._loss_scale = 2.**4
    for loss in two_losses(batch)(model):
        with optimizer.scale_loss(loss) as scaled_loss:
            scaled_loss.backward()
    for param, grad in zip(model.parameters(), expected):
        torch.testing.assert_close(param.grad, grad, rtol=2e-2, atol=2e-3)
    with pytest.raises(RuntimeError, match="num_loss=2"):
        with optimizer.scale_loss(two_losses(batch)(model)[0]):
            pass
    with pytest.raises(RuntimeError, match="must explicitly use `optimizer.scale_loss"):
        with handle.scale_loss(two_losses(batch)(model)[0], optimizer):
            pass
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.step()
    assert not torch.equal(before[0], next(model.parameters()))

    # An overflow in the second loss skips the next step and backs off only its scaler.
    optimizer.zero_grad()
    before = [p.detach().clone() for p in model.parameters()]
    for loss_id, loss in enumerate(two_losses(batch)(model)):
        with optimizer.scale_loss(loss) as scaled_loss:
            scaled_loss.backward()
            if loss_id == 1:
                next(model.parameters()).grad.view(-1)[0] = float("nan")
    assert optimizer.step() is None
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert [s.loss_scale() for s in optimizer._loss_scaler] == [2.**16, 2.**3]
    with pytest.raises(NotImplementedError, match="closure"):
        optimizer.step(lambda: None)


def test_disabled_handle_is_transparent():
    handle = amp.init(enabled=False)
    model = make_net("mlp")
    optimizer = handle.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    loss = torch.tensor(3.0)
    with handle.scale_loss(loss, optimizer) as scaled_loss:
        assert scaled_loss is loss
    with optimizer.scale_loss(loss) as scaled_loss:
        assert scaled_loss is loss
    assert F.linear(torch.randn(2, 16), next(model.parameters())).dtype == torch.float32


def test_amp_optimizer_steps_without_casts():
    seen = []

    class Recording(torch.optim.SGD):
        def step(self, closure=None):
            seen.append(_amp_state.handle.is_active())
            return super().step(closure)

    model = nn.Linear(4, 4)
    model, optimizer = amp.initialize(model, Recording(model.parameters(), lr=0.1), opt_level="O1", loss_scale=128.0,
                                      verbosity=0)
    with amp.scale_loss(model(torch.randn(2, 4)).float().sum(), optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
    assert seen == [False] and _amp_state.handle.is_active()
