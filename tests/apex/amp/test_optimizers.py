"""amp works with apex's fused optimizers and with torch.optim's (LR schedulers included)."""
import functools

import pytest
import torch

from amp_testing import CUDA, initialized, make_batches, params_of, train
from apex import amp

DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opt_level,options", [("O1", {}), ("O2", {}), ("O5", {}), ("O2", {"combine_grad": True})])
def test_fused_adam_matches_torch_adamw(device, opt_level, options):
    optimizers = pytest.importorskip("apex.optimizers")
    batches = make_batches("convnet", device)
    runs = []
    for optimizer_type in (torch.optim.AdamW, optimizers.FusedAdam):
        # The two defaults differ (AdamW 0.01, FusedAdam 0): compare like with like.
        optimizer_type = functools.partial(optimizer_type, weight_decay=0.01)
        model, optimizer = initialized("convnet", opt_level, device, optimizer=optimizer_type, lr=1e-2, **options)
        first_losses = train("convnet", model, optimizer, batches, steps=1)
        after_one_step = params_of(model, optimizer)[1]
        losses = first_losses + train("convnet", model, optimizer, batches, steps=19, start=1)
        runs.append((losses, after_one_step))
    (expected_losses, expected_masters), (losses, masters) = runs
    # One step agrees to rounding; later, Adam's m/sqrt(v) on near-zero grads amplifies rounding
    # differences in the params (even in fp32), so the run is compared by its losses.
    for actual, expected in zip(masters, expected_masters):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(losses, expected_losses, rtol=1e-2, atol=1e-3)


def test_lr_scheduler_wraps_the_amp_step():
    model, optimizer = initialized("mlp", "O2", optimizer=torch.optim.SGD, lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    train("mlp", model, optimizer, make_batches("mlp"), steps=1)
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05)
