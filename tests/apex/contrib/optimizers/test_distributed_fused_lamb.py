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


@pytest.mark.parametrize("name", ["manual_lamb_clip_before_reduction", "manual_lamb_clip_before_reduction_contiguous"])
def test_clip_after_ar_false_clips_each_ranks_gradient_before_the_reduction(results, world, name):
    """NVIDIA apex's clip_after_ar=False: every rank scales its own gradient to norm <= max_grad_norm,
    the clipped gradients are averaged, and the step itself clips no more (the norm is taken over
    the buckets, whose stale regions must be zeros by then)."""
    case = zt.CASES[name]
    params = zt.manual_params(torch.float32)
    masters = [p.detach().clone().requires_grad_() for p in params]
    optimizer = zt.reference_optimizer(dict(case, options={}), masters)  # FusedLAMB, no clipping
    for step in range(zt.STEPS):
        clipped = []
        for rank in range(world):
            grads = zt.manual_grads(step, rank, params)
            norm = torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in grads]))
            coefficient = torch.clamp(1.0 / (norm + 1e-6), max=1.0)
            clipped.append([g * coefficient for g in grads])
        for i, master in enumerate(masters):
            master.grad = torch.stack([grads[i] for grads in clipped]).mean(0)
        optimizer.step()
    got = zt.result_of(results, name)
    zt.assert_close(got["master"], [m.detach() for m in masters], torch.float32, results.device)
    zt.assert_close(got["params"], [m.detach() for m in masters], torch.float32, results.device)


def test_lr_override_and_lazy_init_stages(one_rank_group):
    """A learning rate assigned to optimizer._lr replaces the groups' (apex's step reads it);
    the lazy-init stages of apex's training loops fix the layout and are idempotent."""
    from apex.contrib.optimizers import DistributedFusedLAMB

    case = dict(zt.CASES["manual_lamb_bf16"], dtype=torch.float32, options={})
    params = [p.detach().requires_grad_() for p in zt.manual_params(torch.float32)]
    optimizer = DistributedFusedLAMB(params, **{**zt.LAMB, "lr": 123.0})
    optimizer._lazy_init_stage1()
    layout = optimizer._buckets
    optimizer._lazy_init_stage2()
    optimizer._lazy_init_stage1()
    assert optimizer._buckets is layout
    optimizer._lr = torch.tensor(zt.LAMB["lr"])
    optimizer.set_last_step(True)
    for p, g in zip(params, zt.manual_grads(0, 0, params)):
        p.grad = g
    optimizer.step()
    masters, _ = zt.reference_manual(case, [1])
    zt.assert_close(params, masters, torch.float32)


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
    ("step_supports_amp_scaling", False, ValueError),
    ("max_grad_norm", -1.0, ValueError),
    ("capturable", True, TypeError),
    ("dtype", torch.bfloat16, TypeError),
])
def test_unsupported_lamb_options_are_refused(one_rank_group, option, value, error):
    from apex.contrib.optimizers import DistributedFusedLAMB

    with pytest.raises(error, match=option if error is not ValueError else None):
        DistributedFusedLAMB([torch.zeros(3, requires_grad=True)], **{option: value})
