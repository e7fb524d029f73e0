"""Parameter side of ZeRO: all-gather every bucket's updated shards back into the model.

After a step each rank holds the new values of its shard only. ``launch`` starts the
all-gather of one bucket; ``finish`` waits for it and copies the bucket into the model
parameters. With ``contiguous=True`` the parameters are views of one persistent buffer laid
out like the buckets, the all-gather writes straight into them and nothing is copied.

With ``overlap=True`` the all-gathers of a step are left running and each module waits
only for the buckets of its own parameters, just before its forward runs (a global
forward pre-hook), so the next forward overlaps them.
"""
from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence

import torch
from torch.utils.hooks import RemovableHandle

from apex.contrib.optimizers._collectives import GroupCollectives
from apex.contrib.optimizers._flat import flat_view, shaped_like
from apex.contrib.optimizers._layout import Bucket

# ParamSyncs with all-gathers still running, for the one global forward pre-hook.
_waiting: weakref.WeakSet[ParamSync] = weakref.WeakSet()
_pre_forward_handle: RemovableHandle | None = None


def _wait_before_forward(module: torch.nn.Module, args: object) -> None:
    if _waiting:
        for sync in list(_waiting):
            sync.finish_for(module._parameters.values())


class ParamSync:
    """All-gathers of ``buckets`` over ``group`` into ``params`` (by index), in ``dtype``."""

    def __init__(self, buckets: Sequence[Bucket], params: Sequence[torch.Tensor], dtype: torch.dtype,
                 device: torch.device, group: GroupCollectives, overlap: bool) -> None:
        self.buckets = buckets
        self.params = params
        self.dtype, self.device = dtype, device
        self.group = group
        self.overlap = overlap
        self.buffer: torch.Tensor | None = None
        self._offsets = [0]
        for bucket in buckets:
            self._offsets.append(self._offsets[-1] + bucket.size)
        self._pending: dict[int, tuple[object, torch.Tensor]] = {}  # bucket -> (work, gathered bucket)
        self._buckets_of: dict[int, list[int]] = {}  # id(param) -> buckets holding it
        for bucket in buckets:
            for param in bucket.params:
                self._buckets_of.setdefault(id(params[param]), []).append(bucket.index)
        if overlap:
            global _pre_forward_handle
            if _pre_forward_handle is None:
                _pre_forward_handle = torch.nn.modules.module.register_module_forward_pre_hook(_wait_before_forward)

    # -- contiguous buffer --------------------------------------------------------------

    @torch.no_grad()
    def make_contiguous(self) -> None:
        """Move the parameters into one buffer laid out like the buckets; they become views of it."""
        if self.buffer is not None:
            return
        self.finish_all()
        self.buffer = torch.zeros(self._offsets[-1], dtype=self.dtype, device=self.device)
        placed = set()
        for bucket in self.buckets:
            region = self.region(bucket.index)
            for fragment in bucket.fragments:
                if fragment.param in placed:
                    continue
                placed.add(fragment.param)
                param = self.params[fragment.param]
                start = fragment.bucket_range[0]
                view = shaped_like(region[start:start + param.numel()], param)
                view.copy_(param)
                param.data = view

    def region(self, bucket: int) -> torch.Tensor:
        return self.buffer[self._offsets[bucket]:self._offsets[bucket + 1]]

    def shard_of(self, bucket: int) -> torch.Tensor | None:
        """This rank's shard of the contiguous buffer's bucket (None without a buffer)."""
        if self.buffer is None:
            return None
        size = self.buckets[bucket].shard_size
        return self.region(bucket)[self.group.rank * size:(self.group.rank + 1) * size]

    # -- model <-> shards -----------------------------------------------------------------

    @torch.no_grad()
    def read_local(self, bucket: int, out: torch.Tensor) -> None:
        """Copy this rank's fragments of the model parameters into the flat shard ``out``."""
        sources, targets = [], []
        for fragment in self.buckets[bucket].local:
            sources.append(flat_view(self.params[fragment.param])[slice(*fragment.param_range)])
            targets.append(out[slice(*fragment.shard_range)])
        if targets:
            torch._foreach_copy_(targets, sources)

    def launch(self, bucket: int, shard: torch.Tensor) -> None:
        """Start gathering every rank's ``shard`` of ``bucket``."""
        out = self.region(bucket) if self.buffer is not None else torch.empty(
            self.buckets[bucket].size, dtype=self.dtype, device=self.device)
        self._pending[bucket] = (self.group.all_gather(out, shard), out)
        if self.overlap:
            _waiting.add(self)

    @torch.no_grad()
    def finish(self, bucket: int) -> None:
        pending = self._pending.pop(bucket, None)
        if pending is None:
            return
        work, gathered = pending
        self.group.finish(work)
        if self.buffer is None:
            fragments = self.buckets[bucket].fragments
            targets = [flat_view(self.params[f.param])[slice(*f.param_range)] for f in fragments]
            torch._foreach_copy_(targets, [gathered[slice(*f.bucket_range)] for f in fragments])
        if not self._pending:
            _waiting.discard(self)

    def finish_all(self) -> None:
        for bucket in list(self._pending):
            self.finish(bucket)

    def finish_for(self, params: Iterable[torch.Tensor | None]) -> None:
        """Finish the all-gathers of the buckets holding ``params`` (a module's own parameters)."""
        for param in params:
            for bucket in self._buckets_of.get(id(param), ()):
                if bucket in self._pending:
                    self.finish(bucket)

    @property
    def pending(self) -> bool:
        return bool(self._pending)
