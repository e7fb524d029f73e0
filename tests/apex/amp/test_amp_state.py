"""The `amp._amp_state` fields scripts and apex's own tests read and set: loss_scalers,
opt_properties, handle, hard_override, allow_incoming_model_not_fp32; and the optimizers
amp.initialize accepts (LARC) or refuses (FP16_Optimizer)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from amp_testing import make_batches, make_net, train
from apex import DeprecatedFeatureWarning, amp
from apex.amp import _amp_state
from apex.amp.casting_handle import AmpHandle, NoOpHandle


def test_amp_state_is_the_shared_state_object():
    from apex.amp._amp_state import _amp_state as module_state

    assert _amp_state is module_state and amp._amp_state is module_state


def test_opt_properties_and_loss_scalers():
    model = make_net("mlp")
    model, optimizer = amp.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), opt_level="O2",
                                      num_losses=3, min_loss_scale=1.0, max_loss_scale=2.**20, verbosity=0)
    properties = _amp_state.opt_properties
    assert (properties.opt_level, properties.cast_model_type, properties.master_weights, properties.loss_scale) == \
        ("O2", torch.float16, True, "dynamic")
    assert len(_amp_state.loss_scalers) == 3
    assert (_amp_state.min_loss_scale, _amp_state.max_loss_scale) == (1.0, 2.**20)
    scaler = _amp_state.loss_scalers[0]
    assert scaler.loss_scale() == scaler._loss_scale == 2.**16 and scaler._unskipped == 0
    scaler._loss_scale = 4.0  # scripts set it directly; the next backward uses it
    (x, y), = make_batches("mlp", count=1)
    loss = F.mse_loss(model(x), y)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        assert scaled_loss.item() == pytest.approx(4 * loss.item())
        scaled_loss.backward()
    assert scaler._unskipped == 1


def test_handle_follows_the_opt_level():
    linear = F.linear
    amp.initialize(nn.Linear(2, 2), opt_level="O1", verbosity=0)
    assert isinstance(_amp_state.handle, AmpHandle) and _amp_state.handle.is_active() and F.linear is not linear
    amp.initialize(nn.Linear(2, 2), opt_level="O2", verbosity=0)  # a new run replaces O1's casts
    assert isinstance(_amp_state.handle, NoOpHandle) and F.linear is linear
    _amp_state.handle._deactivate()  # always callable, as apex's tests do after every level


@pytest.mark.parametrize("opt_level", ["O1", "O2", "O4", "O5"])
def test_allow_incoming_model_not_fp32(opt_level):
    low = torch.bfloat16 if opt_level in ("O4", "O5") else torch.float16
    model = make_net("mlp").to(low)
    with pytest.raises(RuntimeError, match="expected a float32 param"):
        amp.initialize(model, opt_level=opt_level, verbosity=0)
    _amp_state.allow_incoming_model_not_fp32 = True
    model, optimizer = amp.initialize(model, torch.optim.SGD(model.parameters(), lr=0.05), opt_level=opt_level,
                                      cast_model_type=False if opt_level in ("O2", "O5") else None, verbosity=0)
    assert all(p.dtype == low for p in model.parameters())
    masters = list(amp.master_params(optimizer))
    assert all(m.dtype == (torch.float32 if opt_level in ("O2", "O5") else low) for m in masters)
    # Without a model cast nothing casts the inputs: they come in the model's type.
    batches = [(x.to(low), y.to(low)) for x, y in make_batches("mlp")]
    losses = train("mlp", model, optimizer, batches, steps=30)
    assert sum(losses[-5:]) < sum(losses[:5])


def test_hard_override_turns_conflicts_into_warnings(capsys):
    _amp_state.hard_override = True
    model = amp.initialize(make_net("mlp").half(), opt_level="O1", master_weights=True, verbosity=0)
    printed = capsys.readouterr().out
    assert "Warning:  Found param" in printed and "master_weights with O1" in printed
    assert isinstance(model, nn.Module)


@pytest.mark.parametrize("opt_level", ["O0", "O1", "O2", "O3"])
def test_larc_is_an_optimizer_for_amp(opt_level):
    larc_module = pytest.importorskip("apex.parallel.LARC")
    model = make_net("mlp")
    optimizer = larc_module.LARC(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5))
    model, optimizer = amp.initialize(model, optimizer, opt_level=opt_level, verbosity=0)
    before = [p.detach().clone() for p in amp.master_params(optimizer)]
    losses = train("mlp", model, optimizer, make_batches("mlp"), steps=3)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert not torch.equal(before[0], next(amp.master_params(optimizer)))


def test_fp16_optimizer_is_refused():
    from apex.fp16_utils import FP16_Optimizer

    model = make_net("mlp").half()
    with pytest.warns(DeprecatedFeatureWarning):
        optimizer = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), verbose=False)
    with pytest.raises(RuntimeError, match="instance of apex.fp16_utils.FP16_Optimizer"):
        amp.initialize(make_net("mlp"), optimizer, opt_level="O1", verbosity=0)
