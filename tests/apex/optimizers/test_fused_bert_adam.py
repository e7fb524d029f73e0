"""FusedBertAdam against BertAdam as pytorch-pretrained-BERT (and Ascend's NpuFusedBertAdam) define it."""
import pytest
import torch
from optimizer_testing import DEVICES, DTYPES, RoundedShadow, compare_with_reference, make_params
from reference_optimizers import BertAdamReference

from apex.optimizers import FusedBertAdam

CASES = {
    "constant_lr": dict(),
    "clipped": dict(max_grad_norm=1.0),  # these grads' norm (~290) is far above 1
    "warmup_linear": dict(warmup=0.2, t_total=15),
    "warmup_cosine": dict(warmup=0.1, t_total=30, schedule="warmup_cosine"),
    "warmup_constant": dict(warmup=0.3, t_total=10, schedule="warmup_constant"),
    "warmup_poly": dict(warmup=0.1, t_total=40, schedule="warmup_poly", max_grad_norm=5.0),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_matches_reference(device, dtype, case):
    hyper = dict(lr=1e-2, b1=0.8, b2=0.95, e=1e-6, weight_decay=0.01, **CASES[case])
    params = make_params(dtype, device)
    reference = RoundedShadow(params, lambda ps: BertAdamReference(ps, **hyper))
    optimizer = FusedBertAdam(params, **hyper)
    compare_with_reference(optimizer, params, reference)
    assert optimizer.state[params[0]]["step"].item() == 20


@pytest.mark.parametrize("bad, match", [(dict(warmup=1.5), "Invalid warmup"), (dict(schedule="cosine"), "Invalid schedule"),
                                        (dict(b1=1.0), "Invalid b1"), (dict(b2=-0.1), "Invalid b2"),
                                        (dict(e=-1.0), "Invalid epsilon"), (dict(lr=float("nan")), "Invalid learning rate")])
def test_refuses_bad_arguments(bad, match):
    with pytest.raises(ValueError, match=match):
        FusedBertAdam(make_params(torch.float32, "cpu", shapes=[(3,)]), **{"lr": 1e-3, **bad})


def test_lr_is_required():
    with pytest.raises(ValueError, match="required optimization parameter lr"):
        FusedBertAdam(make_params(torch.float32, "cpu", shapes=[(3,)]))
