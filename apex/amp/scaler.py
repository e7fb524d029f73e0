"""Dynamic (or static) loss scaling, unscaling grads with the fused multi-tensor kernels.

The one loss-scaling implementation of apex: `amp.initialize`/`amp.scale_loss`, the legacy
`amp.init()` handle and its `wrap_optimizer`, and `apex.fp16_utils` (FP16_Optimizer,
LossScaler, DynamicLossScaler) all scale, unscale, detect overflow and adjust the scale here.
"""
from .multi_tensor import FlagBuffers, launch


class LossScaler:
    """One loss's scale. Dynamic: multiply by `backoff_factor` on inf/nan, by `growth_factor` after
    `scale_window` clean steps, clamped to [min_loss_scale, max_loss_scale]. `scale_factor` (NVIDIA
    apex's argument) sets growth to it and backoff to its inverse."""

    def __init__(self, loss_scale, init_scale=2.**16, growth_factor=2., backoff_factor=0.5,
                 scale_window=2000, min_loss_scale=None, max_loss_scale=2.**24, scale_factor=None):
        if scale_factor is not None:
            growth_factor, backoff_factor = scale_factor, 1. / scale_factor
        self.dynamic = loss_scale == "dynamic"
        self._loss_scale = min(max_loss_scale, init_scale) if self.dynamic else float(loss_scale)
        self._growth_factor = growth_factor
        self._backoff_factor = backoff_factor
        self._scale_window = scale_window
        self._min_loss_scale = min_loss_scale
        self._max_loss_scale = max_loss_scale
        self._unskipped = 0
        self._has_overflow = False
        self._overflow_flags = FlagBuffers()

    def loss_scale(self):
        return self._loss_scale

    @property
    def is_identity(self):
        """A static scale of 1: unscaling grads in place would change nothing."""
        return not self.dynamic and self._loss_scale == 1.0

    def unscale(self, model_grads, master_grads):
        """master_grads[i] = model_grads[i] / scale (in place when the lists are the same): one
        launch per device/dtype group; inf/nan sets the overflow flag read by `update_scale`."""
        if model_grads:
            launch("multi_tensor_scale", self._overflow_flags, [model_grads, master_grads],
                   1. / self._loss_scale)

    def unscale_with_stashed(self, model_grads, stashed_grads, master_grads):
        """master_grads[i] = model_grads[i] / scale + stashed_grads[i]: gradient accumulation
        across backward passes. Only the new grads are checked for inf/nan."""
        if model_grads:
            check_new_grads_only = 0
            launch("multi_tensor_axpby", self._overflow_flags, [model_grads, stashed_grads, master_grads],
                   1. / self._loss_scale, 1.0, check_new_grads_only)

    def check_overflow(self, grads):
        """Whether any of `grads` holds inf/nan, leaving them unchanged (x * 1.0 is exact) and the
        scale alone: one launch per device/dtype group and one host sync."""
        self.clear_overflow_state()
        if grads:
            launch("multi_tensor_scale", self._overflow_flags, [grads, grads], 1.0)
        return self._overflow_flags.any_set()

    def clear_overflow_state(self):
        self._has_overflow = False
        self._overflow_flags.clear()

    def update_scale(self):
        """Read the overflow flags (the step's one host sync) and adjust the scale.
        Returns True when the optimizer step must be skipped."""
        if self.dynamic and not self._has_overflow:
            self._has_overflow = self._overflow_flags.any_set()
        return self.adjust(self._has_overflow)

    def adjust(self, overflow):
        """Adjust the scale after a step that did (or did not) overflow; returns whether the step
        must be skipped (only a dynamic scale skips)."""
        should_skip = self.dynamic and overflow
        if should_skip:
            self._loss_scale *= self._backoff_factor
            if self._min_loss_scale:
                self._loss_scale = max(self._min_loss_scale, self._loss_scale)
            self._unskipped = 0
        else:
            self._unskipped += 1
        if self.dynamic and self._unskipped == self._scale_window:
            self._loss_scale = min(self._max_loss_scale, self._loss_scale * self._growth_factor)
            self._unskipped = 0
        return should_skip

    def state_dict(self):
        return {"loss_scale": self._loss_scale, "unskipped": self._unskipped}

    def load_state_dict(self, state):
        self._loss_scale = state["loss_scale"]
        self._unskipped = state["unskipped"]
