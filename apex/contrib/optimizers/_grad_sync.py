"""Gradient side of ZeRO-2: bucket the gradients as backward makes them, reduce-scatter each
full bucket while backward goes on, keep only this rank's shard.

Each parameter's gradient is moved into its bucket(s) as soon as autograd has accumulated
it, and ``param.grad`` is dropped, so full-size gradients live only in the few buckets
being filled or reduced. With ``contiguous=True`` the buckets are regions of one persistent
buffer, and ``param.grad`` may be a view into it (autograd then accumulates in place).

Bucket memory is never zeroed just to be added to. A bucket's fragment that holds no
gradient of the current round (a fresh bucket, or a region whose gradients were reduced
or dropped) is *stale*: the first gradient is copied into it, not added, and whatever is
still stale when the bucket is reduced is zeroed then (parameters without a gradient count
as zeros). So a backward pass moves each gradient once (read it, write the bucket), as
DDP does, instead of zeroing the buffer, then reading it and the gradient and writing it
again. With the contiguous buffer this needs ``param.grad`` to be None while its region is
stale (autograd would add to the stale values): after a reduction, and after
``zero(set_to_none=True)``, the parameters' ``.grad`` are None; autograd then hands its fresh
gradient to the hook, which copies it in and points ``param.grad`` at the region (later
passes before the reduction accumulate there in place). ``zero(set_to_none=False)`` instead
zeroes the buffer and makes ``param.grad`` the buffer's views; regions are then zeroed
again right after each reduction (``eager``), as they are for good once someone else may
write into the buffer (``grad_buffer_view``).

Buckets are reduce-scattered strictly in index order, on every rank, so ranks always issue
the same collectives in the same order even when their gradients arrive in different
orders. A backward pass (outside ``no_sync``) ends by reducing every bucket not reduced
yet, like DDP: the shards then hold the reduced gradients of that pass, added to those of
earlier passes until the optimizer consumes them.

Each bucket has its own gradient dtype (``grad_sync_dtype`` can differ per parameter); with
``contiguous=True`` buckets of one key share one buffer. ``memory`` (NCCL user buffers)
provides that buffer and the shards, registered with the communicator.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import torch

from apex.contrib.optimizers._collectives import GroupCollectives
from apex.contrib.optimizers._flat import flat_view, shaped_like
from apex.contrib.optimizers._layout import Bucket, Fragment


def _gaps(bucket: Bucket) -> list[tuple[int, int]]:
    """The element ranges of ``bucket`` no fragment covers (alignment padding)."""
    gaps, position = [], 0
    for fragment in bucket.fragments:
        start, end = fragment.bucket_range
        if start > position:
            gaps.append((position, start))
        position = max(position, end)
    if position < bucket.size:
        gaps.append((position, bucket.size))
    return gaps


class GradSync:
    """Gradient buckets of ``buckets`` for ``params`` (by index), reduced over ``shard_group``
    then all-reduced over ``replica_group`` (ranks holding the same shard), bucket ``b`` in
    ``dtypes[b]``.

    ``in_flight``: reduce-scatters allowed at once before the oldest is waited for (it
    bounds the full-size buckets alive; irrelevant with ``contiguous``).
    ``memory``: where the contiguous buffer and the shards live (NCCL user buffers), or None.
    ``before_reduce``: called with the full-size buckets about to be reduced by ``sync`` (to
    scale them first); then ``overlap`` must be off, so that ``sync`` reduces them all.
    """

    def __init__(self, buckets: Sequence[Bucket], params: Sequence[torch.Tensor], dtypes: Sequence[torch.dtype],
                 device: torch.device, shard_group: GroupCollectives, replica_group: GroupCollectives | None,
                 in_flight: int, contiguous: bool, overlap: bool, memory=None) -> None:
        self.buckets = buckets
        self.params = params
        self.dtypes, self.device = list(dtypes), device
        self.before_reduce: Callable[[list[torch.Tensor]], None] | None = None
        self.shard_group, self.replica_group = shard_group, replica_group
        self.in_flight_limit = max(1, in_flight)
        self.overlap = overlap
        self.fragments: dict[int, list[Fragment]] = {}
        for bucket in buckets:
            for fragment in bucket.fragments:
                self.fragments.setdefault(fragment.param, []).append(fragment)
        zeros = torch.zeros if memory is None else (lambda size, dtype, device: memory.zeros(size, dtype))
        shard_sizes = [b.shard_size for b in buckets]
        self.shards = [t for t, _ in self._slices(shard_sizes, zeros)]
        # NCCL user buffers: the outputs of reductions that add to a filled shard are registered too.
        self._scratch = None if memory is None else [t for t, _ in self._slices(shard_sizes, zeros)]
        self.filled = [False] * len(buckets)  # shard holds reduced grads (else it counts as zeros)
        self.synced = [False] * len(buckets)  # reduced since the last reset, nothing newer pending
        self.dirty = [False] * len(buckets)  # local grads wait in the bucket for a reduction
        self.reported: list[set[int]] = [set() for _ in buckets]
        self.cursor = 0  # next bucket to reduce in the current round
        self.reductions = 0  # finished reductions: a cached grad norm is stale once this moves
        self._buffers: dict[int, torch.Tensor] = {}  # full-size buckets being filled (not contiguous)
        self._pending: list[tuple[int, object, torch.Tensor, torch.Tensor]] = []  # (bucket, work, input, output)
        self._callback_queued = False
        self.accumulate_only = False  # no_sync: keep grads where autograd put them
        self.copy_in_no_sync = False
        self.regions: list[torch.Tensor] | None = None  # the contiguous buffers' bucket regions
        # Per bucket: the parameters whose fragment in it holds no gradient of this round (module docstring).
        self.stale: list[set[int]] = [set() for _ in buckets]
        # Zero reduced or dropped regions at once, and keep param.grad the buffer's views (module docstring).
        self.eager = False
        self.external_writes = False  # someone holds buffer views (grad_buffer_view): always eager
        # Alignment padding of each bucket: zeroed once, never written.
        self._gaps = [_gaps(bucket) for bucket in buckets]
        self._view_ptrs: dict[int, int | None] = {}
        self._region_starts: list[tuple[torch.Tensor, int]] = []  # (the key's buffer, the region's start)
        if contiguous:
            self._region_starts = [base for _, base in self._slices([b.size for b in buckets], zeros)]
            self.regions = [buffer[start:start + b.size] for (buffer, start), b in zip(self._region_starts, buckets)]
            for param in self.fragments:
                if params[param].grad is None:  # a gradient already there (its hook built us) moves in later
                    self.point_grad_at_buffer(param)
        if memory is not None:
            memory.register()

    def _slices(self, sizes: Sequence[int],
                zeros: Callable[..., torch.Tensor]) -> list[tuple[torch.Tensor, tuple[torch.Tensor, int]]]:
        """Per bucket: a zeroed tensor of ``sizes[b]`` elements, and (buffer, start) it is the slice
        of. The buckets of one key (one dtype) are consecutive slices of one buffer."""
        by_key: dict[Hashable, list[int]] = {}
        for bucket in self.buckets:
            by_key.setdefault(bucket.key, []).append(bucket.index)
        slices: list = [None] * len(self.buckets)
        for indices in by_key.values():
            buffer = zeros(sum(sizes[b] for b in indices), dtype=self.dtypes[indices[0]], device=self.device)
            start = 0
            for b in indices:
                slices[b] = (buffer[start:start + sizes[b]], (buffer, start))
                start += sizes[b]
        return slices

    # -- contiguous buffer --------------------------------------------------------------

    def region(self, bucket: int) -> torch.Tensor:
        return self.regions[bucket]

    def grad_view(self, param: int) -> torch.Tensor | None:
        """``params[param]``'s gradient as a view of the contiguous buffer (None when its dtype
        differs from its buckets'). A parameter's fragments are consecutive buffer elements:
        a parameter continues in its key's next bucket, the next region of the key's buffer."""
        tensor = self.params[param]
        first = self.fragments[param][0]
        if self.regions is None or tensor.dtype != self.dtypes[first.bucket]:
            return None
        buffer, start = self._region_starts[first.bucket]
        start += first.bucket_range[0]
        return shaped_like(buffer[start:start + tensor.numel()], tensor)

    def point_grad_at_buffer(self, param: int) -> None:
        view = self.grad_view(param)
        if view is not None:
            self.params[param].grad = view

    def _holds_view(self, param: int) -> bool:
        """Whether ``param.grad`` is its view of the contiguous buffer (autograd accumulated in place)."""
        grad = self.params[param].grad
        if grad is None or self.regions is None:
            return False
        if param not in self._view_ptrs:  # the buffer never moves: its address per parameter is fixed
            view = self.grad_view(param)
            self._view_ptrs[param] = None if view is None else view.data_ptr()
        return grad.data_ptr() == self._view_ptrs[param]

    # -- filling buckets ------------------------------------------------------------------

    def copy_in(self, param: int) -> None:
        """Move ``params[param].grad`` into its bucket(s) (nothing to move when it is already a buffer view)."""
        tensor = self.params[param]
        grad = tensor.grad
        if grad is None or param not in self.fragments:
            return
        if grad.layout != torch.strided:
            raise RuntimeError(f"distributed optimizers do not support sparse gradients (got layout {grad.layout})")
        if grad.shape != tensor.shape:
            raise RuntimeError(f"a gradient of shape {tuple(grad.shape)} was set for a parameter of shape "
                               f"{tuple(tensor.shape)}")
        if self._holds_view(param):
            return
        flat = flat_view(grad.detach(), like=tensor)
        for fragment in self.fragments[param]:
            target = self._bucket_input(fragment.bucket)[slice(*fragment.bucket_range)]
            source = flat[slice(*fragment.param_range)]
            stale = self.stale[fragment.bucket]
            if param in stale:  # nothing to add to: overwrite
                target.copy_(source)
                stale.discard(param)
            else:
                target.add_(source)
            self.dirty[fragment.bucket] = True
        tensor.grad = None
        self.point_grad_at_buffer(param)

    def _bucket_input(self, bucket: int) -> torch.Tensor:
        """The full-size bucket gradients are added into (its stale fragments not zeroed yet)."""
        if self.regions is not None:
            return self.region(bucket)
        buffer = self._buffers.get(bucket)
        if buffer is None:  # fresh memory: every fragment stale, the padding zeroed
            buffer = self._buffers[bucket] = torch.empty(self.buckets[bucket].size, dtype=self.dtypes[bucket],
                                                         device=self.device)
            self.stale[bucket] = set(self.buckets[bucket].params)
            if self._gaps[bucket]:
                torch._foreach_zero_([buffer[start:end] for start, end in self._gaps[bucket]])
        return buffer

    def _ready_input(self, bucket: int) -> torch.Tensor:
        """The bucket as it is to be reduced: its stale fragments zeroed."""
        buffer = self._bucket_input(bucket)
        stale = self.stale[bucket]
        if stale:
            if len(stale) == len(self.buckets[bucket].params):
                buffer.zero_()
            else:
                torch._foreach_zero_([buffer[slice(*f.bucket_range)] for f in self.buckets[bucket].fragments
                                      if f.param in stale])
            stale.clear()
        return buffer

    def _make_stale(self, bucket: int) -> None:
        """The region of ``bucket`` holds no gradient any more (contiguous buffer): mark it stale,
        and drop the ``param.grad`` views into it, into which autograd would accumulate."""
        self.stale[bucket] = set(self.buckets[bucket].params)
        with torch._C.DisableTorchFunctionSubclass():  # a parameter whose all-gather runs need not wait
            for param in self.buckets[bucket].params:
                if self._holds_view(param):
                    self.params[param].grad = None

    def external_writer(self) -> None:
        """Someone may write into the contiguous buffer (``grad_buffer_view``): keep it zeroed
        wherever it holds no gradient, from now on."""
        self.external_writes = self.eager = True
        if self.regions is not None:
            for bucket in range(len(self.buckets)):
                self._ready_input(bucket)

    def on_grad(self, param: int, in_backward: bool) -> None:
        """A parameter's gradient is complete for this backward pass (its post-accumulate hook)."""
        if param not in self.fragments:
            return
        for fragment in self.fragments[param]:  # also when autograd accumulated into a buffer view
            self.dirty[fragment.bucket] = True
        if self.accumulate_only:
            if self.copy_in_no_sync:
                self.copy_in(param)
            return
        self.copy_in(param)
        if not self.overlap:
            return
        for fragment in self.fragments[param]:
            self.reported[fragment.bucket].add(param)
        while self.cursor < len(self.buckets) and len(self.reported[self.cursor]) == len(self.buckets[self.cursor].params):
            self._launch(self.cursor)
            self.cursor += 1
        if self.cursor == len(self.buckets):
            self.cursor = 0
        if in_backward and not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)

    def _end_of_backward(self) -> None:
        self._callback_queued = False
        self._launch_rest_of_round()
        self.finish_all()

    def _launch_rest_of_round(self) -> None:
        """Reduce the buckets of the current round not reduced yet (their missing gradients count as zeros)."""
        if any(self.reported) or self.cursor:
            for bucket in range(self.cursor, len(self.buckets)):
                self._launch(bucket)
            self.cursor = 0

    # -- reductions -----------------------------------------------------------------------

    def _launch(self, bucket: int) -> None:
        if len(self._pending) >= self.in_flight_limit and self.regions is None:
            self._finish(self._pending.pop(0))
        source = self._ready_input(bucket)
        self._buffers.pop(bucket, None)
        shard = self.shards[bucket]
        writes_shard = not self.filled[bucket] and all(p[3] is not shard for p in self._pending)
        if writes_shard:
            out = shard
        elif self._scratch is not None and all(p[3] is not self._scratch[bucket] for p in self._pending):
            out = self._scratch[bucket]
        else:
            out = torch.empty_like(shard)
        work = self.shard_group.reduce_scatter(out, source)
        self._pending.append((bucket, work, source, out))
        self.reported[bucket].clear()
        self.dirty[bucket] = False

    def _finish(self, pending: tuple[int, object, torch.Tensor, torch.Tensor]) -> None:
        bucket, work, source, out = pending
        self.shard_group.finish(work, out)
        if self.replica_group is not None:
            self.replica_group.finish(self.replica_group.all_reduce(out), out)
        shard = self.shards[bucket]
        if out is not shard:
            shard.add_(out) if self.filled[bucket] else shard.copy_(out)
        self.filled[bucket] = True
        self.synced[bucket] = not self.dirty[bucket]
        if self.regions is not None:  # the next pass accumulates into this region again
            if self.eager:
                source.zero_()
            else:
                self._make_stale(bucket)
        self.reductions += 1

    def finish_all(self) -> None:
        while self._pending:
            self._finish(self._pending.pop(0))

    def has_unreduced(self) -> bool:
        """Whether gradients wait to be reduced (in buckets, or in ``param.grad`` outside the buffer)."""
        return any(self.dirty) or any(self.params[p].grad is not None and not self._holds_view(p)
                                      for p in self.fragments)

    def sync(self) -> None:
        """Make every shard hold the reduced gradients: move leftover ``param.grad`` into the
        buckets and reduce each bucket that has unreduced gradients or no reduction since the
        last reset (on every rank the same buckets, when ranks ran the same passes)."""
        for param in self.fragments:
            self.copy_in(param)
        self._launch_rest_of_round()
        self.finish_all()
        due = [bucket for bucket in range(len(self.buckets)) if self.dirty[bucket] or not self.synced[bucket]]
        if self.before_reduce is not None and due:
            self.before_reduce([self._ready_input(bucket) for bucket in due])
        for bucket in due:
            self._launch(bucket)
        self.finish_all()

    # -- resets ---------------------------------------------------------------------------

    def consumed(self) -> None:
        """The optimizer used the shards: the next gradients start from zero."""
        self.filled = [False] * len(self.buckets)
        self.synced = [False] * len(self.buckets)

    def zero(self, set_to_none: bool = False) -> None:
        """Drop every gradient: pending reductions, filled buckets, shards. With the contiguous
        buffer, ``param.grad`` become zeroed views of it, or None with ``set_to_none`` (the buffer
        is then left stale, not zeroed, unless someone else writes into it)."""
        self.finish_all()
        self._buffers.clear()
        if self.regions is not None:
            self.eager = self.external_writes or not set_to_none
            for bucket, dirty in enumerate(self.dirty):
                if dirty or not self.eager:  # zeros or dropped gradients: nothing worth keeping
                    self.stale[bucket] = set(self.buckets[bucket].params)
                if self.eager:
                    self._ready_input(bucket)
        # Parameters whose all-gather still runs (overlap_param_sync) need not wait for it here.
        with torch._C.DisableTorchFunctionSubclass():
            for param in self.fragments:
                if self.regions is None or not self.eager:
                    self.params[param].grad = None
                elif not self._holds_view(param):
                    self.params[param].grad = None
                    self.point_grad_at_buffer(param)
        self.dirty = [False] * len(self.buckets)
        self.reported = [set() for _ in self.buckets]
        self.cursor = 0
        self.consumed()
