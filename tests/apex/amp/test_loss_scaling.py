"""Dynamic loss scaling: overflow skips the step and backs off, clean steps grow the scale,
several losses keep separate scalers, grads accumulate across scale_loss blocks."""
import pytest
import torch
import torch.nn.functional as F

import apex.amp.multi_tensor as multi_tensor
from amp_testing import CUDA, fp32_copy, initialized, make_batches, make_net, params_of
from apex import amp

DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]


def scaler_state(loss_id=0):
    return amp.state_dict()[f"loss_scaler{loss_id}"]


def backward_with_inf(loss, optimizer, model, loss_id=0):
    with amp.scale_loss(loss, optimizer, loss_id=loss_id) as scaled_loss:
        scaled_loss.backward()
        next(model.parameters()).grad.view(-1)[0] = float("inf")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opt_level,options", [
    ("O1", {}), ("O2", {}), ("O3", {"loss_scale": "dynamic"}), ("O5", {"loss_scale": "dynamic"}),
    ("O2", {"combine_grad": True}), ("O1", {"combine_grad": True}),
])
def test_overflow_skips_step_and_halves_scale(device, opt_level, options):
    model, optimizer = initialized("mlp", opt_level, device, optimizer=torch.optim.SGD, lr=0.1, **options)
    (x, y), = make_batches("mlp", device, count=1)
    before = params_of(model, optimizer)
    scale = scaler_state()["loss_scale"]

    optimizer.zero_grad()
    backward_with_inf(F.mse_loss(model(x), y), optimizer, model)
    optimizer.step()

    after = params_of(model, optimizer)
    for expected, actual in zip(before[0] + before[1], after[0] + after[1]):
        assert torch.equal(expected, actual)
    assert scaler_state() == {"loss_scale": scale / 2, "unskipped": 0}

    # The skip is one-shot: the next clean step updates the weights again.
    optimizer.zero_grad()
    with amp.scale_loss(F.mse_loss(model(x), y), optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
    assert not torch.equal(before[1][0], params_of(model, optimizer)[1][0])
    assert scaler_state() == {"loss_scale": scale / 2, "unskipped": 1}


def test_static_loss_scale_never_skips():
    model, optimizer = initialized("mlp", "O2", optimizer=torch.optim.SGD, loss_scale=128.0)
    (x, y), = make_batches("mlp", count=1)
    before = params_of(model, optimizer)[1]
    backward_with_inf(F.mse_loss(model(x), y), optimizer, model)
    optimizer.step()
    assert not torch.equal(before[0], params_of(model, optimizer)[1][0])
    assert scaler_state() == {"loss_scale": 128.0, "unskipped": 1}


def test_scale_grows_after_window_and_stays_within_bounds():
    model, optimizer = initialized("mlp", "O1", optimizer=torch.optim.SGD, lr=1e-3, scale_window=3,
                                   dynamic_init_scale=2.**4, max_loss_scale=2.**5, min_loss_scale=2.**3)
    (x, y), = make_batches("mlp", count=1)

    def clean_step():
        optimizer.zero_grad()
        with amp.scale_loss(F.mse_loss(model(x), y), optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()

    scales = []
    for _ in range(6):
        clean_step()
        scales.append(scaler_state()["loss_scale"])
    assert scales == [16, 16, 32, 32, 32, 32]  # grows after 3 clean steps, capped at max_loss_scale
    for _ in range(3):
        optimizer.zero_grad()
        backward_with_inf(F.mse_loss(model(x), y), optimizer, model)
        optimizer.step()
        scales.append(scaler_state()["loss_scale"])
    assert scales[6:] == [16, 8, 8]  # backs off, floored at min_loss_scale


def test_custom_growth_and_backoff_factors():
    model, optimizer = initialized("mlp", "O1", optimizer=torch.optim.SGD, scale_window=1,
                                   dynamic_init_scale=2.**8, scale_growth_factor=4., scale_backoff_factor=0.25)
    (x, y), = make_batches("mlp", count=1)
    with amp.scale_loss(F.mse_loss(model(x), y), optimizer) as scaled_loss:
        scaled_loss.backward()
    assert scaler_state()["loss_scale"] == 2.**10
    backward_with_inf(F.mse_loss(model(x), y), optimizer, model)
    assert scaler_state()["loss_scale"] == 2.**8


def test_unscale_is_one_launch_for_all_grads(monkeypatch):
    calls = []
    amp_C, applier = multi_tensor._fused_kernels()

    def counting_applier(kernel, flag, lists, *args):
        calls.append(len(lists[0]))
        return applier(kernel, flag, lists, *args)

    monkeypatch.setattr(multi_tensor, "_fused_kernels", lambda: (amp_C, counting_applier))
    model, optimizer = initialized("mlp", "O1")
    (x, y), = make_batches("mlp", count=1)
    with amp.scale_loss(F.mse_loss(model(x), y), optimizer) as scaled_loss:
        scaled_loss.backward()
    assert calls == [len(list(model.parameters()))]


def three_losses(models, optimizers, x, y):
    """apex's multiple models / optimizers / losses pattern: the third loss backpropagates into
    both models, so their grads accumulate across scale_loss blocks of different scalers."""
    (model0, model1), (optimizer0, optimizer1) = models, optimizers
    return [(F.mse_loss(model0(x), y), optimizer0),
            (F.mse_loss(model1(x), y), optimizer1),
            (F.mse_loss(model0(x) * model1(x), y), [optimizer0, optimizer1])]


def amp_iteration(models, optimizers, x, y, inject_nan_into=None):
    for optimizer in optimizers:
        optimizer.zero_grad()
    for loss_id, (loss, optimizer) in enumerate(three_losses(models, optimizers, x, y)):
        with amp.scale_loss(loss, optimizer, loss_id=loss_id) as scaled_loss:
            scaled_loss.backward()
            if loss_id == inject_nan_into:
                next(models[loss_id].parameters()).grad.view(-1)[0] = float("nan")
    for optimizer in optimizers:
        optimizer.step()


def fp32_iteration(models, optimizers, x, y):
    for optimizer in optimizers:
        optimizer.zero_grad()
    sum(loss for loss, _ in three_losses(models, optimizers, x, y)).backward()
    for optimizer in optimizers:
        optimizer.step()


@pytest.mark.parametrize("opt_level,tolerance", [("O0", dict(rtol=1e-5, atol=1e-6)),
                                                 ("O2", dict(rtol=0.05, atol=2e-3))])
def test_multiple_models_optimizers_losses(opt_level, tolerance):
    (x, y), = make_batches("mlp", count=1)
    models = [make_net("mlp", seed=0), make_net("mlp", seed=1)]
    references = [fp32_copy(model, torch.optim.SGD, lr=0.05) for model in models]
    reference_models, reference_optimizers = [list(pair) for pair in zip(*references)]
    optimizers = [torch.optim.SGD(model.parameters(), lr=0.05) for model in models]
    models, optimizers = amp.initialize(models, optimizers, opt_level=opt_level, num_losses=3,
                                        loss_scale="dynamic", verbosity=0)
    for _ in range(5):
        amp_iteration(models, optimizers, x, y)
        fp32_iteration(reference_models, reference_optimizers, x, y)
    for optimizer, reference_model in zip(optimizers, reference_models):
        for actual, expected in zip(amp.master_params(optimizer), reference_model.parameters()):
            torch.testing.assert_close(actual, expected, **tolerance)

    # A nan in loss 1 skips only optimizer1's step and backs off only scaler 1.
    before = [params_of(model, optimizer)[1] for model, optimizer in zip(models, optimizers)]
    scales = [scaler_state(i)["loss_scale"] for i in range(3)]
    amp_iteration(models, optimizers, x, y, inject_nan_into=1)
    after = [params_of(model, optimizer)[1] for model, optimizer in zip(models, optimizers)]
    assert not torch.equal(before[0][0], after[0][0])
    assert all(torch.equal(b, a) for b, a in zip(before[1], after[1]))
    assert [scaler_state(i)["loss_scale"] for i in range(3)] == [scales[0], scales[1] / 2, scales[2]]


@pytest.mark.parametrize("opt_level", ["O0", "O2"])
@pytest.mark.parametrize("combine_grad", [False, True])
def test_delay_unscale_accumulates_micro_batches(opt_level, combine_grad):
    batches = make_batches("mlp", count=3)
    model = make_net("mlp")
    reference, _ = fp32_copy(model, torch.optim.SGD, lr=0.1)
    model, optimizer = amp.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), opt_level=opt_level,
                                      loss_scale="dynamic", combine_grad=combine_grad, verbosity=0)
    optimizer.zero_grad()
    for i, (x, y) in enumerate(batches):
        with amp.scale_loss(F.mse_loss(model(x), y), optimizer, delay_unscale=i < len(batches) - 1) as scaled:
            scaled.backward()
        F.mse_loss(reference(x), y).backward()
    tolerance = dict(rtol=1e-5, atol=1e-7) if opt_level == "O0" else dict(rtol=0.02, atol=1e-3)
    for master, expected in zip(amp.master_params(optimizer), reference.parameters()):
        torch.testing.assert_close(master.grad, expected.grad, **tolerance)
