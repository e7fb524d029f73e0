"""Optimizers around a scaled backward: the one-shot step skip after an overflow (both APIs), and
the legacy API's scaled backward and `OptimWrapper` (`handle.wrap_optimizer`)."""
import contextlib
import types

from ._amp_state import master_params, maybe_print
from .grads import ParamGrads
from .scaler import LossScaler


def skip_next_step(optimizer, message, on_skip=None):
    """Make the next `optimizer.step()` a no-op that prints `message` (a string or a callable
    giving one), calls `on_skip(optimizer)` and puts the real step back."""
    owns_step = "step" in vars(optimizer)  # amp optimizers carry a patched step; plain ones do not
    real_step = optimizer.step

    def skip_step(self, closure=None):
        if closure is not None:
            raise RuntimeError("Currently, Amp does not support closure use with optimizers.")
        maybe_print(message() if callable(message) else message)
        if owns_step:
            self.step = real_step
        else:
            del self.step
        if on_skip is not None:
            on_skip(self)

    optimizer.step = types.MethodType(skip_step, optimizer)


@contextlib.contextmanager
def scaled_backward(loss, optimizer, scaler):
    """Yield `loss.float() * scale` for backward; afterwards unscale the new grads of the
    optimizer's params in place (grads accumulated before are kept apart and added back), setting
    `scaler`'s overflow flag on inf/nan. The caller reads it with `scaler.update_scale()`."""
    grads = ParamGrads(master_params(optimizer))
    grads.before_backward()
    yield loss.float() * scaler.loss_scale()
    scaler.clear_overflow_state()
    grads.unscale(scaler)


class OptimWrapper:
    """An optimizer under the legacy handle API, with one dynamic loss scaler per loss:

        optimizer = handle.wrap_optimizer(optimizer, num_loss=2)
        with optimizer.scale_loss(loss0) as scaled: scaled.backward()
        with optimizer.scale_loss(loss1) as scaled: scaled.backward()
        optimizer.step()   # skipped when either backward overflowed

    Everything else (param_groups, state, ...) is the wrapped optimizer's."""

    def __init__(self, optimizer, amp_handle, num_loss):
        self._optimizer = optimizer
        self._amp_handle = amp_handle
        self._num_loss = num_loss
        self._loss_idx = 0
        self._skip_next = [False] * num_loss
        self._loss_scaler = [LossScaler("dynamic") for _ in range(num_loss)]

    @contextlib.contextmanager
    def scale_loss(self, loss):
        if not self._amp_handle.is_active():
            yield loss
            return
        if self._loss_idx >= self._num_loss:
            raise RuntimeError(f"scale_loss was used {self._loss_idx + 1} times before optimizer.step(), but "
                               f"wrap_optimizer was given num_loss={self._num_loss}")
        scaler = self._loss_scaler[self._loss_idx]
        with scaled_backward(loss, self._optimizer, scaler) as scaled_loss:
            yield scaled_loss
        self._skip_next[self._loss_idx] = scaler.update_scale()
        self._loss_idx += 1

    def step(self, closure=None):
        if not self._amp_handle.is_active():
            return self._optimizer.step(closure=closure)
        if closure is not None:
            raise NotImplementedError("The `closure` argument is unsupported by the amp optimizer wrapper.")
        self._loss_idx = 0
        for param in master_params(self._optimizer):
            self._amp_handle.remove_cache(param)  # the step changes it: its casts are stale
        if any(self._skip_next):
            maybe_print("Gradient overflow, skipping update")
            self._skip_next = [False] * self._num_loss
            return None
        with self._amp_handle._disable_casts():  # the update is fp32 math on fp32 params
            return self._optimizer.step()

    def __getattr__(self, name):
        if name == "_optimizer":  # not set yet (unpickling): no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self._optimizer, name)

    def __repr__(self):
        return repr(self._optimizer)
