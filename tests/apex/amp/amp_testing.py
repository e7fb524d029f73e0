"""Small nets, fixed data and a training loop shared by the amp tests (imported by them)."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from apex import amp

CUDA = pytest.mark.gpu


class ConvNet(nn.Module):
    """Two conv + batchnorm blocks and a linear head over 3x6x6 images, 4 classes."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.features(x))


def make_net(kind, device="cpu", seed=0):
    torch.manual_seed(seed)
    if kind == "mlp":
        net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    else:
        net = ConvNet()
    return net.to(device)


def make_batches(kind, device="cpu", count=8, seed=1):
    """A fixed, learnable task: MLP regression onto a random teacher, ConvNet classification by a
    random linear map of the mean image. `count` batches, reused cyclically.

    Always float32, also while amp's casts are installed (made after `amp.init()`, `x @ teacher` would
    run in fp16, and an fp16 target beside an fp32 output is refused by torch 2.11's mse_loss backward)."""
    gen = torch.Generator().manual_seed(seed)
    with amp.disable_casts():
        if kind == "mlp":
            teacher = torch.randn(16, 4, generator=gen) / 4
            xs = [torch.randn(64, 16, generator=gen) for _ in range(count)]
            batches = [(x, torch.tanh(x @ teacher)) for x in xs]
        else:
            teacher = torch.randn(3, 4, generator=gen)
            xs = [torch.randn(32, 3, 6, 6, generator=gen) for _ in range(count)]
            batches = [(x, (x.mean((2, 3)) @ teacher).argmax(1)) for x in xs]
    return [(x.to(device), y.to(device)) for x, y in batches]


def loss_of(kind, output, target):
    return F.mse_loss(output, target) if kind == "mlp" else F.cross_entropy(output, target)


def train(kind, model, optimizer, batches, steps, use_amp=True, start=0):
    """Plain training loop (amp.scale_loss when `use_amp`); returns the fp32 loss of every step."""
    losses = []
    for step in range(start, start + steps):
        x, y = batches[step % len(batches)]
        optimizer.zero_grad()
        loss = loss_of(kind, model(x), y)
        if use_amp:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def params_of(model, optimizer):
    """Copies of the model's params and of the optimizer's (fp32 masters under O2/O5)."""
    return ([p.detach().clone() for p in model.parameters()],
            [p.detach().clone() for p in amp.master_params(optimizer)])


def initialized(kind, opt_level, device="cpu", optimizer=torch.optim.Adam, lr=1e-2, **amp_options):
    model = make_net(kind, device)
    opt = optimizer(model.parameters(), lr=lr)
    return amp.initialize(model, opt, opt_level=opt_level, verbosity=0, **amp_options)


def fp32_copy(model, optimizer_type, **optimizer_options):
    """deepcopy of a model (taken before amp.initialize) and a fresh optimizer for an fp32 run."""
    reference = copy.deepcopy(model)
    return reference, optimizer_type(reference.parameters(), **optimizer_options)
