"""Where an amp optimizer's grads live, and how they are unscaled after each backward.

Four layouts, one interface (`before_backward`, `unscale`, `after_step`, `zero`):
params updated directly or through fp32 masters (O2/O5), with grads kept per param
(apex's default) or as views into one flat buffer per device/dtype (`combine_grad=True`,
so each unscale is a single kernel over the whole buffer). The flat layouts may also average
their buffers over data-parallel ranks (`combine_ddp=True`, grad_reducer.py) and check that the
params still fit their buffers (`check_combined_tensors=True`).
"""
from dataclasses import dataclass
import warnings
from typing import Callable, Optional

import torch

# Views start at multiples of 16 elements: a 16-byte boundary for every dtype, so per-param
# vectorized kernels (fused optimizers) keep their 16-byte loads on grads inside a flat buffer,
# and the same offsets for fp16/bf16 model grads and their fp32 masters, so those buffers line up.
_VIEW_ALIGNMENT_ELEMENTS = 16


@dataclass
class FlatOptions:
    """How the flat layouts are kept: `reducer(buffers, layouts, params)` builds a
    grad_reducer.FlatGradReducer (combine_ddp) or is None; `check_layout` re-validates the views
    before every use (check_combined_tensors)."""

    reducer: Optional[Callable] = None
    check_layout: bool = False


