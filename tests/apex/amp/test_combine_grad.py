"""combine_grad=True: grads live in one flat buffer per dtype; training is unchanged."""
from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F

from amp_testing import initialized, make_batches, make_net, params_of, train
from apex import amp


def shares_storage(tensor, buffer):
    return tensor.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()


@pytest.mark.parametrize("opt_level", ["O1", "O2"])
def test_grads_are_views_into_one_buffer(opt_level):
    model, optimizer = initialized("mlp", opt_level, combine_grad=True)
    train("mlp", model, optimizer, make_batches("mlp"), steps=2)
    grads = optimizer._amp_stash.grad_sets[0]
    buffers = grads.buffers if opt_level == "O1" else grads.master_buffers
    assert len(buffers) == 1
    assert all(shares_storage(p.grad, buffers[0]) for p in amp.master_params(optimizer))


@pytest.mark.parametrize("opt_level", ["O1", "O2", "O5"])
def test_training_matches_per_param_grads_exactly(opt_level):
    batches = make_batches("mlp")
    runs = []
    for combine_grad in (False, True):
        model, optimizer = initialized("mlp", opt_level, combine_grad=combine_grad)
        losses = train("mlp", model, optimizer, batches, steps=10)
        runs.append((losses, params_of(model, optimizer)))
    (losses, (model_params, masters)), (combined_losses, (combined_params, combined_masters)) = runs
    assert losses == combined_losses
    assert all(torch.equal(a, b) for a, b in zip(model_params + masters, combined_params + combined_masters))


def test_model_zero_grad_to_none_is_tolerated():
    model, optimizer = initialized("mlp", "O2", combine_grad=True)
    (x, y), = make_batches("mlp", count=1)
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        optimizer.zero_grad()
        with amp.scale_loss(F.mse_loss(model(x), y), optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
    buffer = optimizer._amp_stash.grad_sets[0].model_buffers[0]
    assert all(shares_storage(p.grad, buffer) for p in model.parameters())


def grow_head(model):
    """Two more outputs for the last layer (as scripts do when resizing embeddings), in place."""
    head = model[4]
    with torch.no_grad():
        head.weight.data = torch.cat([head.weight, torch.full((2, head.in_features), 0.01)])
        head.bias.data = torch.cat([head.bias, torch.zeros(2)])


def train_grown(model, optimizer, steps=3):
    batches = [(x, torch.cat([y, y[:, :2]], dim=1)) for x, y in make_batches("mlp")]
    return train("mlp", model, optimizer, batches, steps)


@pytest.mark.parametrize("opt_level", ["O1", "O2"])
def test_check_combined_tensors_rebuilds_buffers_the_params_outgrew(opt_level):
    runs = []
    for combine_grad in (False, True):
        model, optimizer = initialized("mlp", opt_level, optimizer=torch.optim.SGD, combine_grad=combine_grad,
                                       check_combined_tensors=combine_grad)
        train("mlp", model, optimizer, make_batches("mlp"), steps=2)
        if opt_level == "O2":  # the params the optimizer updates are the masters
            grow_head_of = [p for p in amp.master_params(optimizer)][-2:]
            model_head = model[4]
            with torch.no_grad():
                for master, param in zip(grow_head_of, (model_head.weight, model_head.bias)):
                    grown = torch.cat([master, torch.full((2,) + master.shape[1:], 0.01)])
                    master.data, param.data = grown, grown.to(param.dtype)
        else:
            grow_head(model)
        with pytest.warns(UserWarning, match="Combined grad has been destroyed") if combine_grad else nullcontext():
            runs.append((train_grown(model, optimizer), params_of(model, optimizer)))
    (losses, (params, masters)), (combined_losses, (combined_params, combined_masters)) = runs
    assert losses == combined_losses
    assert all(torch.equal(a, b) for a, b in zip(params + masters, combined_params + combined_masters))
    grads = optimizer._amp_stash.grad_sets[0]
    buffer = grads.buffers[0] if opt_level == "O1" else grads.master_buffers[0]
    assert all(shares_storage(p.grad, buffer) for p in amp.master_params(optimizer))


def test_without_check_combined_tensors_a_grown_param_is_an_error():
    model, optimizer = initialized("mlp", "O1", optimizer=torch.optim.SGD, combine_grad=True)
    grow_head(model)
    with pytest.raises(RuntimeError):
        train_grown(model, optimizer)


def test_check_combined_tensors_without_combine_grad_says_it_does_nothing(capsys):
    model = make_net("mlp")
    amp.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), opt_level="O1", check_combined_tensors=True)
    assert "check_combined_tensors=True has no effect" in capsys.readouterr().out
