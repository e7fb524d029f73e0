"""Start one process per rank on this machine for a benchmark (no torchrun needed):
NCCL with one GPU each, or gloo on the CPU."""
from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, device: str, fn, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device == "cuda":
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", rank=rank, world_size=world_size, device_id=torch.device("cuda", rank))
    else:
        torch.set_num_threads(1)  # the ranks share the machine's cores
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def run_on_ranks(fn, world_size: int, device: str, *args) -> None:
    """``fn(rank, world_size, *args)`` in ``world_size`` processes joined in one group
    (NCCL, one GPU each, for device "cuda"; gloo for "cpu")."""
    mp.spawn(_rank_main, args=(world_size, free_port(), device, fn, args), nprocs=world_size)


def run_on_gpus(fn, gpus: int, *args) -> None:
    """``fn(rank, world_size, *args)`` in ``gpus`` processes joined in one NCCL group."""
    run_on_ranks(fn, gpus, "cuda", *args)
