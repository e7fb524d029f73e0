"""Lamb (the unfused reference) against pytorch-lamb's formula, and NpuFusedLamb against Lamb."""
import pytest
import torch
from optimizer_testing import DEVICES, DTYPES, RoundedShadow, clone_params, compare_with_reference, make_params
from optimizer_testing import save_and_load, train
from reference_optimizers import LambFormula

from apex.optimizers import Lamb, NpuFusedLamb

HYPER = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.01)


@pytest.mark.parametrize("adam", [False, True])
def test_lamb_is_the_published_update(adam):
    params = make_params(torch.float32, "cpu")
    reference = RoundedShadow(params, lambda ps: LambFormula(ps, adam=adam, **HYPER))
    optimizer = Lamb(params, adam=adam, **HYPER)
    compare_with_reference(optimizer, params, reference, late=True)
    assert {"weight_norm", "adam_norm", "trust_ratio"} <= set(optimizer.state[params[0]])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("options", [dict(), dict(adam=True), dict(use_global_grad_norm=True), dict(weight_decay=0.0)],
                         ids=["lamb", "adam", "global_grad_norm", "no_decay"])
def test_npu_fused_lamb_matches_formula(device, dtype, options):
    hyper = {**HYPER, **options}
    params = make_params(dtype, device)
    reference = RoundedShadow(params, lambda ps: LambFormula(ps, **hyper))
    compare_with_reference(NpuFusedLamb(params, **hyper), params, reference, late=True)


@pytest.mark.parametrize("device", DEVICES)
def test_state_dicts_move_between_lamb_and_npu_fused_lamb(device):
    params = make_params(torch.float32, device)
    fused = NpuFusedLamb(params, **HYPER)
    train(fused, params, range(4))
    continued = clone_params(params)
    plain = Lamb(continued, **HYPER)
    plain.load_state_dict(save_and_load(fused.state_dict()))
    train(fused, params, range(4, 9))
    train(plain, continued, range(4, 9))
    for a, b in zip(params, continued):
        torch.testing.assert_close(a, b, rtol=5e-5, atol=1e-5)
