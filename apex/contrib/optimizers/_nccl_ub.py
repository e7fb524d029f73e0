"""NCCL user buffers (``nccl_ub=True``): gradient buffers NCCL reads and writes without copies.

The contiguous gradient buffer and the reduce-scatter outputs are allocated from a
``torch.cuda.MemPool`` backed by NCCL's own allocator (``ncclMemAlloc``, exposed by torch's
NCCL backend as ``mem_allocator``) and then registered with the process group's
communicator (``register_mem_pool``), so NCCL can run zero-copy algorithms on them (NVLink
SHARP, IB SHARP with a single SM). This is what NVIDIA apex does through its compiled
``apex.contrib.nccl_allocator``; here torch provides the pieces (torch >= 2.7 with NCCL >= 2.19).

Where they are missing (a CPU or gloo process group, an older torch, an NCCL without
``ncclMemAlloc``), ``nccl_ub=True`` raises RuntimeError when the optimizer is built, as NVIDIA
apex does when its allocator is unavailable. Results are the same with or without user
buffers: only where the bytes live changes (and averaging divides before summing, as apex's).
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def unavailable_reason(group: dist.ProcessGroup | None, device: torch.device) -> str | None:
    """Why NCCL user buffers cannot be used for ``group`` on ``device`` (None: they can)."""
    if device.type != "cuda":
        return f"the parameters are on {device}, not on a CUDA device"
    if dist.get_backend(group) != dist.Backend.NCCL:
        return f"the process group's backend is {dist.get_backend(group)}, not NCCL"
    if not (hasattr(torch.cuda, "MemPool") and hasattr(torch.cuda, "use_mem_pool")):
        return f"torch {torch.__version__} has no torch.cuda.MemPool"
    backend = type(_nccl_backend(group, device))  # the class: reading mem_allocator allocates nothing yet
    if not all(hasattr(backend, name) for name in ("mem_allocator", "register_mem_pool")):
        return f"torch {torch.__version__}'s NCCL backend cannot allocate or register user buffers"
    return None


def _nccl_backend(group: dist.ProcessGroup | None, device: torch.device):
    group = group if group is not None else dist.distributed_c10d._get_default_group()
    return group._get_backend(device)


class RegisteredMemory:
    """Allocations in NCCL's memory, registered with ``group``'s communicator by ``register``."""

    def __init__(self, group: dist.ProcessGroup | None, device: torch.device) -> None:
        reason = unavailable_reason(group, device)
        if reason is not None:
            raise RuntimeError(f"nccl_ub=True needs NCCL user buffers, which are unavailable: {reason}")
        self.group, self.device = group, device
        self.backend = _nccl_backend(group, device)
        try:
            self.pool = torch.cuda.MemPool(self.backend.mem_allocator)
        except (RuntimeError, TypeError) as error:
            raise RuntimeError(f"nccl_ub=True: NCCL's allocator is unavailable ({error})") from error

    def zeros(self, size: int, dtype: torch.dtype) -> torch.Tensor:
        with torch.cuda.use_mem_pool(self.pool):
            return torch.zeros(size, dtype=dtype, device=self.device)

    def register(self) -> None:
        """Register everything allocated so far (call once, after the allocations, on every rank)."""
        # Registration needs the communicator to exist: a collective on the group creates it.
        dist.all_reduce(torch.zeros(1, device=self.device), group=self.group)
        self.backend.register_mem_pool(self.pool)
