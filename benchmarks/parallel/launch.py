"""Start one NCCL process per GPU on this machine for a benchmark (no torchrun needed)."""
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


def _rank_main(rank: int, world_size: int, port: int, fn, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size, device_id=torch.device("cuda", rank))
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def run_on_gpus(fn, gpus: int, *args) -> None:
    """``fn(rank, world_size, *args)`` in ``gpus`` processes joined in one NCCL group."""
    mp.spawn(_rank_main, args=(gpus, free_port(), fn, args), nprocs=gpus)
