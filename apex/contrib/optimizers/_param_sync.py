"""Parameter side of ZeRO: all-gather every bucket's updated shards back into the model.

After a step each rank holds the new values of its shard only. ``launch`` starts the
all-gather of one bucket; ``finish`` waits for it and copies the bucket into the model
parameters (``_casts``: converted, or raw bytes for an integer ``param_sync_dtype``). With
``contiguous=True`` the parameters are views of buffers laid out like the buckets (one per
bucket key), the all-gather writes straight into them and nothing is copied; an integer
buffer of the parameters' element size holds their bits (the parameters view it as theirs).

With ``overlap=True`` the all-gathers of a step are left running and a parameter waits for
its own buckets the first time it is touched: until then its class is a subclass of its own
whose ``__torch_function__`` finishes them (any op, attribute or method of the tensor: a
module's forward, ``param.data``, ``assert_close(param, ...)``) and restores the class, so
a parameter costs nothing extra once gathered. NVIDIA apex does the same through a patched
``__getattribute__`` on the parameter class, permanently. A module compiled with torch.compile
would see the temporary class (and recompile): call ``param_sync()`` before its forward.
"""
from __future__ import annotations

import weakref
from collections.abc import Hashable, Iterable, Sequence

import torch

from apex.contrib.optimizers._casts import as_param_view, foreach_cast_into, reinterprets
from apex.contrib.optimizers._collectives import GroupCollectives
from apex.contrib.optimizers._flat import flat_view, shaped_like
from apex.contrib.optimizers._layout import Bucket

_PENDING_SYNC = "_apex_pending_param_sync"  # attribute of a pending parameter: weakref to its ParamSync
_pending_classes: dict[type, type] = {}


def _finish_pending(values: Iterable[object]) -> None:
    for value in values:
        if isinstance(value, torch.Tensor):
            sync_ref = value.__dict__.get(_PENDING_SYNC)
            sync = sync_ref() if sync_ref is not None else None
            if sync is not None:
                sync.finish_for([value])
            elif type(value) in _pending_classes.values():  # its optimizer is gone: nothing to wait for
                _restore(value)
        elif isinstance(value, (list, tuple)):
            _finish_pending(value)
        elif isinstance(value, dict):
            _finish_pending(value.values())


def _pending_class(cls: type) -> type:
    """``cls`` with a ``__torch_function__`` that first finishes the gathers of pending arguments."""
    pending = _pending_classes.get(cls)
    if pending is None:
        def __torch_function__(klass, func, types, args=(), kwargs=None):  # noqa: N807
            kwargs = kwargs or {}
            _finish_pending(args)
            _finish_pending(kwargs.values())
            return func(*args, **kwargs)  # the classes are restored: dispatch as usual

        pending = type(f"_Pending{cls.__name__}", (cls,), {
            "__torch_function__": classmethod(__torch_function__),
            "__module__": __name__,
            "__doc__": f"A {cls.__name__} whose all-gather is still running (apex ZeRO optimizers).",
        })
        _pending_classes[cls] = pending
    return pending


def _restore(param: torch.Tensor) -> None:
    param.__dict__.pop(_PENDING_SYNC, None)
    cls = type(param)
    if cls in _pending_classes.values():
        param.__class__ = cls.__mro__[1]


