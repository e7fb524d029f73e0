"""Every fused optimizer resumes bit-identically from a saved state dict, float32 state of
fp16/bf16 params included."""
import copy
import pickle

import pytest
import torch
from optimizer_testing import DEVICES, clone_params, make_params, save_and_load, train

from apex.optimizers import FusedAdagrad, FusedAdam, FusedLAMB, FusedMixedPrecisionLamb, FusedNovoGrad, FusedSGD

# (factory, param dtype); fp16/bf16 params exercise state kept in float32.
OPTIMIZERS = {
    "adam": (lambda ps: FusedAdam(ps, lr=1e-3, weight_decay=0.01), torch.float16),
    "adam_capturable_master": (
        lambda ps: FusedAdam(ps, lr=1e-3, capturable=True, master_weights=True),
        torch.bfloat16,
    ),
    "lamb": (lambda ps: FusedLAMB(ps, lr=1e-2), torch.float32),
    "sgd": (lambda ps: FusedSGD(ps, lr=0.05, momentum=0.9), torch.float16),
    "novograd": (lambda ps: FusedNovoGrad(ps, lr=1e-2), torch.float32),
    "adagrad": (lambda ps: FusedAdagrad(ps, lr=0.05), torch.bfloat16),
    "mixed_precision_lamb": (
        lambda ps: FusedMixedPrecisionLamb(ps, lr=1e-2, reduced_precision_dtype=torch.bfloat16),
        torch.bfloat16,
    ),
}
# Capturable optimizers take one step count per launch, so no param may start late there.
SAME_START = {"adam_capturable_master", "mixed_precision_lamb"}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_resume_is_bit_identical(device, name):
    make_optimizer, dtype = OPTIMIZERS[name]
    late = name not in SAME_START
    uninterrupted = make_params(dtype, device)
    train(make_optimizer(uninterrupted), uninterrupted, range(20), late)

    interrupted = make_params(dtype, device)
    first = make_optimizer(interrupted)
    train(first, interrupted, range(10), late)
    state = save_and_load(first.state_dict())
    resumed = clone_params(interrupted)
    second = make_optimizer(resumed)
    second.load_state_dict(state)
    for param, saved in zip(resumed, interrupted):
        for key, value in first.state[saved].items():
            loaded = second.state[param][key]
            assert loaded.dtype == value.dtype and loaded.device == value.device, key
    train(second, resumed, range(10, 20), late)
    for index, (param, expected) in enumerate(zip(resumed, uninterrupted)):
        assert torch.equal(param, expected), f"param {index} differs after resuming"


@pytest.mark.parametrize("copy_kind", ["deepcopy", "pickle"])
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_copied_optimizer_keeps_settings_and_resumes(name, copy_kind):
    """deepcopy / pickle of (params, optimizer) mid-training keeps the settings held as attributes
    (adam_w_mode, capturable, set_grad_none, ...), not only the param groups, and trains on identically."""
    make_optimizer, dtype = OPTIMIZERS[name]
    late = name not in SAME_START
    params = make_params(dtype, "cpu")
    optimizer = make_optimizer(params)
    train(optimizer, params, range(10), late)
    if copy_kind == "deepcopy":
        params_copy, optimizer_copy = copy.deepcopy((params, optimizer))
    else:
        params_copy, optimizer_copy = pickle.loads(pickle.dumps((params, optimizer)))
    settings = {k: v for k, v in vars(optimizer).items() if not k.startswith("_") and k not in ("defaults", "state", "param_groups")}
    assert settings, "the optimizer has settings to compare"
    for key, value in settings.items():
        assert getattr(optimizer_copy, key) == value, key
    train(optimizer, params, range(10, 20), late)
    train(optimizer_copy, params_copy, range(10, 20), late)
    for index, (param, expected) in enumerate(zip(params_copy, params)):
        assert torch.equal(param, expected), f"param {index} differs after the copy"
