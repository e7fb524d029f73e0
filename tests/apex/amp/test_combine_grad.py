"""combine_grad=True: grads live in one flat buffer per dtype; training is unchanged."""
import pytest
import torch
import torch.nn.functional as F

from amp_testing import initialized, make_batches, params_of, train
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
