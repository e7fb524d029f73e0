"""DDP training-step time on 2 GPUs: apex.parallel.DistributedDataParallel beside
torch.nn.parallel.DistributedDataParallel.

    python benchmarks/parallel/bench_ddp.py          # spawns one process per GPU (2)

Models: a small ResNet-style CNN (batch 64, 3x64x64, fp32 and bf16 autocast) and an
MLP (batch 256, 4 x 4096 hidden). One step = zero_grad, forward, backward (with the
gradient all-reduce), SGD step. Rank 0 prints the median step time.
"""
from __future__ import annotations

import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from benchmarks.common import require_gpu, time_ms  # noqa: E402
from benchmarks.parallel.launch import run_on_gpus  # noqa: E402


class Block(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels),
                                  nn.ReLU(), nn.Conv2d(channels, channels, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(channels))

    def forward(self, x):
        return torch.relu(x + self.body(x))


def small_resnet() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), Block(64), Block(64),
                         nn.Conv2d(64, 128, 3, stride=2, padding=1), Block(128), Block(128),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 1000))


def mlp() -> nn.Module:
    layers = [nn.Linear(1024, 4096), nn.ReLU()]
    for _ in range(3):
        layers += [nn.Linear(4096, 4096), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(4096, 1000))


MODELS = {"resnet-ish 64x3x64x64": (small_resnet, (64, 3, 64, 64)), "mlp 256x1024": (mlp, (256, 1024))}


def step_ms(wrapped: nn.Module, shape, autocast_dtype) -> float:
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=1e-3)
    x = torch.randn(shape, device="cuda")
    target = torch.randint(0, 1000, (shape[0],), device="cuda")

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=autocast_dtype, enabled=autocast_dtype is not None):
            loss = nn.functional.cross_entropy(wrapped(x), target)
        loss.backward()
        optimizer.step()

    return time_ms(step, warmup=5, iters=30)


def benchmark(rank: int, world_size: int) -> None:
    import apex.parallel

    rows = []
    for model_name, (build, shape) in MODELS.items():
        for precision, autocast_dtype in (("fp32", None), ("bf16 autocast", torch.bfloat16)):
            torch.manual_seed(0)
            apex_ms = step_ms(apex.parallel.DistributedDataParallel(build().cuda()), shape, autocast_dtype)
            torch.manual_seed(0)
            torch_ddp = torch.nn.parallel.DistributedDataParallel(build().cuda(), device_ids=[rank])
            torch_ms = step_ms(torch_ddp, shape, autocast_dtype)
            rows.append((f"{model_name} {precision}", apex_ms, torch_ms))
    if rank == 0:
        header = f"{'case':<36} {'apex DDP ms':>12} {'torch DDP ms':>13} {'apex/torch':>11}"
        print(f"## DDP step time, {world_size} GPUs\n{header}\n{'-' * len(header)}")
        for case, apex_ms, torch_ms in rows:
            print(f"{case:<36} {apex_ms:>12.3f} {torch_ms:>13.3f} {apex_ms / torch_ms:>10.2f}x", flush=True)


if __name__ == "__main__":
    require_gpu(__file__, 2)
    run_on_gpus(benchmark, 2)
