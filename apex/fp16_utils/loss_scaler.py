"""apex.fp16_utils' loss scalers, for hand-written fp16 loops:

    scaler = DynamicLossScaler()
    scaler.backward(loss)                        # (loss * scale).backward()
    overflow = scaler.has_overflow(params)
    if not overflow:
        for p in params: p.grad.mul_(1. / scaler.loss_scale)
        optimizer.step()
    scaler.update_scale(overflow)

They keep apex.fp16_utils' interface (`loss_scale` is a property, `update_scale` takes the
overflow) over amp's LossScaler, which holds the scale and does the checking and the updates.
"""
import math

import torch

from apex.amp.scaler import LossScaler as _AmpLossScaler

from .fp16util import to_python_float

__all__ = ["LossScaler", "DynamicLossScaler", "to_python_float"]


class LossScaler:
    """A static loss scale: never detects an overflow, never changes.

    Args:
        scale (float, default 1): the loss scale.
    """

    def __init__(self, scale=1):
        self._scaler = _AmpLossScaler(scale)

    @property
    def cur_scale(self):
        return self._scaler._loss_scale

    @cur_scale.setter
    def cur_scale(self, value):
        self._scaler._loss_scale = value

    @property
    def loss_scale(self):
        return self.cur_scale

    def has_overflow(self, params):
        return False

    @staticmethod
    def _has_inf_or_nan(x):
        return False

    def update_scale(self, overflow):
        pass

    def scale_gradient(self, module, grad_in, grad_out):
        """A module backward hook that multiplies the grads it passes on by the scale."""
        return tuple(self.loss_scale * g if g is not None else None for g in grad_in)

    def backward(self, loss, retain_graph=False):
        (loss * self.loss_scale).backward(retain_graph=retain_graph)


class DynamicLossScaler(LossScaler):
    """A loss scale that halves (divides by `scale_factor`, never below 1) when the grads overflow
    and grows by `scale_factor` after `scale_window` iterations without overflow.

    Args:
        init_scale (float, default 2**32): the first scale tried.
        scale_factor (float, default 2.): the factor of each change.
        scale_window (int, default 1000): clean iterations between increases.
    """

    def __init__(self, init_scale=2**32, scale_factor=2., scale_window=1000):
        self._scaler = _AmpLossScaler("dynamic", init_scale=init_scale, scale_factor=scale_factor,
                                      scale_window=scale_window, min_loss_scale=1, max_loss_scale=math.inf)
        self.scale_factor = scale_factor
        self.scale_window = scale_window
        self.cur_iter = 0
        self.last_overflow_iter = -1

    def has_overflow(self, params):
        """Whether any param's grad holds inf/nan: one multi-tensor launch per dtype, one sync."""
        return self._scaler.check_overflow([p.grad for p in params if p.grad is not None])

    @staticmethod
    def _has_inf_or_nan(x):
        return not bool(torch.isfinite(x).all())

    def update_scale(self, overflow):
        self._scaler.adjust(overflow)
        if overflow:
            self.last_overflow_iter = self.cur_iter
        self.cur_iter += 1
