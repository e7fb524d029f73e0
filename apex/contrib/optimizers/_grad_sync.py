"""Gradient side of ZeRO-2: bucket the gradients as backward makes them, reduce-scatter each
full bucket while backward goes on, keep only this rank's shard.

Each parameter's gradient is added into its bucket(s) as soon as autograd has accumulated
it, and ``param.grad`` is dropped, so full-size gradients live only in the few buckets
being filled or reduced. With ``contiguous=True`` the buckets are views of one persistent
buffer and ``param.grad`` is a view into it: autograd accumulates in place and nothing is
copied.

Buckets are reduce-scattered strictly in index order, on every rank, so ranks always issue
the same collectives in the same order even when their gradients arrive in different
orders. A backward pass (outside ``no_sync``) ends by reducing every bucket not reduced
yet, like DDP: the shards then hold the reduced gradients of that pass, added to those of
earlier passes until the optimizer consumes them.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from apex.contrib.optimizers._collectives import GroupCollectives
from apex.contrib.optimizers._flat import flat_view, shaped_like
from apex.contrib.optimizers._layout import Bucket, Fragment


class GradSync:
    """Gradient buckets of ``buckets`` for ``params`` (by index), reduced over ``shard_group``
    then all-reduced over ``replica_group`` (ranks holding the same shard), in ``dtype``.

    ``in_flight``: reduce-scatters allowed at once before the oldest is waited for (it
    bounds the full-size buckets alive; irrelevant with ``contiguous``).
    """

    def __init__(self, buckets: Sequence[Bucket], params: Sequence[torch.Tensor], dtype: torch.dtype,
                 device: torch.device, shard_group: GroupCollectives, replica_group: GroupCollectives | None,
                 in_flight: int, contiguous: bool, overlap: bool) -> None:
        self.buckets = buckets
        self.params = params
        self.dtype, self.device = dtype, device
        self.shard_group, self.replica_group = shard_group, replica_group
        self.in_flight_limit = max(1, in_flight)
        self.overlap = overlap
        self.fragments: dict[int, list[Fragment]] = {}
        for bucket in buckets:
            for fragment in bucket.fragments:
                self.fragments.setdefault(fragment.param, []).append(fragment)
        self.shards = [torch.zeros(b.shard_size, dtype=dtype, device=device) for b in buckets]
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
        self.buffer: torch.Tensor | None = None
        self._view_ptrs: dict[int, int | None] = {}
        if contiguous:
            self.buffer = torch.zeros(sum(b.size for b in buckets), dtype=dtype, device=device)
            self._offsets = [0]
            for bucket in buckets:
                self._offsets.append(self._offsets[-1] + bucket.size)
            for param in self.fragments:
                if params[param].grad is None:  # a gradient already there (its hook built us) moves in later
                    self.point_grad_at_buffer(param)

    # -- contiguous buffer --------------------------------------------------------------

    def region(self, bucket: int) -> torch.Tensor:
        return self.buffer[self._offsets[bucket]:self._offsets[bucket + 1]]

    def grad_view(self, param: int) -> torch.Tensor | None:
        """``params[param]``'s gradient as a view of the contiguous buffer (None when its dtype
        differs from the buffer's). A parameter's fragments are consecutive buffer elements."""
        tensor = self.params[param]
        if self.buffer is None or tensor.dtype != self.dtype:
            return None
        first = self.fragments[param][0]
        start = self._offsets[first.bucket] + first.bucket_range[0]
        return shaped_like(self.buffer[start:start + tensor.numel()], tensor)

    def point_grad_at_buffer(self, param: int) -> None:
        view = self.grad_view(param)
        if view is not None:
            self.params[param].grad = view

    def _holds_view(self, param: int) -> bool:
        """Whether ``param.grad`` is its view of the contiguous buffer (autograd accumulated in place)."""
        grad = self.params[param].grad
        if grad is None or self.buffer is None:
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
            self._bucket_input(fragment.bucket)[slice(*fragment.bucket_range)].add_(flat[slice(*fragment.param_range)])
            self.dirty[fragment.bucket] = True
        tensor.grad = None
        self.point_grad_at_buffer(param)

    def _bucket_input(self, bucket: int) -> torch.Tensor:
        if self.buffer is not None:
            return self.region(bucket)
        buffer = self._buffers.get(bucket)
        if buffer is None:
            buffer = self._buffers[bucket] = torch.zeros(self.buckets[bucket].size, dtype=self.dtype, device=self.device)
        return buffer

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
        if len(self._pending) >= self.in_flight_limit and self.buffer is None:
            self._finish(self._pending.pop(0))
        source = self._bucket_input(bucket)
        self._buffers.pop(bucket, None)
        shard = self.shards[bucket]
        writes_shard = not self.filled[bucket] and all(p[3] is not shard for p in self._pending)
        out = shard if writes_shard else torch.empty_like(shard)
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
        if self.buffer is not None:
            source.zero_()  # the next pass accumulates into this region again
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
        for bucket in range(len(self.buckets)):
            if self.dirty[bucket] or not self.synced[bucket]:
                self._launch(bucket)
        self.finish_all()

    # -- resets ---------------------------------------------------------------------------

    def consumed(self) -> None:
        """The optimizer used the shards: the next gradients start from zero."""
        self.filled = [False] * len(self.buckets)
        self.synced = [False] * len(self.buckets)

    def zero(self) -> None:
        """Drop every gradient: pending reductions, filled buckets, shards."""
        self.finish_all()
        self._buffers.clear()
        if self.buffer is not None:
            for bucket, dirty in enumerate(self.dirty):
                if dirty:
                    self.region(bucket).zero_()
        for param in self.fragments:
            if self.buffer is None or not self._holds_view(param):
                self.params[param].grad = None
                self.point_grad_at_buffer(param)
        self.dirty = [False] * len(self.buckets)
        self.reported = [set() for _ in self.buckets]
        self.cursor = 0
        self.consumed()
