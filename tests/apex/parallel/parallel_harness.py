"""Run a function on N ranks of a real torch.distributed group, with a deadline.

Each rank is a spawned process joined to a process group on a free 127.0.0.1 port;
collectives time out after COLLECTIVE_TIMEOUT, and the whole run after `timeout`, so a
rank that raises never leaves the others (or pytest) hanging. Results come back
through torch.save files, one per rank.
"""
from __future__ import annotations

import datetime
import os
import socket
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=30)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, world_size, port, backend, fn, args, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # ranks share a few cores
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=COLLECTIVE_TIMEOUT)
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
        # No rank tears the group down while a peer may still be exchanging its last messages: gloo
        # can abort that peer (std::terminate, "terminate called without an active exception", seen
        # once in CI in test_reducer_averages_module_grads_and_tensor_lists).
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_ranks(fn, world_size: int, *args, backend: str = "gloo", timeout: float = 90.0) -> list:
    """``[fn(rank, world_size, *args) for each rank]``, computed by ``world_size`` processes.

    ``fn`` must be a module-level function (it is pickled by name). Raises the first
    rank's exception, or TimeoutError after ``timeout`` seconds.
    """
    # Compile (or find) the ops here first: a first-use build must not eat the ranks' deadline.
    from apex.op_builder import load_op

    load_op("apex_C")
    load_op("syncbn")
    with tempfile.TemporaryDirectory() as out_dir:
        context = mp.start_processes(_rank_main, args=(world_size, free_port(), backend, fn, args, out_dir),
                                     nprocs=world_size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        try:
            while not context.join(timeout=max(0.0, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"{fn.__name__} on {world_size} ranks did not finish in {timeout} s")
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(world_size)]
