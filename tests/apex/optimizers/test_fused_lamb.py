"""FusedLAMB against a plain-PyTorch LAMB written from apex's definition."""
import pytest
import torch
from lamb_reference import LambReference
from optimizer_testing import DEVICES, DTYPES, compare_with_reference, make_params

from apex.optimizers import FusedLAMB


HYPER = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.01)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("adam_w_mode", [True, False])
def test_matches_reference(device, dtype, adam_w_mode):
    params = make_params(dtype, device)
    optimizer = FusedLAMB(params, adam_w_mode=adam_w_mode, **HYPER)
    compare_with_reference(optimizer, params, LambReference(params, adam_w_mode=adam_w_mode, **HYPER), late=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "options",
    [
        dict(use_nvlamb=True),
        dict(grad_averaging=False, bias_correction=False),
        dict(max_grad_norm=float("inf")),  # the global norm of these grads (~290) is never reached
    ],
    ids=["nvlamb", "no_averaging_no_bias_correction", "no_clipping"],
)
def test_options_match_reference(device, options):
    params = make_params(torch.float32, device)
    # Weight decay 0 in the second group: the trust ratio applies there only with use_nvlamb.
    groups = [{"params": params[:2]}, {"params": params[2:], "weight_decay": 0.0}]
    weight_decays = [HYPER["weight_decay"]] * 2 + [0.0] * (len(params) - 2)
    optimizer = FusedLAMB(groups, **HYPER, **options)
    compare_with_reference(optimizer, params, LambReference(params, weight_decays, **HYPER, **options))
