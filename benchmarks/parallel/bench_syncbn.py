"""SyncBatchNorm forward+backward: apex.parallel.SyncBatchNorm beside torch.nn.SyncBatchNorm.

    python benchmarks/parallel/bench_syncbn.py            # 1 GPU, then 2 GPUs if present
    python benchmarks/parallel/bench_syncbn.py --gpus 1

N=64, C=256, 56x56 in fp16/bf16/fp32, NCHW and channels_last memory format. The
2-GPU run spawns its own two NCCL processes (rank 0 prints). "% copy" counts the bytes
a fused implementation must move: forward reads x twice and writes y, backward reads
x and dy twice and writes dx (8 tensor passes). Gradients are reset to None before
each step, so no step pays for accumulating into x.grad (3 more passes).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from benchmarks.common import BandwidthTable, copy_bandwidth_gbs, require_gpu, time_ms  # noqa: E402
from benchmarks.parallel.launch import run_on_gpus  # noqa: E402

SHAPE = (64, 256, 56, 56)
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
PASSES = 8


LAYOUTS = {"NCHW": torch.contiguous_format, "NHWC": torch.channels_last}


def make_case(dtype: torch.dtype, memory_format: torch.memory_format):
    """(x, dy, {implementation name: module}) for one benchmark row pair."""
    from apex.parallel import SyncBatchNorm

    x = torch.randn(SHAPE, device="cuda", dtype=dtype).contiguous(memory_format=memory_format)
    x.requires_grad_(True)
    dy = torch.randn_like(x)
    # torch's SyncBatchNorm needs a process group; alone, BatchNorm2d is its counterpart.
    torch_name, torch_class = (("torch SyncBatchNorm", torch.nn.SyncBatchNorm) if dist.is_initialized()
                               else ("torch BatchNorm2d", torch.nn.BatchNorm2d))
    modules = {"apex SyncBatchNorm": SyncBatchNorm(SHAPE[1]), torch_name: torch_class(SHAPE[1])}
    return x, dy, {name: module.cuda().to(dtype) for name, module in modules.items()}


def training_step(module: torch.nn.Module, x: torch.Tensor, dy: torch.Tensor):
    """One forward+backward; fresh gradients, so nothing is accumulated."""

    def step():
        x.grad = None
        module.zero_grad(set_to_none=True)
        module(x).backward(dy)

    return step


def bench_table(title: str) -> BandwidthTable:
    table = BandwidthTable(title, copy_bandwidth_gbs())
    for dtype_name, dtype in DTYPES.items():
        for layout, memory_format in LAYOUTS.items():
            x, dy, modules = make_case(dtype, memory_format)
            for impl, module in modules.items():
                ms = time_ms(training_step(module, x, dy), warmup=5, iters=20)
                table.add(f"{dtype_name} {layout} {tuple(SHAPE)}", impl, ms, PASSES * x.numel() * x.element_size())
    return table


def distributed_main(rank: int, world_size: int) -> None:
    table = bench_table(f"SyncBatchNorm fwd+bwd, {world_size} GPUs (per-GPU batch {SHAPE[0]})")
    if rank == 0:
        table.print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=None, help="1 or 2 (default: 1, then 2 if available)")
    args = parser.parse_args()
    require_gpu(__file__, args.gpus or 1)
    counts = [args.gpus] if args.gpus else [1] + ([2] if torch.cuda.device_count() >= 2 else [])
    for gpus in counts:
        if gpus == 1:
            bench_table("SyncBatchNorm fwd+bwd, 1 GPU (no process group)").print()
        else:
            run_on_gpus(distributed_main, gpus)


if __name__ == "__main__":
    main()
