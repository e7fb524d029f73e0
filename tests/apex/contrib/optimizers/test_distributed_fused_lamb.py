"""DistributedFusedLAMB on 1, 2 and 3 gloo ranks equals FusedLAMB on one process over the global
batch: the global gradient norm and each parameter's trust ratio come from whole parameters,
though each rank holds fragments of them."""
from __future__ import annotations

import pytest
import torch
import zero_testing as zt

LAMB_TRAIN = [n for n, c in zt.CASES.items() if c["kind"] == "train" and c["optimizer"] == "lamb"]


@pytest.mark.parametrize("name", LAMB_TRAIN)
def test_training_equals_fused_lamb_on_the_global_batch(results, world, name):
    expected, _ = zt.reference_train(zt.CASES[name], world)
    for rank in range(world):
        zt.assert_close(zt.result_of(results, name, rank)["params"], expected, torch.float32, results.device)


def test_bf16_parameters_with_float32_master(results, world):
    case = zt.CASES["manual_lamb_bf16"]
    expected, _ = zt.reference_manual(case, [world] * zt.STEPS)
    got = zt.result_of(results, "manual_lamb_bf16")
    zt.assert_close(got["master"], expected, torch.float32, results.device)
    zt.assert_close(got["params"], [e.to(torch.bfloat16) for e in expected], torch.bfloat16, results.device)


def test_apex_lamb_controls(one_rank_group):
    """set_global_scale unscales the next step; L2_grad_norm reports the unscaled norm;
    set_is_accumulation_step holds the reduction back until complete_reductions."""
    from apex.contrib.optimizers import DistributedFusedLAMB

    case = dict(zt.CASES["manual_lamb_bf16"], dtype=torch.float32, options={"max_grad_norm": 1.0})
    params = [p.detach().requires_grad_() for p in zt.manual_params(torch.float32)]
    optimizer = DistributedFusedLAMB(params, **zt.LAMB, max_grad_norm=1.0)
    grads = zt.manual_grads(0, 0, params)
    optimizer.set_global_scale(64.0)
    assert optimizer.global_scale == 64.0
    optimizer.set_is_accumulation_step(True)
    for p, g in zip(params, grads):
        p.grad = g * 64.0
    optimizer.set_is_accumulation_step(False)
    optimizer.complete_reductions()
    expected_norm = torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in grads]))
    torch.testing.assert_close(optimizer.L2_grad_norm, expected_norm, rtol=1e-5, atol=1e-6)
    optimizer.step()
    masters, _ = zt.reference_manual(case, [1])
    zt.assert_close(params, masters, torch.float32)


@pytest.mark.parametrize("option, value, error", [
    ("e5m2_allgather", True, NotImplementedError),
    ("skip_allgather", True, NotImplementedError),
    ("clip_after_ar", False, NotImplementedError),
    ("step_supports_amp_scaling", False, ValueError),
    ("max_grad_norm", -1.0, ValueError),
    ("capturable", True, TypeError),
    ("dtype", torch.bfloat16, TypeError),
])
def test_unsupported_lamb_options_are_refused(one_rank_group, option, value, error):
    from apex.contrib.optimizers import DistributedFusedLAMB

    with pytest.raises(error, match=option if error is not ValueError else None):
        DistributedFusedLAMB([torch.zeros(3, requires_grad=True)], **{option: value})