class ParamSync:
    """All-gathers of ``buckets`` over ``group`` into ``params`` (by index), bucket ``b`` in ``dtypes[b]``."""

    def __init__(self, buckets: Sequence[Bucket], params: Sequence[torch.Tensor], dtypes: Sequence[torch.dtype],
                 device: torch.device, group: GroupCollectives, overlap: bool) -> None:
        self.buckets = buckets
        self.params = params
        self.dtypes, self.device = list(dtypes), device
        self.group = group
        self.overlap = overlap
        self.regions: list[torch.Tensor] | None = None  # of the contiguous buffers, per bucket
        self._pending: dict[int, tuple[object, torch.Tensor]] = {}  # bucket -> (work, gathered bucket)
        self._buckets_of: dict[int, list[int]] = {}  # param index -> buckets holding it
        for bucket in buckets:
            for param in bucket.params:
                self._buckets_of.setdefault(param, []).append(bucket.index)
        self._index_of = {id(p): i for i, p in enumerate(params)}
        self._marked: set[int] = set()  # parameters whose class says "pending"

    # -- contiguous buffer --------------------------------------------------------------

    @torch.no_grad()
    def make_contiguous(self) -> None:
        """Move the parameters into buffers laid out like the buckets (one per bucket key); they
        become views of them."""
        if self.regions is not None:
            return
        self.finish_all()
        for bucket in self.buckets:
            for param in bucket.params:
                dtype, wanted = self.params[param].dtype, self.dtypes[bucket.index]
                if not reinterprets(wanted, dtype):
                    raise ValueError(f"contiguous_param_buffer: a {dtype} parameter cannot be a view of its "
                                     f"{wanted} parameter buffer (param_sync_dtype must be the parameters' dtype, "
                                     "or an integer type of its size)")
        by_key: dict[Hashable, list[Bucket]] = {}
        for bucket in self.buckets:
            by_key.setdefault(bucket.key, []).append(bucket)
        regions: list[torch.Tensor | None] = [None] * len(self.buckets)
        starts: dict[int, tuple[torch.Tensor, int]] = {}
        for key_buckets in by_key.values():
            buffer = torch.zeros(sum(b.size for b in key_buckets), dtype=self.dtypes[key_buckets[0].index],
                                 device=self.device)
            start = 0
            for bucket in key_buckets:
                regions[bucket.index] = buffer[start:start + bucket.size]
                starts[bucket.index] = (buffer, start)
                start += bucket.size
        placed = set()
        for bucket in self.buckets:  # a parameter continues in its key's next bucket: the buffer's next region
            buffer, start = starts[bucket.index]
            for fragment in bucket.fragments:
                if fragment.param in placed:
                    continue
                placed.add(fragment.param)
                param = self.params[fragment.param]
                begin = start + fragment.bucket_range[0]
                view = shaped_like(as_param_view(buffer[begin:begin + param.numel()], param.dtype), param)
                view.copy_(param)
                param.data = view
        self.regions = regions

    def region(self, bucket: int) -> torch.Tensor:
        return self.regions[bucket]

    def shard_of(self, bucket: int) -> torch.Tensor | None:
        """This rank's shard of the contiguous buffer's bucket (None without a buffer)."""
        if self.regions is None:
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
        foreach_cast_into(targets, sources)

    def launch(self, bucket: int, shard: torch.Tensor) -> None:
        """Start gathering every rank's ``shard`` of ``bucket``."""
        out = self.region(bucket) if self.regions is not None else torch.empty(
            self.buckets[bucket].size, dtype=self.dtypes[bucket], device=self.device)
        self._pending[bucket] = (self.group.all_gather(out, shard), out)

    def mark_pending(self) -> None:
        """Make each parameter of a running all-gather finish it when first touched (``overlap``)."""
        for bucket in self._pending:
            for param in self.buckets[bucket].params:
                if param in self._marked:
                    continue
                tensor = self.params[param]
                try:
                    tensor.__class__ = _pending_class(type(tensor))
                except TypeError:  # a tensor class that cannot be swapped: wait for it now
                    self.finish_for([tensor])
                    continue
                tensor.__dict__[_PENDING_SYNC] = weakref.ref(self)
                self._marked.add(param)

    @torch.no_grad()
    def finish(self, bucket: int) -> None:
        pending = self._pending.pop(bucket, None)
        if pending is None:
            return
        work, gathered = pending
        with torch._C.DisableTorchFunctionSubclass():  # touching pending parameters here must not recurse
            self.group.finish(work)
            if self.regions is None:
                fragments = self.buckets[bucket].fragments
                targets = [flat_view(self.params[f.param])[slice(*f.param_range)] for f in fragments]
                foreach_cast_into(targets, [gathered[slice(*f.bucket_range)] for f in fragments])
        for param in self.buckets[bucket].params:
            if param in self._marked and not any(b in self._pending for b in self._buckets_of[param]):
                self._marked.discard(param)
                _restore(self.params[param])

    def finish_all(self) -> None:
        for bucket in list(self._pending):
            self.finish(bucket)

    def finish_for(self, params: Iterable[torch.Tensor | None]) -> None:
        """Finish the all-gathers of the buckets holding ``params``."""
        for param in params:
            index = self._index_of.get(id(param))
            for bucket in self._buckets_of.get(index, ()):
                if bucket in self._pending:
                    self.finish(bucket)

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def __del__(self) -> None:
        # The optimizer is gone: its parameters must not be left with gathers still writing
        # into them, nor with the temporary class.
        try:
            self.finish_all()
        except Exception:  # noqa: BLE001 (interpreter shutdown, a destroyed process group)
            pass
