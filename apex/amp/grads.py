"""Where an amp optimizer's grads live, and how they are unscaled after each backward.

Four layouts, one interface (`before_backward`, `unscale`, `after_step`, `zero`):
params updated directly or through fp32 masters (O2/O5), with grads kept per param
(apex's default) or as views into one flat buffer per device/dtype (`combine_grad=True`,
so each unscale is a single kernel over the whole buffer).
"""
import torch

# Views start at multiples of 16 elements: a 16-byte boundary for every dtype, so per-param
# vectorized kernels (fused optimizers) keep their 16-byte loads on grads inside a flat buffer,
# and the same offsets for fp16/bf16 model grads and their fp32 masters, so those buffers line up.
_VIEW_ALIGNMENT_ELEMENTS = 16


def _flat_views(params, group_like):
    """One zeroed buffer per (device, dtype) group of `group_like` (parallel to `params`), and a view
    per param shaped like it. Parallel lists grouped alike give buffers whose elements line up."""
    groups = {}
    for i, p in enumerate(group_like):
        groups.setdefault((p.device, p.dtype), []).append(i)
    buffers, views = [], [None] * len(params)
    for indices in groups.values():
        like = params[indices[0]]
        offsets, size = [], 0
        for i in indices:
            offsets.append(size)
            size += -(-params[i].numel() // _VIEW_ALIGNMENT_ELEMENTS) * _VIEW_ALIGNMENT_ELEMENTS
        buffer = torch.zeros(size, dtype=like.dtype, device=like.device)
        for i, offset in zip(indices, offsets):
            views[i] = buffer[offset:offset + params[i].numel()].view_as(params[i])
        buffers.append(buffer)
    return buffers, views


def _attach_views(params, views):
    """Make each param's .grad its view again (after model.zero_grad() set it to None, or a
    backward with create_graph=True replaced it), keeping the values it had."""
    with torch.no_grad():
        for p, view in zip(params, views):
            if p.grad is view:
                continue
            if p.grad is None:
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


class FlatParamGrads:
    """`combine_grad=True` for params the optimizer updates itself: every .grad is a view into a
    flat buffer that autograd accumulates into in place."""

    def __init__(self, params):
        self.params = list(params)
        self.buffers, self._views = _flat_views(self.params, self.params)
        _attach_views(self.params, self._views)
        self._holds_grads = any(p.grad is not None for p in self.params)
        self._stash = None

    def before_backward(self):
        _attach_views(self.params, self._views)
        if self._holds_grads:  # keep the unscaled grads aside; the buffer takes the scaled ones
            self._stash = [buffer.clone() for buffer in self.buffers]
            for buffer in self.buffers:
                buffer.zero_()

    def unscale(self, scaler):
        _attach_views(self.params, self._views)
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
        _attach_views(self.params, self._views)
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
    an fp32 one laid out alike, so unscaling model grads into master grads is one launch."""

    def __init__(self, model_params, masters):
        self.model_params = list(model_params)
        self.masters = list(masters)
        self.model_buffers, self._model_views = _flat_views(self.model_params, self.model_params)
        self.master_buffers, self._master_views = _flat_views(self.masters, self.model_params)
        _attach_views(self.model_params, self._model_views)
        _attach_views(self.masters, self._master_views)
        self._model_buffers_dirty = any(p.grad is not None for p in self.model_params)
        self._masters_hold_grads = False

    def before_backward(self):
        _attach_views(self.model_params, self._model_views)
        if self._model_buffers_dirty:
            for buffer in self.model_buffers:
                buffer.zero_()

    def unscale(self, scaler):
        _attach_views(self.model_params, self._model_views)
        _attach_views(self.masters, self._master_views)
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
        for buffer in self.model_buffers + self.master_buffers:
            buffer.zero_()
        self._model_buffers_dirty = False
        self._masters_hold_grads = False