def _flat_views(params, group_like):
    """One zeroed buffer per (device, dtype) group of `group_like` (parallel to `params`), a view
    per param shaped like it, and per buffer its layout [(param index, offset)]. Parallel lists
    grouped alike give buffers whose elements line up."""
    groups = {}
    for i, p in enumerate(group_like):
        groups.setdefault((p.device, p.dtype), []).append(i)
    buffers, views, layouts = [], [None] * len(params), []
    for indices in groups.values():
        like = params[indices[0]]
        layout, size = [], 0
        for i in indices:
            layout.append((i, size))
            size += -(-params[i].numel() // _VIEW_ALIGNMENT_ELEMENTS) * _VIEW_ALIGNMENT_ELEMENTS
        buffer = torch.zeros(size, dtype=like.dtype, device=like.device)
        for i, offset in layout:
            views[i] = buffer[offset:offset + params[i].numel()].view_as(params[i])
        buffers.append(buffer)
        layouts.append(layout)
    return buffers, views, layouts


def _fits(params, views):
    """Whether every param still has its view's shape, dtype and device (a param replaced or
    cast after amp.initialize no longer fits the buffer built for it)."""
    return all(p.shape == v.shape and p.dtype == v.dtype and p.device == v.device for p, v in zip(params, views))


_LAYOUT_BROKEN = ("Combined grad has been destroyed and will be recombined: a param changed shape, dtype or "
                  "device after amp.initialize (check for code that replaces params or their .data).")


def _attach_views(params, views):
    """Make each param's .grad its view again (after model.zero_grad() set it to None, or a
    backward with create_graph=True replaced it), keeping the values it had."""
    with torch.no_grad():
        for p, view in zip(params, views):
            if p.grad is view:
                continue
            if p.grad is None or p.grad.shape != view.shape:  # none, or one of a replaced param
                view.zero_()
            else:
                view.copy_(p.grad)
            p.grad = view


def _zero_or_drop(params, set_to_none):
    for p in params:
        if p.grad is None:
            continue
        if set_to_none:
            p.grad = None
        else:
            with torch.no_grad():
                p.grad.zero_()


class ParamGrads:
    """Params the optimizer updates itself (O0/O1/O3/O4, and O2/O5's fp32 params).

    Before a backward, grads accumulated so far (already unscaled) are stashed and .grad is
    cleared, so autograd hands over the fresh scaled grads without a copy; afterwards new grads
    are unscaled in place, or unscaled and added to their stash in one axpby launch."""

    def __init__(self, params):
        self.params = list(params)
        self._stash = [None] * len(self.params)

    def before_backward(self):
        for i, p in enumerate(self.params):
            self._stash[i], p.grad = p.grad, None

    def unscale(self, scaler):
        new, accumulated, stashed = [], [], []
        for p, stash in zip(self.params, self._stash):
            if p.grad is None:
                p.grad = stash
            elif stash is None:
                new.append(p.grad)
            else:
                accumulated.append(p.grad)
                stashed.append(stash)
        self._stash = [None] * len(self.params)
        if not scaler.is_identity:
            scaler.unscale(new, new)
        scaler.unscale_with_stashed(accumulated, stashed, accumulated)

    def after_step(self):
        pass

    def zero(self, set_to_none=True):
        _zero_or_drop(self.params, set_to_none)


class _FlatLayout:
    """The flat buffers of one set of params (grads or master grads), rebuilt when the params no
    longer fit them (only looked for with check_layout), and their combine_ddp reducer."""

    def __init__(self, params, group_like, options, reduce):
        self.params, self._group_like, self._options, self._reduce = params, group_like, options, reduce
        self.reducer = None
        self._build()

    def _build(self):
        if self.reducer is not None:
            self.reducer.remove()
        self.buffers, self.views, layouts = _flat_views(self.params, self._group_like)
        _attach_views(self.params, self.views)
        self.reducer = (self._options.reducer(self.buffers, layouts, self.params)
                        if self._reduce and self._options.reducer else None)

    def attach(self):
        """Make every .grad its view again; with check_layout, first rebuild a broken layout.
        Returns True when the buffers were rebuilt."""
        if self._options.check_layout and not _fits(self.params, self.views):
            warnings.warn(_LAYOUT_BROKEN, stacklevel=2)
            self._build()
            return True
        _attach_views(self.params, self.views)
        return False


class FlatParamGrads:
    """`combine_grad=True` for params the optimizer updates itself: every .grad is a view into a
    flat buffer that autograd accumulates into in place."""

    def __init__(self, params, options=None):
        self.params = list(params)
        self._flat = _FlatLayout(self.params, self.params, options or FlatOptions(), reduce=True)
        self._holds_grads = any(p.grad is not None for p in self.params)
        self._stash = None

    @property
    def buffers(self):
        return self._flat.buffers

    @property
    def reducer(self):
        return self._flat.reducer

    def before_backward(self):
        if self._flat.attach():
            self._holds_grads = any(p.grad is not None for p in self.params)
        if self._holds_grads:  # keep the unscaled grads aside; the buffer takes the scaled ones
            self._stash = [buffer.clone() for buffer in self.buffers]
            for buffer in self.buffers:
                buffer.zero_()

    def unscale(self, scaler):
        if self._flat.attach():
            self._stash = None  # grads kept aside were laid out for the old buffers
        if self.reducer is not None:
            self.reducer.finish()
        if self._stash is not None:
            scaler.unscale_with_stashed(self.buffers, self._stash, self.buffers)
        elif not scaler.is_identity:
            scaler.unscale(self.buffers, self.buffers)
        self._stash = None
        self._holds_grads = True

    def after_step(self):
        pass

    def zero(self, set_to_none=True):
        """Zeroes the buffer; grads stay views (`set_to_none` cannot apply to a shared buffer)."""
        self._flat.attach()
        for buffer in self.buffers:
            buffer.zero_()
        self._holds_grads = False


class MasterGrads:
    """O2/O5: fp16/bf16 model params whose fp32 masters the optimizer updates. Each backward's
    model grads are unscaled straight into the masters' grads (added to them when they hold
    grads from an earlier backward), then the model grads are dropped."""

    def __init__(self, model_params, masters):
        self.model_params = list(model_params)
        self.masters = list(masters)

    def before_backward(self):
        for p in self.model_params:
            p.grad = None

    def unscale(self, scaler):
        model_new, master_new, model_accumulated, master_accumulated = [], [], [], []
        for p, master in zip(self.model_params, self.masters):
            if p.grad is None:
                continue
            if master.grad is None:
                master.grad = torch.empty_like(master)
                model_new.append(p.grad)
                master_new.append(master.grad)
            else:
                model_accumulated.append(p.grad)
                master_accumulated.append(master.grad)
        scaler.unscale(model_new, master_new)
        scaler.unscale_with_stashed(model_accumulated, master_accumulated, master_accumulated)

    def after_step(self):
        for master in self.masters:
            master.grad = None

    def zero(self, set_to_none=True):
        for p in self.model_params + self.masters:
            p.grad = None


class FlatMasterGrads:
    """`combine_grad=True` under O2/O5: model grads in a low-precision flat buffer, master grads in
    an fp32 one laid out alike, so unscaling model grads into master grads is one launch. With
    combine_ddp the model grad buffers are the ones averaged over ranks (half the bytes)."""

    def __init__(self, model_params, masters, options=None):
        self.model_params = list(model_params)
        self.masters = list(masters)
        options = options or FlatOptions()
        self._model_flat = _FlatLayout(self.model_params, self.model_params, options, reduce=True)
        self._master_flat = _FlatLayout(self.masters, self.model_params, options, reduce=False)
        self._model_buffers_dirty = any(p.grad is not None for p in self.model_params)
        self._masters_hold_grads = False

    @property
    def model_buffers(self):
        return self._model_flat.buffers

    @property
    def master_buffers(self):
        return self._master_flat.buffers

    @property
    def reducer(self):
        return self._model_flat.reducer

    def _attach(self):
        if self._model_flat.attach():
            self._master_flat._build()  # laid out after the model params: rebuilt with them
        else:
            self._master_flat.attach()

    def before_backward(self):
        self._attach()
        if self._model_buffers_dirty:
            for buffer in self.model_buffers:
                buffer.zero_()

    def unscale(self, scaler):
        self._attach()
        if self.reducer is not None:
            self.reducer.finish()
        if self._masters_hold_grads:
            scaler.unscale_with_stashed(self.model_buffers, self.master_buffers, self.master_buffers)
        else:
            scaler.unscale(self.model_buffers, self.master_buffers)
        self._model_buffers_dirty = True
        self._masters_hold_grads = True

    def after_step(self):
        # The next unscale overwrites the master buffer instead of adding to it.
        self._masters_hold_grads = False

    def zero(self, set_to_none=True):
        """Zeroes both buffers; grads stay views (`set_to_none` cannot apply to a shared buffer)."""
        self._attach()
        for buffer in self.model_buffers + self.master_buffers:
            buffer.zero_()
        self._model_buffers_dirty = False
        self._masters_hold_grads = False
