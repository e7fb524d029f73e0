"""Bad opt levels, conflicting overrides, repeated initialize and misuse raise apex's messages."""
import pytest
import torch
import torch.nn as nn

from amp_testing import initialized, make_batches, make_net
from apex import amp
from apex.amp._amp_state import _amp_state


def fresh():
    model = make_net("mlp")
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


@pytest.mark.parametrize("opt_level", ["O6", "00", "o1", None])
def test_unknown_opt_level(opt_level):
    with pytest.raises(RuntimeError, match="Unexpected optimization level .*the prefix O is the letter O"):
        amp.initialize(*fresh(), opt_level=opt_level, verbosity=0)


@pytest.mark.parametrize("opt_level,override,message", [
    ("O1", dict(cast_model_type=torch.float16), "O1 inserts casts around Torch functions rather than model weights"),
    ("O4", dict(cast_model_type=torch.bfloat16), "use opt_level='O5' or 'O3'"),
    ("O1", dict(master_weights=True), "It doesn't make sense to use master_weights with O1"),
    ("O1", dict(keep_batchnorm_fp32=True), "With opt_level O1, batchnorm functions are automatically patched"),
    ("O2", dict(patch_torch_functions=True), "patch_torch_functions=True should only be set by selecting"),
])
def test_conflicting_overrides(opt_level, override, message):
    with pytest.raises(RuntimeError, match=message):
        amp.initialize(*fresh(), opt_level=opt_level, verbosity=0, **override)


@pytest.mark.parametrize("override,message", [
    (dict(keep_batchnorm_fp32="maybe"), "keep_batchnorm_fp32 must be a boolean"),
    (dict(loss_scale="huge"), "loss_scale must be 'dynamic' or a positive number"),
    (dict(loss_scale=-1.0), "loss_scale must be 'dynamic' or a positive number"),
    (dict(cast_model_type=torch.int8), "cast_model_type must be a floating-point torch.dtype"),
    (dict(patch_torch_functions_type=torch.float64), "patch_torch_functions_type must be"),
    (dict(num_losses=0), "num_losses must be a positive integer"),
    (dict(scale_window=0), "scale_window must be a positive integer"),
    (dict(min_loss_scale=2.**30), "min_loss_scale must lie in"),
    (dict(scale_backoff_factor=2.0), "scale_backoff_factor lie in"),
])
def test_invalid_values(override, message):
    with pytest.raises(ValueError, match=message):
        amp.initialize(*fresh(), opt_level="O2", verbosity=0, **override)


def test_refused_initialize_leaves_model_untouched():
    model, optimizer = fresh()
    with pytest.raises(ValueError):
        amp.initialize(model, optimizer, opt_level="O2", loss_scale="huge", verbosity=0)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert not hasattr(optimizer, "_amp_stash")


def test_initialize_twice():
    model, optimizer = initialized("mlp", "O1")
    with pytest.raises(RuntimeError, match="A given optimizer should only be passed through amp.initialize once"):
        amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
    with pytest.raises(RuntimeError, match="A given model should only be passed through amp.initialize once"):
        amp.initialize(model, opt_level="O1", verbosity=0)


def test_half_model_and_parallel_wrapper_are_refused():
    with pytest.raises(RuntimeError, match="you do not need to call .half\\(\\) or .bfloat16\\(\\) on your"):
        amp.initialize(make_net("mlp").half(), opt_level="O2", verbosity=0)
    with pytest.raises(RuntimeError, match="Parallel wrappers should only be applied to the model"):
        amp.initialize(nn.DataParallel(make_net("mlp")), opt_level="O1", verbosity=0)


def test_wrong_types():
    with pytest.raises(TypeError, match="models must be either a single model or a list of models"):
        amp.initialize("model", opt_level="O1", verbosity=0)
    with pytest.raises(TypeError, match="optimizers must be either a single optimizer or a list"):
        amp.initialize(make_net("mlp"), "sgd", opt_level="O1", verbosity=0)


def test_scale_loss_misuse(monkeypatch):
    model, optimizer = initialized("mlp", "O2")
    (x, y), = make_batches("mlp", count=1)
    loss = nn.functional.mse_loss(model(x), y)
    with pytest.raises(ValueError, match="loss_id 1 is out of range"):
        with amp.scale_loss(loss, optimizer, loss_id=1):
            pass
    _, stranger = fresh()
    with pytest.raises(RuntimeError, match="not passed through amp.initialize"):
        with amp.scale_loss(loss, stranger):
            pass
    with pytest.raises(RuntimeError, match="Amp does not support closure"):
        optimizer.step(lambda: loss)
    monkeypatch.setattr(_amp_state, "opt_properties", None)
    with pytest.raises(RuntimeError, match="internal Amp state has not been initialized"):
        with amp.scale_loss(loss, optimizer):
            pass


def test_load_state_dict_unexpected_key():
    initialized("mlp", "O1")
    with pytest.raises(RuntimeError, match='Unexpected key\\(s\\) in state_dict: "scale"'):
        amp.load_state_dict({"loss_scaler0": {"loss_scale": 1.0, "unskipped": 0}, "scale": 2})


def test_disabled_amp_is_transparent():
    model, optimizer = fresh()
    assert amp.initialize(model, optimizer, enabled=False) == (model, optimizer)
    loss = torch.tensor(3.0)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        assert scaled_loss is loss
