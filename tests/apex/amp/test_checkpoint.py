"""Saving model, optimizer and amp state, then restoring after amp.initialize, resumes the run
bit for bit (losses, weights, fp32 masters, loss scale)."""
import io

import pytest
import torch

from amp_testing import CUDA, make_batches, make_net, params_of, train
from apex import amp

STEPS = 6
CPU_CASES = [(level, {}, "cpu") for level in ("O0", "O1", "O2", "O3", "O4", "O5")]
GPU_CASES = [pytest.param(level, options, "cuda", marks=CUDA)
             for level, options in (("O1", {}), ("O2", {}), ("O3", {}), ("O5", {}), ("O2", {"combine_grad": True}))]
CASES = CPU_CASES + [("O2", {"combine_grad": True}, "cpu")] + GPU_CASES


def fresh_run(opt_level, options, device):
    model = make_net("convnet", device, seed=0)
    # O3 keeps optimizer state in fp16 too, where Adam's default eps (1e-8) flushes to zero.
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, eps=1e-4)
    # A short scale window, so the loss scale changes within the run and must be restored.
    return amp.initialize(model, optimizer, opt_level=opt_level, scale_window=4, verbosity=0, **options)


@pytest.mark.parametrize("opt_level,options,device", CASES)
def test_checkpoint_round_trip_is_bit_identical(opt_level, options, device):
    batches = make_batches("convnet", device)
    model, optimizer = fresh_run(opt_level, options, device)
    train("convnet", model, optimizer, batches, STEPS)
    checkpoint = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "amp": amp.state_dict()},
               checkpoint)
    expected_losses = train("convnet", model, optimizer, batches, STEPS, start=STEPS)
    expected_params = params_of(model, optimizer)
    expected_amp = amp.state_dict()

    model, optimizer = fresh_run(opt_level, options, device)
    checkpoint.seek(0)
    saved = torch.load(checkpoint)
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    amp.load_state_dict(saved["amp"])
    assert amp.state_dict() == saved["amp"]
    losses = train("convnet", model, optimizer, batches, STEPS, start=STEPS)

    assert losses == expected_losses
    model_params, masters = params_of(model, optimizer)
    for expected, actual in zip(expected_params[0] + expected_params[1], model_params + masters):
        assert torch.equal(expected, actual)
    assert amp.state_dict() == expected_amp
