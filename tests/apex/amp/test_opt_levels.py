"""Every opt level trains a small MLP and a small conv net (batchnorm) along the fp32 loss curve."""
import pytest
import torch

from amp_testing import CUDA, fp32_copy, make_batches, make_net, train
from apex import amp

# A few hundred steps for the MLP; the conv net runs slow fp16/bf16 CPU conv kernels, so fewer.
STEPS = {"mlp": 200, "convnet": 100}
WINDOW = 25  # compare window means: single steps of a low-precision run jitter around fp32
# Allowed gap between window means, relative to the first fp32 loss.
TOLERANCE = {"O0": 1e-5, "O1": 0.02, "O2": 0.02, "O3": 0.03, "O4": 0.06, "O5": 0.06}

CPU_LEVELS = ["O0", "O1", "O2", "O3", "O4", "O5"]  # torch's CPU kernels take fp16 and bf16
GPU_LEVELS = ["O1", "O2", "O3", "O4", "O5"]
CASES = ([(level, "cpu") for level in CPU_LEVELS]
         + [pytest.param(level, "cuda", marks=CUDA, id=f"{level}-cuda") for level in GPU_LEVELS])


def window_means(losses):
    return torch.tensor(losses).view(-1, WINDOW).mean(1)


@pytest.mark.parametrize("kind", ["mlp", "convnet"])
@pytest.mark.parametrize("opt_level,device", CASES)
def test_loss_curve_tracks_fp32(kind, opt_level, device):
    batches = make_batches(kind, device)
    model = make_net(kind, device)
    # SGD with momentum: its update is well defined in pure fp16/bf16 too (O3), unlike Adam's eps.
    options = dict(lr=0.05, momentum=0.9)
    reference, reference_opt = fp32_copy(model, torch.optim.SGD, **options)
    model, optimizer = amp.initialize(model, torch.optim.SGD(model.parameters(), **options),
                                      opt_level=opt_level, verbosity=0)

    expected = train(kind, reference, reference_opt, batches, STEPS[kind], use_amp=False)
    actual = train(kind, model, optimizer, batches, STEPS[kind])

    assert all(torch.isfinite(torch.tensor(actual)))
    expected_means, actual_means = window_means(expected), window_means(actual)
    assert expected_means[-1] < 0.5 * expected_means[0], "the task must be learnable for the test to mean anything"
    gap = (actual_means - expected_means).abs().max().item()
    assert gap <= TOLERANCE[opt_level] * expected[0], f"{opt_level} strays from fp32 by {gap:.4g}"
