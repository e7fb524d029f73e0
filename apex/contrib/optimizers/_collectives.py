"""The three collectives a ZeRO optimizer runs on one process group, whatever its backend.

NCCL averages inside the reduction (ReduceOp.AVG); other backends sum and the result is
divided afterwards (``finish``), so callers see one behaviour. With ``prescale`` the input is
divided by the group size first and summed (NCCL user buffers reduce with SUM only, as in
NVIDIA apex's ``nccl_ub``). A group of one rank runs no collective at all.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

# torch 2.14 renamed the flat-tensor collectives (and deprecated the old names); 2.11 has only the old ones.
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class GroupCollectives:
    """Reduce-scatter, all-gather and all-reduce over ``group`` (None: the default group).

    ``average``: reductions produce the mean over the group's ranks instead of the sum;
    ``prescale``: by dividing their input first (which they overwrite) and summing.
    Asynchronous calls return a handle (or None when nothing runs); ``finish(handle, out)``
    waits for it and completes ``out`` (the division of a non-NCCL average).
    """

    def __init__(self, group: dist.ProcessGroup | None, average: bool, prescale: bool = False) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        native_average = dist.get_backend(group) == dist.Backend.NCCL and not prescale
        self.op = dist.ReduceOp.AVG if average and native_average else dist.ReduceOp.SUM
        self.divide_before = average and prescale and self.size > 1
        self.divide_after = average and not native_average and not prescale and self.size > 1

    def reduce_scatter(self, out: torch.Tensor, tensor: torch.Tensor) -> dist.Work | None:
        """Start ``out = reduce(tensor)[rank's 1/size slice]``."""
        if self.size == 1:
            out.copy_(tensor)
            return None
        if self.divide_before:
            tensor.div_(self.size)
        return _reduce_scatter(out, tensor, op=self.op, group=self.group, async_op=True)

    def all_reduce(self, tensor: torch.Tensor) -> dist.Work | None:
        if self.size == 1:
            return None
        if self.divide_before:
            tensor.div_(self.size)
        return dist.all_reduce(tensor, op=self.op, group=self.group, async_op=True)

    def all_gather(self, out: torch.Tensor, shard: torch.Tensor) -> dist.Work | None:
        """Start ``out = concatenation of every rank's shard`` (``shard`` may be out's own slice)."""
        if self.size == 1:
            if out.data_ptr() != shard.data_ptr():
                out.copy_(shard)
            return None
        return _all_gather(out, shard, group=self.group, async_op=True)

    def finish(self, handle: dist.Work | None, out: torch.Tensor | None = None) -> None:
        """Wait for ``handle`` (on CUDA: order the current stream after it) and complete a reduction's ``out``."""
        if handle is not None:
            handle.wait()
        if out is not None and self.divide_after:
            out.div_(self.size)

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """All-reduce ``tensor`` in place by summing (never averaging), now; returns it."""
        if self.size > 1:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        return tensor
